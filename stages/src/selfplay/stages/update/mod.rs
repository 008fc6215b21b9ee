//! `update`: the RL update that ends a step of the loop. The proposer learns by REINFORCE from
//! the reward stage's proposer rewards (optionally against a running-mean baseline), then the
//! solver by GRPO from its rollouts' rewards, normalised within each question's group, as in
//! SSP: two updates of the one shared policy, proposer first. Both minimise the clipped
//! objective of [`sesa_models::train::objective`] with a KL penalty to the initial policy.
//!
//! Old log-probabilities are the trainer's, recomputed on the weights the role's update starts
//! from (as verl does), never the serving backend's: its precision then cannot bias the ratio.
//! With one epoch of one mini-batch the update's own forward pass is that recomputation (the
//! ratio is exactly 1 there), so it costs no extra pass. The gap to the serving backend's
//! log-probabilities is recorded in `updates`.

mod batch;
mod external;
mod in_process;
mod replay;

use std::sync::Arc;
use std::time::Instant;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, Requirement, Stage, StageContext, StageError, TableSpec, Tables};

use self::batch::{RoleBatch, proposer_batch, solver_batch};
use self::external::ExternalTrainer;
pub use self::external::{ExternalCheckpoint, train_with_sesa};
use self::in_process::Timings;
pub use self::replay::Replay;
use super::propose::Propose;
use super::reward::Reward;
use super::solve::Solve;
use super::{LoadOnce, elapsed_ms, failed, metrics_batch, metrics_table, role_named};
use crate::agent::Role;
use crate::selfplay::SelfPlay;
use crate::selfplay::demonstrations::Demonstration;
use crate::selfplay::training::{Published, TrainedModel, checkpoints_table, policy_versions_table};
use sesa_engine::columns::{Columns, schema_of};
use sesa_models::train::{ClippedObjective, OptimizerConfig};

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
    #[serde(default = "super::one")]
    pub ppo_epochs: usize,
    /// Sequences per optimizer step (SSP: 640, so its 1,280 solver rollouts take two steps and
    /// its 256 proposals one); the whole batch by default.
    #[serde(default)]
    pub mini_batch: Option<usize>,
    /// A running-mean baseline for the proposer's REINFORCE (SSP: none).
    #[serde(default)]
    pub proposer_baseline: Option<RunningMean>,
    /// The proposer's baseline per requested hop count instead (after Dr. Zero's HRPO): each
    /// proposal's is the mean reward of the step's proposals asked for as many hops, so that
    /// deep questions, invalid more often, are not all pushed down against shallow ones.
    #[serde(default)]
    pub proposer_baseline_per_hops: bool,
    /// Leaves out solver groups whose rewards are all equal (SSP keeps them: their only
    /// gradient is the KL term). Saves their forward and backward passes on a CPU.
    #[serde(default)]
    pub skip_groups_without_signal: bool,
    /// The weight of the tokens guidance wrote into a guided rollout (`loss_mask` 2: a plan,
    /// a step to the next hop) against the tokens the model sampled, which have weight 1: each
    /// written token's advantage is scaled by it. 1 (the default) trains them as a
    /// demonstration; 0 trains only what the model sampled in their context. In-process
    /// training only.
    #[serde(default = "crate::selfplay::rules::one")]
    pub written_weight: f64,
    /// Subtracted from the advantage of every sampled token of a solver rollout up to and
    /// including its last turn that misjudged the question's depth (`rewards.missteps`: a
    /// search once the question's hops were searched, or an answer before them; the turns
    /// before it because the decision is often written there, in the opening plan): credit for
    /// the decision to search again or to answer, which a rollout's one reward does not single
    /// out. 0 (the default) turns it off; above 0, groups whose rewards are all equal are
    /// trained when they hold a misstep, even with `skip_groups_without_signal`. In-process
    /// training only.
    #[serde(default)]
    pub misstep_penalty: f64,
    /// Added to the advantage of every written token (a plan guidance wrote from the question's
    /// true chain), whatever the rollout's reward: the written tokens trained as a
    /// demonstration at this weight in every guided group, so the plan's choice of how many
    /// hops is taught where a group's rewards are all equal too (a one-hop group that all
    /// solved carries no GRPO signal, while a deep group's successful plans carry a large one).
    /// 0 (the default) turns it off; above 0, groups whose rewards are all equal are trained
    /// when they hold a written token, even with `skip_groups_without_signal`. In-process
    /// training only.
    #[serde(default)]
    pub written_sft: f64,
    /// Checkpoints kept: the latest and those of steps that are multiples of this; every one
    /// by default.
    #[serde(default)]
    pub keep_every: Option<u64>,
    /// With LoRA on the top blocks only, start the trainer's passes at the lowest adapted
    /// block from the residual stream the served model computed there while it sampled and
    /// read the rollouts (the `candle` backend keeps it), instead of running the frozen blocks
    /// below again: about half of a top-8 update's work. The trainer's log-probabilities then
    /// rest on the served model's numerics below that block (`model.dtype`), as the rollouts
    /// did. False: the trainer runs every block itself in F32. In-process training only.
    #[serde(default = "super::yes")]
    pub served_block_inputs: bool,
    /// Demonstrations trained beside each step's trajectories (InstructGPT's PPO-ptx), so that
    /// what the warm start taught and RL does not reward on its own (a one-hop question's
    /// one-clause plan and single search) is held while written plans teach depth. In-process
    /// training only.
    #[serde(default)]
    pub replay: Option<Replay>,
    /// Hands each step's batch to an external trainer (verl, OpenRLHF on a GPU cluster)
    /// instead of training in process; see the README's "External trainer".
    #[serde(default)]
    pub external: Option<ExternalTrainer>,
}

