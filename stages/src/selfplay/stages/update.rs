//! `update`: the RL update that ends a step of the loop. The proposer learns by REINFORCE from
//! the reward stage's proposer rewards (optionally against a running-mean baseline), then the
//! solver by GRPO from its rollouts' rewards, normalised within each question's group, as in
//! SSP: two updates of the one shared policy, proposer first. Both minimise the clipped
//! objective of [`crate::train::objective`] with a KL penalty to the initial policy.
//!
//! Old log-probabilities are the trainer's, recomputed on the weights the role's update starts
//! from (as verl does), never the serving backend's: its precision then cannot bias the ratio.
//! With one epoch of one mini-batch the update's own forward pass is that recomputation (the
//! ratio is exactly 1 there), so it costs no extra pass. The gap to the serving backend's
//! log-probabilities is recorded in `updates`.

use std::sync::Arc;
use std::time::Instant;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, Stage, StageContext, StageError, TableSpec, Tables};

use super::propose::Propose;
use super::reward::Reward;
use super::solve::Solve;
use super::{elapsed_ms, failed, metrics_batch, metrics_table};
use crate::columns::{Columns, Reader, schema_of};
use crate::selfplay::SelfPlay;
use crate::selfplay::training::{TrainState, Training, checkpoints_table, policy_versions_table, publish_version};
use crate::train::{ClippedObjective, OptimizerConfig, TrainSequence, baseline_advantages, group_advantages, logprobs};

/// The proposer's running-mean reward baseline.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunningMean {
    /// Weight of the old mean at each update: `b ← decay·b + (1 − decay)·mean(rewards)`; the
    /// first batch's mean starts it.
    pub decay: f64,
}

/// The config of `update`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateConfig {
    /// Roles to train: `proposer` (REINFORCE), `solver` (GRPO); both by default, the proposer
    /// first whatever the order here.
    #[serde(default = "both_roles")]
    pub roles: Vec<String>,
    /// AdamW and the learning-rate schedule (the schedule spans the run's update steps).
    pub optimizer: OptimizerConfig,
    /// The clipped objective and its KL penalty.
    #[serde(default)]
    pub loss: ClippedObjective,
    /// Passes over each role's batch.
    #[serde(default = "one")]
    pub ppo_epochs: usize,
    /// Sequences per optimizer step (SSP: 640, so its 1,280 solver rollouts take two steps and
    /// its 256 proposals one); the whole batch by default.
    #[serde(default)]
    pub mini_batch: Option<usize>,
    /// A running-mean baseline for the proposer's REINFORCE (SSP: none).
    #[serde(default)]
    pub proposer_baseline: Option<RunningMean>,
    /// Leaves out solver groups whose rewards are all equal (SSP keeps them: their only
    /// gradient is the KL term). Saves their forward and backward passes on a CPU.
    #[serde(default)]
    pub skip_groups_without_signal: bool,
    /// Checkpoints kept: the latest and those of steps that are multiples of this; every one
    /// by default.
    #[serde(default)]
    pub keep_every: Option<u64>,
}

fn both_roles() -> Vec<String> {
    vec!["proposer".into(), "solver".into()]
}

fn one() -> usize {
    1
}

/// The RL update.
pub struct Update {
    config: UpdateConfig,
}

/// One role's batch: its sequences with their advantages and what the serving backend
/// recorded.
struct RoleBatch {
    role: &'static str,
    sequences: Vec<TrainSequence>,
    advantages: Vec<f64>,
    /// Serving log-probabilities at each sequence's scored positions (empty when inexact).
    serving: Vec<Vec<f32>>,
    rewards: Vec<f64>,
    groups: usize,
    groups_without_signal: usize,
}

/// A row of `updates`: one optimizer step of one role (or a role with nothing to learn).
#[derive(Debug, Default)]
struct UpdateRow {
    role: &'static str,
    epoch: u64,
    mini_batch: u64,
    optimizer_step: u64,
    sequences: u64,
    tokens: u64,
    trained_tokens: u64,
    loss: f64,
    pg_loss: f64,
    kl: f64,
    clip_fraction: f64,
    entropy: f64,
    grad_norm: f64,
    lr: f64,
    groups: u64,
    groups_without_signal: u64,
    mean_reward: f64,
    logprob_gap: f64,
    logprob_gap_max: f64,
    wall_ms: f64,
}

