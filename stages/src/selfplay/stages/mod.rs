//! The stage kinds of the loop, one module each, in the order a step runs them.

mod collect;
mod consolidate;
mod evaluate;
mod priming;
mod propose;
mod reward;
mod solve;
mod update;
mod verify;
mod warmup;

use std::time::Instant;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use sesa_engine::{StageError, TableSpec};

pub use self::collect::Collect;
pub use self::consolidate::Consolidate;
pub use self::evaluate::Evaluate;
pub use self::priming::Priming;
pub use self::propose::Propose;
pub use self::reward::Reward;
pub use self::solve::{Shown, Solve};
pub use self::update::{ExternalCheckpoint, Update, UpdateConfig, train_with_sesa};
pub use self::verify::Verify;
pub use self::warmup::{Warmup, WarmupConfig};
use crate::agent::{Outcome, Trajectory};
use sesa_engine::columns::{Columns, schema_of};
use sesa_models::policy::{KvCacheDtype, Precision};

// Defaults the stages' configs share (serde names them by path).
fn one() -> usize {
    1
}

fn yes() -> bool {
    true
}

fn four() -> usize {
    4
}

/// `step_metrics`: one row per (stage, metric) and step, appended by every stage of the loop.
/// Long format, so each stage adds what it knows; pivot in DuckDB for a wide view.
pub fn metrics_batch<M: AsRef<str>>(stage: &str, rows: &[(M, f64)]) -> Result<RecordBatch, ArrowError> {
    Columns::default()
        .str("stage", rows.iter().map(|_| stage))
        .str("metric", rows.iter().map(|(m, _)| m.as_ref()))
        .f64("value", rows.iter().map(|(_, v)| *v))
        .finish()
}

/// The mean of a metric per hop count, as `step_metrics` rows named `{metric}_h{hops}` (in hop
/// order): self-play's curriculum shows in how each rate moves at each depth.
fn per_hops(metric: &str, values: impl IntoIterator<Item = (u64, f64)>) -> Vec<(String, f64)> {
    let mut by_hops: std::collections::BTreeMap<u64, Vec<f64>> = std::collections::BTreeMap::new();
    for (hops, value) in values {
        by_hops.entry(hops).or_default().push(value);
    }
    by_hops.into_iter().map(|(hops, values)| (format!("{metric}_h{hops}"), mean(values))).collect()
}

/// The `step_metrics` that summarise a step of the loop, with a short title each: what
/// `sesa run` prints per step when it ends.
pub const STEP_SUMMARY: &[(&str, &str)] = &[
    ("valid_rate", "valid"),
    ("pass_rate", "verified"),
    ("source_proposed", "proposed"),
    ("source_substitute", "subst."),
    ("solver_success", "success"),
    ("mean_p_hat", "mean p̂"),
    ("frontier_share", "frontier"),
    ("proposer_reward_mean", "prop.rew"),
    ("bank_size", "bank"),
    ("queue_length", "queue"),
    ("tokens", "tokens"),
];

fn metrics_table() -> TableSpec {
    TableSpec::new("step_metrics", schema_of(|| metrics_batch::<&str>("", &[])))
}

fn skills_table() -> TableSpec {
    TableSpec::new("skills", crate::memory::SKILLS_SCHEMA.clone())
}

fn skill_events_table() -> TableSpec {
    TableSpec::new("skill_events", crate::memory::SKILL_EVENTS_SCHEMA.clone())
}

/// The columns every trajectory table has (proposals, rollouts): what the agent did, and its
/// tokens for training (`loss_mask` 1 on generated tokens, 0 on retrieved ones).
fn with_trajectories(columns: Columns, trajectories: &[Trajectory]) -> Columns {
    let masks: Vec<Vec<u32>> =
        trajectories.iter().map(|t| t.loss_mask.iter().map(|&m| u32::from(m)).collect()).collect();
    let outcomes: Vec<String> = trajectories.iter().map(|t| outcome_name(&t.outcome)).collect();
    columns
        .strs("searches", trajectories.iter().map(|t| t.queries()))
        .strs(
            "retrieved_ids",
            trajectories.iter().map(|t| t.turns.iter().flat_map(|u| u.retrieved_ids.iter().map(String::as_str))),
        )
        .u64("turns", trajectories.iter().map(|t| t.turns.len() as u64))
        .u64("generated_tokens", trajectories.iter().map(|t| t.generated_tokens() as u64))
        .str("outcome", outcomes.iter().map(String::as_str))
        .str("response", trajectories.iter().map(|t| t.response.as_str()))
        .u32s("token_ids", trajectories.iter().map(|t| t.token_ids.as_slice()))
        .u32s("loss_mask", masks.iter().map(Vec::as_slice))
        .f32s("logprobs", trajectories.iter().map(|t| t.logprobs.as_slice()))
        .bool("tokens_exact", trajectories.iter().map(|t| t.tokens_exact))
        .str("prompt", trajectories.iter().map(|t| t.prompt.as_str()))
        .u32s("prompt_ids", trajectories.iter().map(|t| t.prompt_ids.as_slice()))
        .u64("policy_version", trajectories.iter().map(|t| t.policy_version))
        .opt_str("precision", trajectories.iter().map(|t| t.precision.map(Precision::name)))
        .opt_str("kv_cache_dtype", trajectories.iter().map(|t| t.kv_cache_dtype.map(KvCacheDtype::name)))
}