fn both_roles() -> Vec<String> {
    vec!["proposer".into(), "solver".into()]
}

impl UpdateConfig {
    /// The roles it trains.
    pub fn trained_roles(&self) -> Vec<Role> {
        self.roles.iter().map(|name| role_named(name)).collect()
    }

    /// Whether a solver rollout's missteps earn its tokens a penalty of their own.
    pub fn credits_missteps(&self) -> bool {
        self.misstep_penalty != 0.0
    }

    /// Whether written tokens are trained whatever their rollout's reward.
    pub fn credits_written(&self) -> bool {
        self.written_sft != 0.0
    }
}

/// What an update did, whichever trainer ran it.
struct Outcome {
    rows: Vec<UpdateRow>,
    published: Published,
    /// The version each trained model is at now.
    versions: Vec<(TrainedModel, u64)>,
    train_ms: f64,
    /// Where in-process training's time went (an external trainer reports its own).
    timings: Option<Timings>,
    /// Demonstrations replayed per role (`replay`).
    replayed: Vec<(&'static str, usize)>,
}

/// The RL update.
pub struct Update {
    config: UpdateConfig,
    /// `replay`'s demonstrations, written on first use.
    demonstrations: LoadOnce<Vec<Demonstration>>,
}

/// A row of `updates`: one optimizer step of one role (or a role with nothing to learn).
#[derive(Debug, Default)]
pub(super) struct UpdateRow {
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
    /// Mean −log p of the replayed demonstrations' tokens (0 without them).
    replay_nll: f64,
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
        .f64("replay_nll", rows.iter().map(|r| r.replay_nll))
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
        problems.extend(ConfigProblem::size("ppo_epochs", config.ppo_epochs, 1..=1_000));
        if let Some(mini_batch) = config.mini_batch {
            problems.extend(ConfigProblem::size("mini_batch", mini_batch, 1..=1_000_000));
        }
        if let Some(RunningMean { decay }) = config.proposer_baseline
            && !(0.0..1.0).contains(&decay)
        {
            problems.push(ConfigProblem::new("proposer_baseline.decay", format!("must be in [0, 1), got {decay}")));
        }
        if config.proposer_baseline_per_hops && config.proposer_baseline.is_some() {
            problems.push(ConfigProblem::new(
                "proposer_baseline_per_hops",
                "the proposer has one baseline: remove `proposer_baseline` or this",
            ));
        }
        if let Some(every) = config.keep_every {
            problems.extend(ConfigProblem::size("keep_every", every, 1..=u64::MAX));
        }
        if !(0.0..=1.0).contains(&config.written_weight) {
            problems.push(ConfigProblem::new(
                "written_weight",
                format!("must be in [0, 1], got {}", config.written_weight),
            ));
        }
        for (key, value) in [("misstep_penalty", config.misstep_penalty), ("written_sft", config.written_sft)] {
            if !(value >= 0.0 && value.is_finite()) {
                problems.push(ConfigProblem::new(key, format!("must be a number ≥ 0, got {value} (0 turns it off)")));
            }
        }
        if let Some(replay) = &config.replay {
            problems.extend(replay.problems(&config.roles));
        }
        if let Some(external) = &config.external {
            // Per-token weights an external trainer, which gets one advantage per sequence and
            // the `loss_mask`, cannot be told; and it gets the proposer's rewards as they are.
            let (remove, written) = ("remove the key", "weights written tokens itself (their `loss_mask` is 2)");
            let (raw, baseline) = ("gets the proposer's raw rewards", "apply a baseline there");
            for (key, set, why, fix) in [
                ("misstep_penalty", config.credits_missteps(), "gets one advantage per sequence", remove),
                ("written_sft", config.credits_written(), written, remove),
                ("written_weight", config.written_weight != 1.0, written, remove),
                ("proposer_baseline", config.proposer_baseline.is_some(), raw, baseline),
                ("proposer_baseline_per_hops", config.proposer_baseline_per_hops, raw, baseline),
                (
                    "replay",
                    config.replay.is_some(),
                    "gets the step's trajectories only",
                    "replay there, or remove the key",
                ),
            ] {
                if set {
                    problems.push(ConfigProblem::new(key, format!("an external trainer {why}: {fix}")));
                }
            }
            if external.command.is_empty() {
                problems.push(ConfigProblem::new("external.command", "name the trainer's program"));
            }
        }
        if problems.is_empty() { Ok(Update { config, demonstrations: LoadOnce::default() }) } else { Err(problems) }
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