fn updates_batch(rows: &[UpdateRow]) -> Result<RecordBatch, ArrowError> {
    Columns::default()
        .str("role", rows.iter().map(|r| r.role))
        .u64("epoch", rows.iter().map(|r| r.epoch))
        .u64("mini_batch", rows.iter().map(|r| r.mini_batch))
        .u64("optimizer_step", rows.iter().map(|r| r.optimizer_step))
        .u64("sequences", rows.iter().map(|r| r.sequences))
        .u64("tokens", rows.iter().map(|r| r.tokens))
        .u64("trained_tokens", rows.iter().map(|r| r.trained_tokens))
        .f64("loss", rows.iter().map(|r| r.loss))
        .f64("pg_loss", rows.iter().map(|r| r.pg_loss))
        .f64("kl", rows.iter().map(|r| r.kl))
        .f64("clip_fraction", rows.iter().map(|r| r.clip_fraction))
        .f64("entropy", rows.iter().map(|r| r.entropy))
        .f64("grad_norm", rows.iter().map(|r| r.grad_norm))
        .f64("lr", rows.iter().map(|r| r.lr))
        .u64("groups", rows.iter().map(|r| r.groups))
        .u64("groups_without_signal", rows.iter().map(|r| r.groups_without_signal))
        .f64("mean_reward", rows.iter().map(|r| r.mean_reward))
        .f64("logprob_gap", rows.iter().map(|r| r.logprob_gap))
        .f64("logprob_gap_max", rows.iter().map(|r| r.logprob_gap_max))
        .f64("wall_ms", rows.iter().map(|r| r.wall_ms))
        .finish()
}

/// The `updates` table's spec.
pub fn updates_table() -> TableSpec {
    TableSpec::new("updates", schema_of(|| updates_batch(&[])))
}

/// A trajectory table's rows as training sequences (prompt masked out), with the serving
/// log-probabilities at their scored positions; `None` for a row without token ids.
fn sequences_of(table: &str, batch: &RecordBatch) -> Result<Vec<Option<(TrainSequence, Vec<f32>)>>, StageError> {
    let reader = Reader::new(table, batch);
    let (prompts, responses) = (reader.u32s("prompt_ids")?, reader.u32s("token_ids")?);
    let (masks, serving, exact) = (reader.u32s("loss_mask")?, reader.f32s("logprobs")?, reader.bool("tokens_exact")?);
    Ok((0..reader.rows())
        .map(|i| {
            if prompts[i].is_empty() || responses[i].is_empty() {
                return None;
            }
            let mut tokens = prompts[i].clone();
            tokens.extend(&responses[i]);
            let mut mask = vec![0u8; prompts[i].len()];
            mask.extend(masks[i].iter().map(|&m| u8::from(m != 0)));
            let sequence = TrainSequence { tokens, mask };
            let recorded = if exact[i] {
                sequence
                    .positions()
                    .iter()
                    .map(|&p| serving[i].get(p - prompts[i].len()).copied().unwrap_or(0.0))
                    .collect()
            } else {
                Vec::new()
            };
            Some((sequence, recorded))
        })
        .collect())
}

impl Update {
    fn trains(&self, role: &str) -> bool {
        self.config.roles.iter().any(|r| r == role)
    }

