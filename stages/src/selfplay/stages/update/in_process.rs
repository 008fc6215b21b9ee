//! The in-process update: the run's own trainer minimises the clipped objective over a
//! role's batch, mini-batch by mini-batch, epoch by epoch.

use std::time::Instant;

use std::sync::Arc;

use sesa_engine::{Stage, StageContext, StageError, Tables};

use super::batch::{RoleBatch, Sample, lack_token_ids};
use super::{Outcome, Update, UpdateConfig, UpdateRow};
use crate::agent::Role;
use crate::selfplay::SelfPlay;
use crate::selfplay::stages::{elapsed_ms, failed};
use crate::selfplay::training::{Published, TrainState, by_training, publish_version};
use sesa_models::policy::Policy;
use sesa_models::train::{TrainSequence, WithReference, logprobs, logprobs_with_reference};

/// Mean and largest absolute difference between two log-probability lists, over the pairs.
fn gap(trainer: &[f32], serving: &[f32], sum: &mut f64, max: &mut f64, count: &mut usize) {
    for (a, b) in trainer.iter().zip(serving) {
        let d = f64::from((a - b).abs());
        *sum += d;
        *max = max.max(d);
        *count += 1;
    }
}

/// Splits `0..n` into contiguous mini-batches of near-equal lengths: as many as `trajectories`
/// of them (replayed demonstrations, spread among them, not counted) take at `size` each.
fn split(n: usize, trajectories: usize, size: Option<usize>) -> Vec<std::ops::Range<usize>> {
    let parts = trajectories.div_ceil(size.unwrap_or(trajectories).max(1)).max(1);
    (0..parts).map(|p| p * n / parts..(p + 1) * n / parts).filter(|r| !r.is_empty()).collect()
}

/// How many of `samples` are the step's own trajectories, not replayed demonstrations.
fn trajectories<'a>(samples: impl IntoIterator<Item = &'a Sample>) -> usize {
    samples.into_iter().filter(|s| !s.replayed).count()
}

/// Optimizer steps an update of `batches` takes: the learning-rate schedule's length per step.
pub(super) fn optimizer_steps(batches: &[RoleBatch], config: &UpdateConfig) -> u64 {
    let steps = |b: &RoleBatch| split(b.samples.len(), trajectories(&b.samples), config.mini_batch).len();
    batches.iter().map(|b| (steps(b) * config.ppo_epochs) as u64).sum()
}

/// Where an update's time went, in milliseconds: the step metrics that say which part to cut.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Timings {
    /// The KL reference's forward passes.
    pub reference_ms: f64,
    /// Recomputing the old policy's log-probabilities (several epochs or mini-batches only).
    pub old_logprobs_ms: f64,
    /// The training forward and backward passes.
    pub forward_backward_ms: f64,
    /// Gradient clipping and AdamW.
    pub optimizer_ms: f64,
    /// Reading or computing the served model's block inputs (`served_block_inputs`).
    pub block_inputs_ms: f64,
}

/// Settings an update of one role runs with.
pub(super) struct Plan<'a> {
    pub config: &'a UpdateConfig,
    pub temperature: f32,
    /// The learning-rate schedule's length in optimizer steps (its position is the
    /// optimizer's step count, which only this stage advances).
    pub total_lr_steps: u64,
    /// The policy serving the trained model, to read block inputs from
    /// (`served_block_inputs`).
    pub serving: Option<&'a Arc<dyn Policy>>,
}

/// Token `t`'s advantage, from its rollout's `advantage` (less any misstep penalty). For a
/// guided rollout (`guided`: its sampling log-probabilities, `None` where a token was written):
/// a sampled token's is weighted by its truncated importance weight, min(1, exp(trained −
/// sampled)); a written one's by `written_weight`, plus `written_sft` whatever the reward.
/// Any other token's is the rollout's.
fn token_advantage(
    advantage: f64,
    trained: f32,
    guided: Option<&[Option<f32>]>,
    t: usize,
    config: &UpdateConfig,
) -> f64 {
    match guided.map(|g| g.get(t).copied().flatten()) {
        Some(Some(sampled)) => advantage * f64::from(trained - sampled).exp().min(1.0),
        Some(None) => advantage * config.written_weight + config.written_sft,
        None => advantage,
    }
}