    fn requirements(&self) -> Vec<Requirement> {
        let mut requirements: Vec<Requirement> =
            self.config.replay.iter().map(|replay| replay.world.requirement("replay.world")).collect();
        let Some(external) = &self.config.external else {
            return requirements;
        };
        if let Some(program) = external.command.first() {
            requirements.push(Requirement::program(
                "external.command",
                program,
                "install the trainer, or name it by its path (`sesa train-external` is sesa's own)",
            ));
        }
        if let Some(program) = external.reload_command.as_ref().and_then(|c| c.first()) {
            requirements.push(Requirement::program(
                "external.reload_command",
                program,
                "install it, or name it by its path",
            ));
        }
        for url in external.reload_url.iter().flat_map(|urls| urls.as_slice()) {
            requirements.push(Requirement::server(
                "external.reload_url",
                url,
                None,
                "start the policy server that reloads checkpoints there, or remove the key",
            ));
        }
        requirements
    }

    async fn run(&self, cx: &StageContext, inputs: Tables) -> Result<Tables, StageError> {
        let clock = Instant::now();
        let selfplay: Arc<SelfPlay> = cx.resource::<SelfPlay>()?;
        let temperature = selfplay.agent.sampling.temperature;
        if temperature <= 0.0 {
            return Err(failed(
                "update",
                "`agent.sampling.temperature` is 0: RL needs sampled rollouts and their log-probabilities",
            ));
        }
        let outcome = match &self.config.external {
            Some(external) => self.external(cx, &selfplay, external, &inputs, temperature, clock).await?,
            None => self.in_process(cx, &selfplay, &inputs, temperature, clock).await?,
        };
        let rows = &outcome.rows;
        let mut metrics: Vec<(String, f64)> = Vec::new();
        for role in ["proposer", "solver"] {
            let Some(first) = rows.iter().find(|r| r.role == role) else { continue };
            let summary = external::RoleMetrics::of(rows.iter().filter(|r| r.role == role));
            metrics.push((format!("{role}_loss"), summary.loss));
            metrics.push((format!("{role}_kl"), summary.kl));
            metrics.push((format!("{role}_clip_fraction"), summary.clip_fraction));
            metrics.push((format!("{role}_entropy"), summary.entropy));
            metrics.push((format!("{role}_logprob_gap"), summary.logprob_gap));
            metrics.push((format!("{role}_groups_without_signal"), first.groups_without_signal as f64));
            if let Some((_, replayed)) = outcome.replayed.iter().find(|(replayed_role, _)| *replayed_role == role) {
                metrics.push((format!("{role}_replayed"), *replayed as f64));
                metrics.push((format!("{role}_replay_nll"), summary.replay_nll));
            }
        }
        let tokens: u64 = rows.iter().map(|r| r.tokens).sum();
        metrics.push(("tokens".into(), tokens as f64));
        metrics.push(("train_ms".into(), outcome.train_ms));
        metrics.push(("serve_ms".into(), outcome.published.serve_ms));
        if let Some(Timings { reference_ms, old_logprobs_ms, forward_backward_ms, optimizer_ms, block_inputs_ms }) =
            outcome.timings
        {
            metrics.push(("checkpoint_ms".into(), outcome.published.checkpoint_ms));
            metrics.push(("reference_ms".into(), reference_ms));
            metrics.push(("old_logprobs_ms".into(), old_logprobs_ms));
            metrics.push(("forward_backward_ms".into(), forward_backward_ms));
            metrics.push(("optimizer_ms".into(), optimizer_ms));
            metrics.push(("block_inputs_ms".into(), block_inputs_ms));
        }
        for (model, version) in &outcome.versions {
            metrics.push((model.version_metric().into(), *version as f64));
        }
        metrics.push(("wall_ms".into(), elapsed_ms(clock)));
        Ok(Tables::new()
            .with("updates", updates_batch(rows)?)
            .with("policy_versions", outcome.published.policy_versions)
            .with("checkpoints", outcome.published.checkpoints)
            .with("step_metrics", metrics_batch(cx.stage_name(), &metrics)?))
    }
}

impl Update {
    fn trains(&self, role: &str) -> bool {
        self.config.roles.iter().any(|r| r == role)
    }

    /// The roles' batches, the proposer first; `baseline` is the proposer's running mean.
    fn batches(&self, inputs: &Tables, baseline: &mut Option<f64>) -> Result<Vec<RoleBatch>, StageError> {
        let mut batches = Vec::new();
        if self.trains("proposer") {
            let per_hops = self.config.proposer_baseline_per_hops;
            batches.push(proposer_batch(inputs, per_hops, |mean| match self.config.proposer_baseline {
                None => 0.0,
                Some(RunningMean { decay }) => {
                    let current = baseline.unwrap_or(mean);
                    *baseline = Some(decay * current + (1.0 - decay) * mean);
                    current
                }
            })?);
        }
        if self.trains("solver") {
            batches.push(solver_batch(inputs, &self.config)?);
        }
        Ok(batches)
    }
}