    /// The solver's batch: every rollout with token ids, its GRPO advantage over its question's
    /// group.
    fn solver_batch(&self, inputs: &Tables) -> Result<RoleBatch, StageError> {
        let rollouts = inputs.get("rollouts")?;
        let items = Reader::new("rollouts", rollouts).u64("item")?;
        let sequences = sequences_of("rollouts", rollouts)?;
        let rewards = inputs.get("rewards")?;
        let reader = Reader::new("rewards", rewards);
        let (roles, values) = (reader.str("role")?, reader.f64("reward")?);
        // `rewards` lists the solver's rows first, in rollout order.
        let solver_rewards: Vec<f64> =
            roles.iter().zip(&values).filter(|(r, _)| **r == "solver").map(|(_, v)| *v).collect();
        if solver_rewards.len() != items.len() {
            return Err(failed(
                "update",
                format!("{} solver rewards for {} rollouts", solver_rewards.len(), items.len()),
            ));
        }
        let (advantages, groups, without_signal) = group_advantages(&solver_rewards, &items);
        let silent: std::collections::BTreeSet<u64> = if self.config.skip_groups_without_signal {
            let mut by_item: std::collections::BTreeMap<u64, Vec<f64>> = std::collections::BTreeMap::new();
            for (&item, &reward) in items.iter().zip(&solver_rewards) {
                by_item.entry(item).or_default().push(reward);
            }
            by_item.into_iter().filter(|(_, r)| r.len() > 1 && r.iter().all(|&x| x == r[0])).map(|(i, _)| i).collect()
        } else {
            Default::default()
        };
        let mut batch = RoleBatch {
            role: "solver",
            sequences: Vec::new(),
            advantages: Vec::new(),
            serving: Vec::new(),
            rewards: solver_rewards.clone(),
            groups,
            groups_without_signal: without_signal,
        };
        for (i, row) in sequences.into_iter().enumerate() {
            if let Some((sequence, serving)) = row.filter(|_| !silent.contains(&items[i])) {
                batch.sequences.push(sequence);
                batch.advantages.push(advantages[i]);
                batch.serving.push(serving);
            }
        }
        Ok(batch)
    }

    /// The proposer's batch: every proposal with token ids, its reward minus the baseline.
    fn proposer_batch(&self, inputs: &Tables, baseline: &mut Option<f64>) -> Result<RoleBatch, StageError> {
        let proposals = inputs.get("proposals")?;
        let items = Reader::new("proposals", proposals).u64("item")?;
        let sequences = sequences_of("proposals", proposals)?;
        let rewards = inputs.get("rewards")?;
        let reader = Reader::new("rewards", rewards);
        let (roles, reward_items, values) = (reader.str("role")?, reader.u64("item")?, reader.f64("reward")?);
        let by_item: std::collections::BTreeMap<u64, f64> =
            (0..reader.rows()).filter(|&i| roles[i] == "proposer").map(|i| (reward_items[i], values[i])).collect();
        let rewards: Vec<f64> = items
            .iter()
            .map(|item| {
                by_item
                    .get(item)
                    .copied()
                    .ok_or_else(|| failed("update", format!("proposal {item} has no proposer reward")))
            })
            .collect::<Result<_, _>>()?;
        let mean = rewards.iter().sum::<f64>() / rewards.len().max(1) as f64;
        let advantages = match self.config.proposer_baseline {
            None => baseline_advantages(&rewards, 0.0),
            Some(RunningMean { decay }) => {
                let current = baseline.unwrap_or(mean);
                *baseline = Some(decay * current + (1.0 - decay) * mean);
                baseline_advantages(&rewards, current)
            }
        };
        let mut batch = RoleBatch {
            role: "proposer",
            sequences: Vec::new(),
            advantages: Vec::new(),
            serving: Vec::new(),
            rewards: rewards.clone(),
            groups: items.len(),
            groups_without_signal: 0,
        };
        for (i, row) in sequences.into_iter().enumerate() {
            if let Some((sequence, serving)) = row {
                batch.sequences.push(sequence);
                batch.advantages.push(advantages[i]);
                batch.serving.push(serving);
            }
        }
        Ok(batch)
    }
}

/// Mean and largest absolute difference between two log-probability lists, over the pairs.
fn gap(trainer: &[f32], serving: &[f32], sum: &mut f64, max: &mut f64, count: &mut usize) {
    for (a, b) in trainer.iter().zip(serving) {
        let d = f64::from((a - b).abs());
        *sum += d;
        *max = max.max(d);
        *count += 1;
    }
}

/// Splits `0..n` into contiguous mini-batches of at most `size` (near-equal lengths).
fn split(n: usize, size: Option<usize>) -> Vec<std::ops::Range<usize>> {
    let parts = n.div_ceil(size.unwrap_or(n).max(1)).max(1);
    (0..parts).map(|p| p * n / parts..(p + 1) * n / parts).filter(|r| !r.is_empty()).collect()
}