/// Gives `sequences` the served model's residual stream entering the trainer's lowest trained
/// block, when the plan reads it and blocks below that one are frozen. A guided rollout's
/// trained prompt lacks the hint it was sampled under: the policy computes its inputs anew,
/// as it does for anything it no longer keeps.
fn served_block_inputs(state: &TrainState, plan: &Plan<'_>, sequences: &mut [TrainSequence]) -> Result<(), String> {
    let model = &state.trainer.model;
    let top = model.shape().layers.saturating_sub(model.first_trained_layer());
    let Some(policy) = plan.serving else { return Ok(()) };
    let read: Vec<Vec<u32>> = sequences.iter().map(|q| q.read().to_vec()).collect();
    let Some(inputs) = policy.block_inputs(&read, top).map_err(|e| format!("the served block inputs: {e}"))? else {
        return Ok(());
    };
    for (sequence, inputs) in sequences.iter_mut().zip(inputs) {
        sequence.block_inputs = Some(inputs.into());
    }
    Ok(())
}

/// Trains `state` on one role's batch; returns the rows of `updates`.
pub(super) fn update_role(
    state: &mut TrainState,
    batch: &RoleBatch,
    plan: &Plan<'_>,
    timings: &mut Timings,
) -> Result<Vec<UpdateRow>, String> {
    let config = plan.config;
    let mean_reward = crate::selfplay::stages::mean(batch.rewards.iter().copied());
    let summary = UpdateRow {
        role: batch.role,
        groups: batch.groups as u64,
        groups_without_signal: batch.groups_without_signal as u64,
        mean_reward,
        ..UpdateRow::default()
    };
    // Trajectories without token ids (an inexact backend) cannot be trained in process.
    let (samples, mut sequences): (Vec<_>, Vec<TrainSequence>) =
        batch.samples.iter().filter_map(|s| s.sequence().map(|q| (s, q))).unzip();
    if samples.iter().all(|s| s.advantage == 0.0 && !s.has_own_credit(config.credits_written())) {
        // Nothing to learn: the only gradient would be the KL pull, and AdamW's decay would
        // still move the weights.
        return Ok(vec![UpdateRow { sequences: samples.len() as u64, ..summary }]);
    }
    let clock = Instant::now();
    served_block_inputs(state, plan, &mut sequences)?;
    timings.block_inputs_ms += elapsed_ms(clock);
    let serving: Vec<Vec<f32>> = samples.iter().zip(&sequences).map(|(s, q)| s.serving_at(q)).collect();
    // A guided rollout was sampled under a hint its trained prompt lacks: each token's advantage
    // is weighted by min(1, π(token | prompt) / μ(token | prompt + hint)), the truncated
    // importance weight of the policy trained against the one that sampled it.
    // A plan's written tokens have no sampling probability: they are trained as written, at
    // `written_weight`.
    let guided: Vec<Option<Vec<Option<f32>>>> = samples.iter().zip(&sequences).map(|(s, q)| s.guided_at(q)).collect();
    let misstep: Vec<Option<Vec<bool>>> = samples.iter().zip(&sequences).map(|(s, q)| s.misstep_at(q)).collect();
    let sequences = &sequences;
    let budget = state.trainer.micro_batch_tokens;
    let mini_batches = split(sequences.len(), trajectories(samples.iter().copied()), config.mini_batch);
    let fused = config.ppo_epochs == 1 && mini_batches.len() == 1;
    let with_kl = config.loss.kl_coef > 0.0;
    // The reference policy: a model of its own (full fine-tuning), or the base weights under
    // the adapters (LoRA), whose log-probabilities come from the same forward passes as the
    // policy's, sharing the blocks below the lowest adapter: in the training pass itself when
    // one pass is all the update runs, else in the old policy's pass.
    let shared = with_kl && state.reference.is_none();
    let clock = Instant::now();
    let mut reference = match &state.reference {
        Some(model) if with_kl => {
            Some(logprobs(model, sequences, plan.temperature, budget).map_err(|e| e.to_string())?)
        }
        _ => None,
    };
    timings.reference_ms += elapsed_ms(clock);
    let clock = Instant::now();
    let old = if fused {
        None
    } else {
        let scored = if shared {
            logprobs_with_reference(&state.trainer.model, sequences, plan.temperature, budget)
        } else {
            state
                .trainer
                .logprobs(sequences, plan.temperature)
                .map(|policy| WithReference { policy, ..Default::default() })
        }
        .map_err(|e| e.to_string())?;
        timings.reference_ms += scored.reference_ms;
        timings.old_logprobs_ms += elapsed_ms(clock) - scored.reference_ms;
        if shared {
            reference = Some(scored.reference);
        }
        Some(scored.policy)
    };
    let (mut gap_sum, mut gap_max, mut gap_count) = (0.0, 0.0f64, 0usize);
    if let Some(old) = &old {
        for (o, s) in old.iter().zip(&serving) {
            gap(o, s, &mut gap_sum, &mut gap_max, &mut gap_count);
        }
    }
    let mut rows = Vec::new();
    for epoch in 0..config.ppo_epochs {
        for (m, range) in mini_batches.iter().cloned().enumerate() {
            let clock = Instant::now();
            let chunk = &sequences[range.clone()];
            // Entropy and clipping describe the sampled trajectories; the replayed
            // demonstrations' mean −log p says how far the policy has moved from them.
            let (mut sampled_tokens, mut replayed_tokens) = (0usize, 0usize);
            for (sequence, sample) in chunk.iter().zip(&samples[range.clone()]) {
                let count = if sample.replayed { &mut replayed_tokens } else { &mut sampled_tokens };
                *count += sequence.positions().len();
            }
            let scored = sampled_tokens + replayed_tokens;
            let weight = 1.0 / scored.max(1) as f64;
            let (mut pg, mut kl, mut clipped, mut entropy, mut replay_nll) = (0.0, 0.0, 0usize, 0.0, 0.0);
            let report = state
                .trainer
                .step(
                    chunk,
                    plan.temperature,
                    &config.optimizer,
                    plan.total_lr_steps,
                    fused && shared,
                    &mut |k, current, base| {
                        let i = range.start + k;
                        let old = old.as_ref().map_or(current, |o| o[i].as_slice());
                        if fused {
                            gap(current, &serving[i], &mut gap_sum, &mut gap_max, &mut gap_count);
                        }
                        let mut value = 0.0;
                        let derivative = (0..current.len())
                            .map(|t| {
                                let r = reference.as_ref().map(|r| r[i][t]).or(base.map(|b| b[t]));
                                let penalty = if misstep[i].as_ref().is_some_and(|m| m[t]) {
                                    config.misstep_penalty
                                } else {
                                    0.0
                                };
                                let advantage = token_advantage(
                                    samples[i].advantage - penalty,
                                    old[t],
                                    guided[i].as_deref(),
                                    t,
                                    config,
                                );
                                let terms = config.loss.token(current[t], old[t], r, advantage);
                                value += terms.loss * weight;
                                pg += terms.policy * weight;
                                kl += terms.kl * weight;
                                if samples[i].replayed {
                                    replay_nll -= f64::from(current[t]);
                                } else {
                                    clipped += usize::from(terms.clipped);
                                    entropy -= f64::from(current[t]);
                                }
                                (terms.derivative * weight) as f32
                            })
                            .collect();
                        (value, derivative)
                    },
                )
                .map_err(|e| e.to_string())?;
            let reference_ms: f64 = report.micro_batches.iter().map(|m| m.reference_ms).sum();
            timings.reference_ms += reference_ms;
            timings.forward_backward_ms += report.micro_batches.iter().map(|m| m.wall_ms).sum::<f64>() - reference_ms;
            timings.optimizer_ms += report.optimizer_ms;
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
                clip_fraction: clipped as f64 / sampled_tokens.max(1) as f64,
                entropy: entropy / sampled_tokens.max(1) as f64,
                replay_nll: replay_nll / replayed_tokens.max(1) as f64,
                grad_norm: report.grad_norm,
                lr: report.lr,
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

impl Update {
    /// Trains the run's own models: the shared one, or the proposer's and the solver's apart
    /// (`proposer_model:`), each from its own trainer, the proposer's first.
    pub(super) async fn in_process(
        &self,
        cx: &StageContext,
        selfplay: &Arc<SelfPlay>,
        inputs: &Tables,
        temperature: f32,
        clock: Instant,
    ) -> Result<Outcome, StageError> {
        let roles = [(Role::Proposer, "proposer"), (Role::Solver, "solver")];
        let trainings = by_training(cx, selfplay, Self::KIND, roles.into_iter().filter(|(_, name)| self.trains(name)))?;
        // Written (searched, tokenized) before any trainer is taken.
        let replay = match &self.config.replay {
            Some(replay) => Some((replay, self.demonstrations.get_async(replay.write(selfplay)).await?)),
            None => None,
        };
        let mut states = Vec::new();
        for (training, _) in &trainings {
            let mut state = training.take().await?;
            if let Some(adapters) = training.section.update_adapters() {
                state.trainer.adapt_anew(adapters);
            }
            state.optimizer_for(cx.stage_name());
            if self.config.loss.kl_coef > 0.0 && state.reference.is_none() && state.trainer.model.adapters.is_none() {
                state.reference = Some(training.reference_model().await?);
            }
            states.push(state);
        }
        let put_back = async |states: Vec<TrainState>| {
            for ((training, _), state) in trainings.iter().zip(states) {
                training.put(state).await;
            }
        };
        // The proposer's running-mean baseline lives with the proposer's trainer.
        let proposer = trainings.iter().position(|(_, roles)| roles.contains(&"proposer"));
        let mut no_baseline = None;
        let baseline = match proposer {
            Some(p) => &mut states[p].proposer_baseline,
            None => &mut no_baseline,
        };
        let mut batches = match self.batches(inputs, baseline) {
            Ok(batches) => batches,
            Err(e) => {
                put_back(states).await;
                return Err(e);
            }
        };
        if lack_token_ids(&batches) {
            put_back(states).await;
            return Err(failed(
                "update",
                "no trajectory has token ids: the policy backend records none (in-process training needs `candle`)",
            ));
        }
        let replayed =
            replay.map_or_else(Vec::new, |(replay, demonstrations)| replay.add(cx, &demonstrations, &mut batches));
        // Each trainer's batches, and its schedule's length if every step's were this step's.
        let (mut work, mut rest): (Vec<(Vec<RoleBatch>, u64)>, Vec<RoleBatch>) = (Vec::new(), batches);
        for (_, roles) in &trainings {
            let mine;
            (mine, rest) = rest.into_iter().partition(|b| roles.contains(&b.role));
            let total_lr_steps = cx.steps() * optimizer_steps(&mine, &self.config);
            work.push((mine, total_lr_steps));
        }
        let config = self.config.clone();
        let parents: Vec<u64> = states.iter().map(|s| s.version).collect();
        let serving: Vec<Option<Arc<dyn Policy>>> = trainings
            .iter()
            .map(|(training, _)| config.served_block_inputs.then(|| training.model.served_by(selfplay)))
            .collect();
        let worker = tokio::task::spawn_blocking(move || {
            let mut rows = Vec::new();
            let mut timings = Timings::default();
            for ((state, (batches, total_lr_steps)), serving) in states.iter_mut().zip(&work).zip(&serving) {
                let plan =
                    Plan { config: &config, temperature, total_lr_steps: *total_lr_steps, serving: serving.as_ref() };
                for batch in batches {
                    match update_role(state, batch, &plan, &mut timings) {
                        Ok(more) => rows.extend(more),
                        Err(e) => return (states, Err(format!("{} update: {e}", batch.role))),
                    }
                }
            }
            (states, Ok((rows, timings)))
        });
        let (states, rows) = worker.await.map_err(|e| failed("the training thread", e))?;
        let (rows, timings) = match rows {
            Ok(rows) => rows,
            Err(e) => {
                put_back(states).await;
                return Err(failed("update", e));
            }
        };
        let train_ms = elapsed_ms(clock);
        let (mut published, mut versions) = (Vec::new(), Vec::new());
        for (((training, _), state), parent) in trainings.iter().zip(states).zip(parents) {
            let (state, made) = publish_version(cx, selfplay, training, state, parent).await?;
            versions.push((training.model, state.version));
            published.push(made);
            training.put(state).await;
        }
        Ok(Outcome {
            rows,
            published: Published::merge(published)?,
            versions,
            train_ms,
            timings: Some(timings),
            replayed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selfplay::stages::update::batch::{Sample, lack_token_ids};
    use sesa_models::train::{
        ClippedObjective, LoraMethod, Method, OptimizerConfig, TrainModel, Trainer, baseline_advantages,
    };
    use sesa_models::weights::testing::{random, tiny_shape};

    #[test]
    fn a_guided_token_is_weighted_by_the_truncated_ratio_of_the_trained_prompt_to_the_hinted() {
        let hinted = [Some(-0.1f32), Some(-2.0), None];
        let at = |written_weight, written_sft| UpdateConfig { written_weight, written_sft, ..config(1, None) };
        let (plain, quarter, sft) = (at(1.0, 0.0), at(0.25, 0.0), at(0.25, 0.5));
        // The hint made the first token likelier than the bare prompt does: weight e^(−1.1).
        assert!((token_advantage(2.0, -1.2, Some(&hinted), 0, &plain) - 2.0 * (-1.1f64).exp()).abs() < 1e-6);
        // The bare prompt makes the second likelier still: the weight is truncated at 1.
        assert_eq!(token_advantage(2.0, -0.5, Some(&hinted), 1, &plain), 2.0);
        assert_eq!(token_advantage(2.0, -9.0, Some(&hinted), 2, &plain), 2.0, "a written token is trained as written");
        assert_eq!(token_advantage(2.0, -9.0, Some(&hinted), 2, &quarter), 0.5, "at the written weight");
        assert_eq!(token_advantage(2.0, -9.0, Some(&hinted), 2, &sft), 1.0, "plus the written sft");
        assert_eq!(
            token_advantage(-2.0, -9.0, Some(&hinted), 2, &sft),
            0.0,
            "added to the GRPO term, whatever its sign"
        );
        assert_eq!(token_advantage(2.0, -0.5, Some(&hinted), 1, &sft), 2.0, "a sampled token is not");
        assert_eq!(token_advantage(2.0, -3.0, None, 0, &sft), 2.0, "an unguided rollout is on-policy");
    }

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
        let samples = (0..advantages.len() as u32)
            .map(|s| {
                let tokens: Vec<u32> = (0..10).map(|t| (s * 7 + t * 3) % 16).collect();
                Sample {
                    group: 0,
                    reward: 0.0,
                    advantage: advantages[s as usize],
                    prompt: String::new(),
                    response: String::new(),
                    prompt_ids: tokens[..3].to_vec(),
                    response_ids: tokens[3..].to_vec(),
                    loss_mask: vec![1; 7],
                    logprobs: vec![0.0; 7],
                    exact: true,
                    policy_version: 0,
                    guided: false,
                    last_misstep: None,
                    replayed: false,
                }
            })
            .collect();
        RoleBatch { role: "solver", samples, rewards: vec![0.0; advantages.len()], groups: 1, groups_without_signal: 0 }
    }

    fn sequences(batch: &RoleBatch) -> Vec<TrainSequence> {
        batch.samples.iter().map(|s| s.sequence().unwrap()).collect()
    }

    fn config(ppo_epochs: usize, mini_batch: Option<usize>) -> UpdateConfig {
        UpdateConfig {
            roles: vec!["proposer".into(), "solver".into()],
            optimizer: OptimizerConfig::adamw(1e-2),
            loss: ClippedObjective::default(),
            ppo_epochs,
            mini_batch,
            proposer_baseline: None,
            proposer_baseline_per_hops: false,
            skip_groups_without_signal: false,
            written_weight: 1.0,
            misstep_penalty: 0.0,
            written_sft: 0.0,
            keep_every: None,
            served_block_inputs: false,
            replay: None,
            external: None,
        }
    }

    fn totals(state: &TrainState, batch: &RoleBatch) -> Vec<f32> {
        state.trainer.logprobs(&sequences(batch), 1.0).unwrap().iter().map(|l| l.iter().sum()).collect()
    }

    #[test]
    fn repeated_grpo_updates_raise_positive_advantage_sequences_and_lower_negative_ones() {
        let mut state = state();
        let batch = batch(&[1.0, -1.0, 1.0, -1.0]);
        let config = config(1, None);
        let plan = Plan { config: &config, temperature: 1.0, total_lr_steps: 10, serving: None };
        let before = totals(&state, &batch);
        for round in 0..5 {
            let rows = update_role(&mut state, &batch, &plan, &mut Timings::default()).unwrap();
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
            if batch.samples[i].advantage > 0.0 {
                assert!(a > b, "sequence {i}: {b} → {a}");
            } else {
                assert!(a < b, "sequence {i}: {b} → {a}");
            }
        }
        let last = update_role(&mut state, &batch, &plan, &mut Timings::default()).unwrap();
        assert!(last[0].kl > 0.0, "the policy moved away from its reference");
    }

    /// LoRA's reference, the base weights under the adapters, computed in the policy's own
    /// passes (sharing the blocks below the adapters) gives the rows that a separate copy of the
    /// base model gives: in one fused pass, and with epochs and mini-batches.
    #[test]
    fn the_lora_reference_from_the_policys_own_passes_is_a_separate_base_models() {
        let batch = batch(&[1.0, -1.0, 1.0, -1.0]);
        for config in [config(1, None), config(2, Some(2))] {
            let plan = Plan { config: &config, temperature: 1.0, total_lr_steps: 10, serving: None };
            let updates = |separate: bool| {
                let mut state = state();
                let method = Method::Lora(LoraMethod { top_layers: Some(1), ..LoraMethod::everywhere(2, 4.0) });
                let weights = state.trainer.model.weights.clone();
                state.trainer = Trainer::new(TrainModel::for_method(weights, &method), 64);
                if !separate {
                    state.reference = None;
                }
                (0..3)
                    .flat_map(|_| update_role(&mut state, &batch, &plan, &mut Timings::default()).unwrap())
                    .map(|r| (r.kl, r.loss, r.pg_loss, r.grad_norm, r.entropy))
                    .collect::<Vec<_>>()
            };
            let shared = updates(false);
            assert_eq!(shared[0].0, 0.0, "adapters with B = 0 are the base model");
            assert!(shared.last().unwrap().0 > 0.0, "the adapters moved the policy from its reference");
            assert_eq!(shared, updates(true), "ppo_epochs {}", config.ppo_epochs);
        }
    }

    /// One update of a fresh state on `batch` under `config`: its policy-gradient loss and
    /// whether the weights moved.
    fn train_once(batch: &RoleBatch, config: UpdateConfig) -> (f64, bool) {
        let plan = Plan { config: &config, temperature: 1.0, total_lr_steps: 10, serving: None };
        let mut state = state();
        let before = state.trainer.model.weights.clone();
        let rows = update_role(&mut state, batch, &plan, &mut Timings::default()).unwrap();
        (rows[0].pg_loss, state.trainer.model.weights != before)
    }

    /// At ratio 1 each token's surrogate is minus its advantage, averaged over the seven scored
    /// tokens of a guided rollout whose first four response tokens were written and the last
    /// three sampled (at a probability so low that their truncated weight is 1).
    #[test]
    fn written_tokens_are_trained_at_the_written_weight_plus_the_written_sft() {
        let guided = |advantage| {
            let mut batch = batch(&[advantage]);
            let sample = &mut batch.samples[0];
            (sample.guided, sample.loss_mask, sample.logprobs) = (true, vec![2, 2, 2, 2, 1, 1, 1], vec![-100.0; 7]);
            batch
        };
        let pg = |advantage, written_weight, written_sft| {
            train_once(&guided(advantage), UpdateConfig { written_weight, written_sft, ..config(1, None) })
        };
        let close = |(loss, moved): (f64, bool), expected: f64| moved && (loss - expected).abs() < 1e-9;
        assert!(close(pg(1.0, 1.0, 0.0), -1.0));
        assert!(close(pg(1.0, 0.0, 0.0), -3.0 / 7.0), "only the sampled tokens");
        assert!(close(pg(1.0, 0.5, 0.0), -5.0 / 7.0));
        // A group whose rewards were all equal (advantage 0) trains only through written_sft,
        // on the written tokens alone.
        assert_eq!(pg(0.0, 1.0, 0.0), (0.0, false));
        assert!(close(pg(0.0, 1.0, 0.5), -4.0 * 0.5 / 7.0));
    }

    /// A replayed demonstration beside a rollout whose group had no signal: at ratio 1 its seven
    /// tokens' surrogate is −weight each, averaged with the rollout's seven at 0; it joins the
    /// rollout's one mini-batch rather than making its own, and entropy and clipping describe
    /// the rollout alone.
    #[test]
    fn a_replayed_demonstration_is_trained_at_its_weight_beside_the_rollouts() {
        let mut batch = batch(&[0.0, 0.5]);
        let replayed = &mut batch.samples[1];
        (replayed.replayed, replayed.exact, replayed.logprobs) = (true, false, Vec::new());
        let config = config(1, Some(1));
        let plan = Plan { config: &config, temperature: 1.0, total_lr_steps: 10, serving: None };
        let mut state = state();
        let before = state.trainer.model.weights.clone();
        let nll: Vec<f64> = totals(&state, &batch).iter().map(|&total| -f64::from(total) / 7.0).collect();
        let rows = update_role(&mut state, &batch, &plan, &mut Timings::default()).unwrap();
        assert_eq!(rows.iter().map(|r| (r.optimizer_step, r.sequences)).collect::<Vec<_>>(), [(1, 2)]);
        assert!((rows[0].pg_loss - -0.5 * 7.0 / 14.0).abs() < 1e-9, "{}", rows[0].pg_loss);
        assert!(state.trainer.model.weights != before);
        assert!((rows[0].entropy - nll[0]).abs() < 1e-5, "{} against {}", rows[0].entropy, nll[0]);
        assert!((rows[0].replay_nll - nll[1]).abs() < 1e-5, "{} against {}", rows[0].replay_nll, nll[1]);
    }

    #[test]
    fn tokens_up_to_the_last_misstep_are_trained_at_the_advantage_less_the_penalty() {
        // Turn 0 (two generated tokens), a retrieved block of two, turn 1 (the misstep: one
        // generated token), one retrieved token, and turn 2 (one generated token, the answer
        // that came after the misstep: no part of it).
        let mut batch = batch(&[0.0]);
        let sample = &mut batch.samples[0];
        (sample.loss_mask, sample.last_misstep) = (vec![1, 1, 0, 0, 1, 0, 1], Some(1));
        let sequence = sample.sequence().unwrap();
        assert_eq!(sample.misstep_at(&sequence).unwrap(), [true, true, true, false]);
        // A token guidance wrote is not the solver's decision; without missteps, none is.
        let mut written = sample.clone();
        written.loss_mask = vec![2, 1, 0, 0, 2, 0, 1];
        assert_eq!(written.misstep_at(&written.sequence().unwrap()).unwrap(), [false, true, false, false]);
        let mut none = sample.clone();
        none.last_misstep = None;
        assert_eq!(none.misstep_at(&sequence), None);
        let pg = |misstep_penalty: f64| {
            // `solver_batch` gives a rollout its misstep only where the penalty credits it.
            let mut samples = batch.samples.clone();
            if misstep_penalty == 0.0 {
                samples[0].last_misstep = None;
            }
            let credited = RoleBatch { samples, rewards: vec![0.0], ..self::batch(&[]) };
            train_once(&credited, UpdateConfig { misstep_penalty, ..config(1, None) })
        };
        // A zero advantage trains nothing, unless the misstep's penalty gives it one: at ratio 1
        // each token's surrogate is minus its advantage, averaged over the four scored tokens.
        assert_eq!(pg(0.0), (0.0, false));
        let (loss, moved) = pg(2.0);
        assert!((loss - 3.0 * 2.0 / 4.0).abs() < 1e-9 && moved, "{loss}");
    }

    #[test]
    fn epochs_and_mini_batches_take_an_optimizer_step_each_against_the_old_policy() {
        let mut state = state();
        let batch = batch(&[2.0, -2.0, 2.0, -2.0]);
        let config = config(2, Some(2));
        let plan = Plan { config: &config, temperature: 1.0, total_lr_steps: 10, serving: None };
        let rows = update_role(&mut state, &batch, &plan, &mut Timings::default()).unwrap();
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
        let plan = Plan { config: &config, temperature: 1.0, total_lr_steps: 10, serving: None };
        let rows = update_role(&mut state, &batch, &plan, &mut Timings::default()).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].optimizer_step, 0, "no optimizer step");
        assert_eq!(state.trainer.model.weights, before);
        assert_eq!(state.trainer.adam.step, 0);
    }

    #[test]
    fn a_step_whose_groups_all_lacked_signal_trains_nothing_and_is_no_error() {
        let mut silent = batch(&[]);
        silent.groups = 12;
        silent.groups_without_signal = 12;
        assert!(!lack_token_ids(std::slice::from_ref(&silent)), "nothing to train is not a missing-ids error");
        let mut state = state();
        let before = state.trainer.model.weights.clone();
        let config = config(1, None);
        let plan = Plan { config: &config, temperature: 1.0, total_lr_steps: 10, serving: None };
        let rows = update_role(&mut state, &silent, &plan, &mut Timings::default()).unwrap();
        assert_eq!((rows.len(), rows[0].sequences, rows[0].groups_without_signal), (1, 0, 12));
        assert_eq!(state.trainer.model.weights, before);

        // Trajectories without token ids (an inexact backend) are the error.
        let mut no_ids = batch(&[1.0, -1.0]);
        no_ids.samples.iter_mut().for_each(|s| s.prompt_ids.clear());
        assert!(lack_token_ids(&[no_ids]));
        assert!(!lack_token_ids(&[batch(&[1.0, -1.0])]));
    }
}