/// How an episode ended, in one word (format errors with their kind).
fn outcome_name(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Final(_) => "final".into(),
        Outcome::FormatError(error) => format!("format_error: {error}"),
        Outcome::TurnLimit => "turn_limit".into(),
        Outcome::TokenBudget => "token_budget".into(),
        Outcome::ContextLimit => "context_limit".into(),
    }
}

/// The role a stage's config names (`solver` or `proposer`, checked when the stage is built).
fn role_named(name: &str) -> crate::agent::Role {
    if name == "proposer" { crate::agent::Role::Proposer } else { crate::agent::Role::Solver }
}

/// Episodes played by `role` with its policy and the run's search, with progress; returns the
/// trajectories and the milliseconds spent in generation and in search.
async fn play(
    cx: &sesa_engine::StageContext,
    selfplay: &crate::selfplay::SelfPlay,
    role: crate::agent::Role,
    episodes: &[crate::agent::Episode],
) -> Result<(Vec<Trajectory>, f64, f64), StageError> {
    let agent = crate::agent::AgentRun {
        role,
        policy: selfplay.policy_of(role).as_ref(),
        search: selfplay.search.as_ref(),
        top_k: selfplay.top_k,
        limits: selfplay.agent.limits(),
        sampling: selfplay.agent.sampling,
    };
    let mut progress = cx.progress(episodes.len() as u64);
    let (trajectories, busy) = agent.run_timed(episodes).await.map_err(|e| failed(&format!("{role:?} episodes"), e))?;
    progress.inc(episodes.len() as u64);
    Ok((trajectories, busy.generation.as_secs_f64() * 1e3, busy.search.as_secs_f64() * 1e3))
}

/// A file a stage reads on its first run and keeps: inputs named in a spec do not change
/// during a run, so later steps skip the I/O and parsing.
struct LoadOnce<T>(std::sync::OnceLock<std::sync::Arc<T>>);

impl<T> Default for LoadOnce<T> {
    fn default() -> Self {
        LoadOnce(std::sync::OnceLock::new())
    }
}

impl<T> LoadOnce<T> {
    fn get(&self, load: impl FnOnce() -> Result<T, StageError>) -> Result<std::sync::Arc<T>, StageError> {
        if let Some(loaded) = self.0.get() {
            return Ok(loaded.clone());
        }
        let loaded = std::sync::Arc::new(load()?);
        Ok(self.0.get_or_init(|| loaded).clone())
    }

    /// [`Self::get`] with a loader that awaits (searches, tokenizes).
    async fn get_async(
        &self,
        load: impl Future<Output = Result<T, StageError>>,
    ) -> Result<std::sync::Arc<T>, StageError> {
        if let Some(loaded) = self.0.get() {
            return Ok(loaded.clone());
        }
        let loaded = std::sync::Arc::new(load.await?);
        Ok(self.0.get_or_init(|| loaded).clone())
    }
}

/// Milliseconds since `clock`, as a metric value.
fn elapsed_ms(clock: Instant) -> f64 {
    clock.elapsed().as_secs_f64() * 1e3
}

/// The mean of `values`, 0 for none.
fn mean(values: impl IntoIterator<Item = f64>) -> f64 {
    let (sum, count) = values.into_iter().fold((0.0, 0usize), |(s, c), v| (s + v, c + 1));
    if count == 0 { 0.0 } else { sum / count as f64 }
}

fn failed(context: &str, error: impl std::fmt::Display) -> StageError {
    StageError::Failed(format!("{context}: {error}"))
}