/// Settings an update of one role runs with.
struct Plan<'a> {
    config: &'a UpdateConfig,
    temperature: f32,
    /// The learning-rate schedule's length in optimizer steps (its position is the
    /// optimizer's step count, which only this stage advances).
    total_lr_steps: u64,
}

/// Trains `state` on one role's batch; returns the rows of `updates`.
fn update_role(state: &mut TrainState, batch: &RoleBatch, plan: &Plan<'_>) -> Result<Vec<UpdateRow>, String> {
    let config = plan.config;
    let mean_reward = batch.rewards.iter().sum::<f64>() / batch.rewards.len().max(1) as f64;
    let summary = UpdateRow {
        role: batch.role,
        groups: batch.groups as u64,
        groups_without_signal: batch.groups_without_signal as u64,
        mean_reward,
        ..UpdateRow::default()
    };
    if batch.advantages.iter().all(|&a| a == 0.0) {
        // Nothing to learn: the only gradient would be the KL pull, and AdamW's decay would
        // still move the weights.
        return Ok(vec![UpdateRow { sequences: batch.sequences.len() as u64, ..summary }]);
    }
    let sequences = &batch.sequences;
    let budget = state.trainer.micro_batch_tokens;
    let reference = if config.loss.kl_coef > 0.0 {
        Some(
            match &state.reference {
                Some(model) => logprobs(model, sequences, plan.temperature, budget),
                None => {
                    // LoRA: the base weights are the reference.
                    let adapters = state.trainer.model.adapters.take();
                    let out = state.trainer.logprobs(sequences, plan.temperature);
                    state.trainer.model.adapters = adapters;
                    out
                }
            }
            .map_err(|e| e.to_string())?,
        )
    } else {
        None
    };
    let mini_batches = split(sequences.len(), config.mini_batch);
    let fused = config.ppo_epochs == 1 && mini_batches.len() == 1;
    let old = if fused {
        None
    } else {
        Some(state.trainer.logprobs(sequences, plan.temperature).map_err(|e| e.to_string())?)
    };
    let (mut gap_sum, mut gap_max, mut gap_count) = (0.0, 0.0f64, 0usize);
    if let Some(old) = &old {
        for (o, s) in old.iter().zip(&batch.serving) {
            gap(o, s, &mut gap_sum, &mut gap_max, &mut gap_count);
        }
    }
    let mut rows = Vec::new();
    for epoch in 0..config.ppo_epochs {
        for (m, range) in mini_batches.iter().cloned().enumerate() {
            let clock = Instant::now();
            let chunk = &sequences[range.clone()];
            let scored: usize = chunk.iter().map(|s| s.positions().len()).sum();
            let weight = 1.0 / scored.max(1) as f64;
            let (mut pg, mut kl, mut clipped, mut entropy) = (0.0, 0.0, 0usize, 0.0);
            let lr = config.optimizer.lr_at(state.trainer.adam.step + 1, plan.total_lr_steps);
            let report = state
                .trainer
                .step(chunk, plan.temperature, &config.optimizer, lr, &mut |k, current| {
                    let i = range.start + k;
                    let old = old.as_ref().map_or(current, |o| o[i].as_slice());
                    if fused {
                        gap(current, &batch.serving[i], &mut gap_sum, &mut gap_max, &mut gap_count);
                    }
                    let mut value = 0.0;
                    let derivative = (0..current.len())
                        .map(|t| {
                            let r = reference.as_ref().map(|r| r[i][t]);
                            let terms = config.loss.token(current[t], old[t], r, batch.advantages[i]);
                            value += terms.loss * weight;
                            pg += terms.policy * weight;
                            kl += terms.kl * weight;
                            clipped += usize::from(terms.clipped);
                            entropy -= f64::from(current[t]) * weight;
                            (terms.derivative * weight) as f32
                        })
                        .collect();
                    (value, derivative)
                })
                .map_err(|e| e.to_string())?;
            state.tokens_trained += report.micro_batches.iter().map(|m| m.tokens as u64).sum::<u64>();
            rows.push(UpdateRow {
                epoch: epoch as u64,
                mini_batch: m as u64,
                optimizer_step: report.optimizer_step,
                sequences: chunk.len() as u64,
                tokens: report.micro_batches.iter().map(|m| m.tokens as u64).sum(),
                trained_tokens: scored as u64,
                loss: report.micro_batches.iter().map(|m| m.loss).sum(),
                pg_loss: pg,
                kl,
                clip_fraction: clipped as f64 * weight,
                entropy,
                grad_norm: report.grad_norm,
                lr,
                wall_ms: elapsed_ms(clock),
                ..summary
            });
        }
    }
    let (gap_mean, gap_max) = (gap_sum / gap_count.max(1) as f64, gap_max);
    for row in &mut rows {
        (row.logprob_gap, row.logprob_gap_max) = (gap_mean, gap_max);
    }
    Ok(rows)
}

impl Stage for Update {
    const KIND: &'static str = "update";
    const ABOUT: &'static str = "RL update of the policy: REINFORCE for the proposer, then GRPO for the solver";
    type Config = UpdateConfig;

    fn new(config: UpdateConfig) -> Result<Self, Vec<ConfigProblem>> {
        let mut problems: Vec<ConfigProblem> = config
            .optimizer
            .problems()
            .into_iter()
            .map(|(key, message)| ConfigProblem::new(format!("optimizer.{key}"), message))
            .chain(
                config
                    .loss
                    .problems()
                    .into_iter()
                    .map(|(key, message)| ConfigProblem::new(format!("loss.{key}"), message)),
            )
            .collect();
        if config.roles.is_empty() {
            problems.push(ConfigProblem::new("roles", "name `proposer`, `solver` or both"));
        }
        for role in &config.roles {
            if role != "solver" && role != "proposer" {
                problems.push(ConfigProblem::new("roles", format!("`{role}` is neither `solver` nor `proposer`")));
            }
        }
        if config.ppo_epochs == 0 {
            problems.push(ConfigProblem::new("ppo_epochs", "must be at least 1"));
        }
        if config.mini_batch == Some(0) {
            problems.push(ConfigProblem::new("mini_batch", "must be at least 1"));
        }
        if let Some(RunningMean { decay }) = config.proposer_baseline
            && !(0.0..1.0).contains(&decay)
        {
            problems.push(ConfigProblem::new("proposer_baseline.decay", format!("must be in [0, 1), got {decay}")));
        }
        if config.keep_every == Some(0) {
            problems.push(ConfigProblem::new("keep_every", "must be at least 1"));
        }
        if problems.is_empty() { Ok(Update { config }) } else { Err(problems) }
    }

    fn inputs(&self) -> Vec<TableSpec> {
        let mut inputs = vec![Reward::rewards_table()];
        if self.trains("solver") {
            inputs.push(Solve::rollouts_table());
        }
        if self.trains("proposer") {
            inputs.push(Propose::proposals_table());
        }
        inputs
    }

    fn outputs(&self) -> Vec<TableSpec> {
        let checkpoints = match self.config.keep_every {
            Some(every) => checkpoints_table().keep_last_and_every(every),
            None => checkpoints_table(),
        };
        vec![updates_table(), policy_versions_table(), checkpoints, metrics_table()]
    }

    async fn run(&self, cx: &StageContext, inputs: Tables) -> Result<Tables, StageError> {
        let clock = Instant::now();
        let selfplay: Arc<SelfPlay> = cx.resource::<SelfPlay>()?;
        let training = cx.resource::<Training>().map_err(|_| {
            failed(
                "update",
                "`update` trains in process: the spec's `model:` must use `backend: candle` (mistral.rs and \
                 OpenAI-compatible servers cannot take trained weights in process)",
            )
        })?;
        let temperature = selfplay.agent.sampling.temperature;
        if temperature <= 0.0 {
            return Err(failed(
                "update",
                "`agent.sampling.temperature` is 0: RL needs sampled rollouts and their log-probabilities",
            ));
        }
        let mut state = training.take().await?;
        state.optimizer_for(cx.stage_name());
        if self.config.loss.kl_coef > 0.0 && state.reference.is_none() && state.trainer.model.adapters.is_none() {
            state.reference = Some(training.reference_model().await?);
        }
        let mut batches = Vec::new();
        if self.trains("proposer") {
            batches.push(self.proposer_batch(&inputs, &mut state.proposer_baseline)?);
        }
        if self.trains("solver") {
            batches.push(self.solver_batch(&inputs)?);
        }
        if batches.iter().all(|b| b.sequences.is_empty()) {
            training.put(state).await;
            return Err(failed(
                "update",
                "no trajectory has token ids: the policy backend records none (in-process training needs `candle`)",
            ));
        }
        // The schedule's length, if every step's batches were this step's.
        let per_step: usize = batches
            .iter()
            .map(|b| split(b.sequences.len(), self.config.mini_batch).len() * self.config.ppo_epochs)
            .sum();
        let total_lr_steps = cx.steps() * per_step as u64;
        let config = self.config.clone();
        let parent = state.version;
        let worker = tokio::task::spawn_blocking(move || {
            let plan = Plan { config: &config, temperature, total_lr_steps };
            let mut rows = Vec::new();
            for batch in &batches {
                match update_role(&mut state, batch, &plan) {
                    Ok(more) => rows.extend(more),
                    Err(e) => return (state, Err(format!("{} update: {e}", batch.role))),
                }
            }
            (state, Ok(rows))
        });
        let (state, rows) = worker.await.map_err(|e| failed("the training thread", e))?;
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => {
                training.put(state).await;
                return Err(failed("update", e));
            }
        };
        let train_ms = elapsed_ms(clock);
        let (state, published) = publish_version(cx, &selfplay, &training, state, parent).await?;
        let mut metrics: Vec<(String, f64)> = Vec::new();
        for role in ["proposer", "solver"] {
            let trained: Vec<&UpdateRow> = rows.iter().filter(|r| r.role == role && r.optimizer_step > 0).collect();
            let Some(first) = rows.iter().find(|r| r.role == role) else { continue };
            let n = trained.len().max(1) as f64;
            metrics.push((format!("{role}_optimizer_steps"), trained.len() as f64));
            metrics.push((format!("{role}_loss"), trained.iter().map(|r| r.loss).sum::<f64>() / n));
            metrics.push((format!("{role}_kl"), trained.iter().map(|r| r.kl).sum::<f64>() / n));
            metrics.push((format!("{role}_clip_fraction"), trained.iter().map(|r| r.clip_fraction).sum::<f64>() / n));
            metrics.push((format!("{role}_entropy"), trained.iter().map(|r| r.entropy).sum::<f64>() / n));
            metrics.push((format!("{role}_logprob_gap"), first.logprob_gap));
            metrics.push((format!("{role}_groups_without_signal"), first.groups_without_signal as f64));
        }
        let tokens: u64 = rows.iter().map(|r| r.tokens).sum();
        metrics.push(("tokens".into(), tokens as f64));
        metrics.push(("tokens_per_s".into(), tokens as f64 / (train_ms / 1e3).max(1e-9)));
        metrics.push(("train_ms".into(), train_ms));
        metrics.push(("serve_ms".into(), published.serve_ms));
        metrics.push(("policy_version".into(), state.version as f64));
        metrics.push(("wall_ms".into(), elapsed_ms(clock)));
        training.put(state).await;
        let metrics: Vec<(&str, f64)> = metrics.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        Ok(Tables::new()
            .with("updates", updates_batch(&rows)?)
            .with("policy_versions", published.policy_versions)
            .with("checkpoints", published.checkpoints)
            .with("step_metrics", metrics_batch(cx.stage_name(), &metrics)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::{TrainModel, Trainer};
    use crate::weights::testing::{random, tiny_shape};

    fn state() -> TrainState {
        let weights = random(tiny_shape(), true, 5);
        TrainState {
            trainer: Trainer::new(TrainModel::new(weights.clone()), 64),
            version: 0,
            tokens_trained: 0,
            optimizer_stage: String::new(),
            proposer_baseline: None,
            reference: Some(TrainModel::new(weights)),
        }
    }

    /// Four sequences of the tiny vocabulary, a prompt of three tokens, with `advantages`.
    fn batch(advantages: &[f64]) -> RoleBatch {
        let sequences: Vec<TrainSequence> = (0..advantages.len() as u32)
            .map(|s| TrainSequence {
                tokens: (0..10).map(|t| (s * 7 + t * 3) % 16).collect(),
                mask: [0, 0, 0, 1, 1, 1, 1, 1, 1, 1].to_vec(),
            })
            .collect();
        let serving = sequences.iter().map(|s| vec![0.0; s.positions().len()]).collect();
        RoleBatch {
            role: "solver",
            sequences,
            advantages: advantages.to_vec(),
            serving,
            rewards: vec![0.0; advantages.len()],
            groups: 1,
            groups_without_signal: 0,
        }
    }

    fn config(ppo_epochs: usize, mini_batch: Option<usize>) -> UpdateConfig {
        UpdateConfig {
            roles: both_roles(),
            optimizer: OptimizerConfig::adamw(1e-2),
            loss: ClippedObjective::default(),
            ppo_epochs,
            mini_batch,
            proposer_baseline: None,
            skip_groups_without_signal: false,
            keep_every: None,
        }
    }

    fn totals(state: &TrainState, batch: &RoleBatch) -> Vec<f32> {
        state.trainer.logprobs(&batch.sequences, 1.0).unwrap().iter().map(|l| l.iter().sum()).collect()
    }

    #[test]
    fn repeated_grpo_updates_raise_positive_advantage_sequences_and_lower_negative_ones() {
        let mut state = state();
        let batch = batch(&[1.0, -1.0, 1.0, -1.0]);
        let config = config(1, None);
        let plan = Plan { config: &config, temperature: 1.0, total_lr_steps: 10 };
        let before = totals(&state, &batch);
        for round in 0..5 {
            let rows = update_role(&mut state, &batch, &plan).unwrap();
            assert_eq!(rows.len(), 1);
            if round == 0 {
                // The policy is still the reference and the old policy: KL 0, ratio 1.
                assert_eq!(rows[0].kl, 0.0);
                assert_eq!(rows[0].clip_fraction, 0.0);
                assert!((rows[0].pg_loss).abs() < 1e-9, "advantages cancel: {}", rows[0].pg_loss);
            }
        }
        let after = totals(&state, &batch);
        for (i, (b, a)) in before.iter().zip(&after).enumerate() {
            if batch.advantages[i] > 0.0 {
                assert!(a > b, "sequence {i}: {b} → {a}");
            } else {
                assert!(a < b, "sequence {i}: {b} → {a}");
            }
        }
        let last = update_role(&mut state, &batch, &plan).unwrap();
        assert!(last[0].kl > 0.0, "the policy moved away from its reference");
    }

    #[test]
    fn epochs_and_mini_batches_take_an_optimizer_step_each_against_the_old_policy() {
        let mut state = state();
        let batch = batch(&[2.0, -2.0, 2.0, -2.0]);
        let config = config(2, Some(2));
        let plan = Plan { config: &config, temperature: 1.0, total_lr_steps: 10 };
        let rows = update_role(&mut state, &batch, &plan).unwrap();
        let steps: Vec<(u64, u64, u64)> = rows.iter().map(|r| (r.epoch, r.mini_batch, r.optimizer_step)).collect();
        assert_eq!(steps, [(0, 0, 1), (0, 1, 2), (1, 0, 3), (1, 1, 4)]);
        assert!(rows.iter().all(|r| r.sequences == 2));
        // The second epoch's ratios are to the policy before the update: no longer 1.
        assert!(rows[2].pg_loss != rows[0].pg_loss);
    }

    #[test]
    fn reinforce_with_equal_rewards_and_their_baseline_changes_nothing() {
        let mut state = state();
        let rewards = [0.5, 0.5, 0.5, 0.5];
        let mut batch = batch(&baseline_advantages(&rewards, 0.5));
        batch.role = "proposer";
        let before = state.trainer.model.weights.clone();
        let config = config(1, None);
        let plan = Plan { config: &config, temperature: 1.0, total_lr_steps: 10 };
        let rows = update_role(&mut state, &batch, &plan).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].optimizer_step, 0, "no optimizer step");
        assert_eq!(state.trainer.model.weights, before);
        assert_eq!(state.trainer.adam.step, 0);
    }
}
