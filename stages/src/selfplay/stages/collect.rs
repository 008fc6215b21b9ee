//! `collect`: failed solver rollouts of frontier questions (0 < p̂ < 1; optionally of every
//! question, or also of questions only a guided rollout solved) become compact failure records
//! in the pending queue of the skill memory. A guided rollout is never collected as a failure.

use std::time::Instant;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, Stage, StageContext, StageError, TableSpec, Tables};

use super::reward::Reward;
use super::solve::Solve;
use super::{elapsed_ms, failed, metrics_batch, metrics_table};
use crate::memory::{FailureRecord, clean};
use crate::selfplay::resources::SkillMemory;
use sesa_engine::columns::{Columns, Reader, schema_of};

/// The config of `collect`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CollectConfig {
    /// Only failures of frontier questions (0 < p̂ < 1), as SESA does; `false` collects every
    /// failure (the `− frontier shaping` ablation).
    #[serde(default = "super::yes")]
    pub frontier_only: bool,
    /// Also collect a question none of whose own rollouts succeeded but whose guided rollout
    /// did (any `solve.guidance`): its failures, with the guided success as the
    /// contrast a rule-based distiller learns from. These are the questions beyond the
    /// solver's frontier, so the skills they give are the ones it lacks. Off by default (SESA
    /// collects frontier questions only).
    #[serde(default)]
    pub guided: bool,
}

/// Collects failures for distillation.
pub struct Collect {
    config: CollectConfig,
}

/// A trajectory's digest for the judge: its searches and how it ended, within 400 characters.
fn digest(searches: &[String], outcome: &str, answer: Option<&str>) -> String {
    let searched = if searches.is_empty() {
        "no searches".to_string()
    } else {
        format!("searched {}", searches.iter().map(|q| format!("\"{q}\"")).collect::<Vec<_>>().join(", "))
    };
    let ended = match answer {
        Some(answer) => format!("answered \"{answer}\""),
        None => format!("ended without an answer ({outcome})"),
    };
    clean(&format!("{searched}; {ended}"), 400)
}

fn failures_batch(rows: &[(FailureRecord, f64)]) -> Result<RecordBatch, ArrowError> {
    Columns::default()
        .str("failure_id", rows.iter().map(|(f, _)| f.id.as_str()))
        .str("question", rows.iter().map(|(f, _)| f.question.as_str()))
        .str("target", rows.iter().map(|(f, _)| f.target.as_str()))
        .opt_str("predicted", rows.iter().map(|(f, _)| f.predicted.as_deref()))
        .strs("skill_ids", rows.iter().map(|(f, _)| f.skill_ids.iter().map(String::as_str)))
        .str("digest", rows.iter().map(|(f, _)| f.digest.as_str()))
        .strs("searches", rows.iter().map(|(f, _)| f.searches.iter().map(String::as_str)))
        .strs("solved_searches", rows.iter().map(|(f, _)| f.solved_searches.iter().map(String::as_str)))
        .f64("p_hat", rows.iter().map(|(_, p)| *p))
        .finish()
}

impl Stage for Collect {
    const KIND: &'static str = "collect";
    const ABOUT: &'static str = "failure records of frontier questions into the skill memory's pending queue";
    type Config = CollectConfig;

    fn new(config: CollectConfig) -> Result<Self, Vec<ConfigProblem>> {
        Ok(Collect { config })
    }

    fn inputs(&self) -> Vec<TableSpec> {
        vec![Solve::rollouts_table(), Reward::rewards_table()]
    }

    fn outputs(&self) -> Vec<TableSpec> {
        vec![TableSpec::new("failures", schema_of(|| failures_batch(&[]))), metrics_table()]
    }

    async fn run(&self, cx: &StageContext, inputs: Tables) -> Result<Tables, StageError> {
        let clock = Instant::now();
        let memory = cx
            .resource::<SkillMemory>()
            .map_err(|_| failed("collect", "the spec has no `memory:` section to collect failures into"))?;
        let rollouts_batch = inputs.get("rollouts")?;
        let rollouts = Reader::new("rollouts", rollouts_batch);
        let rewards_batch = inputs.get("rewards")?;
        let rewards = Reader::new("rewards", rewards_batch);
        let (roles, reward_values, p_hats) = (rewards.str("role")?, rewards.f64("reward")?, rewards.f64("p_hat")?);
        // `rewards` lists the solver rows first, in rollout order.
        let solver: Vec<usize> = (0..rewards.rows()).filter(|&i| roles[i] == "solver").collect();
        if solver.len() != rollouts.rows() {
            return Err(failed("collect", "the rewards do not match the rollouts"));
        }
        let items = rollouts.u64("item")?;
        let indices = rollouts.u64("rollout")?;
        let questions = rollouts.str("question")?;
        let targets = rollouts.str("target")?;
        let answers = rollouts.opt_str("answer")?;
        let skill_ids = rollouts.strs("skill_ids")?;
        let searches = rollouts.strs("searches")?;
        let outcomes = rollouts.str("outcome")?;
        let guided = rollouts.bool("guided")?;
        // Per question, the successful rollout with the fewest searches: the contrast a
        // rule-based distiller learns from.
        let mut solved: std::collections::BTreeMap<u64, &[String]> = std::collections::BTreeMap::new();
        for (i, &r) in solver.iter().enumerate() {
            if reward_values[r] > 0.0 {
                let best = solved.entry(items[i]).or_insert(&searches[i]);
                if searches[i].len() < best.len() {
                    *best = &searches[i];
                }
            }
        }
        let mut rows = Vec::new();
        for (i, &r) in solver.iter().enumerate() {
            let p = p_hats[r];
            let frontier = p > 0.0 && p < 1.0;
            let beyond = self.config.guided && p == 0.0 && solved.contains_key(&items[i]);
            if guided[i] || reward_values[r] > 0.0 || (self.config.frontier_only && !frontier && !beyond) {
                continue;
            }
            let record = FailureRecord {
                id: format!("f{}-{}-{}", cx.step(), items[i], indices[i]),
                question: questions[i].to_string(),
                target: targets[i].to_string(),
                predicted: answers[i].map(str::to_string),
                skill_ids: skill_ids[i].clone(),
                digest: digest(&searches[i], outcomes[i], answers[i]),
                searches: searches[i].clone(),
                solved_searches: solved.get(&items[i]).map_or_else(Vec::new, |s| s.to_vec()),
            };
            rows.push((record, p));
        }
        let mut queue = memory.queue.lock().expect("queue lock");
        for (record, _) in &rows {
            queue.push(record.clone());
        }
        let metrics = [
            ("collected", rows.len() as f64),
            ("queue_length", queue.len() as f64),
            ("queue_dropped", queue.dropped() as f64),
            ("wall_ms", elapsed_ms(clock)),
        ];
        drop(queue);
        Ok(Tables::new()
            .with("failures", failures_batch(&rows)?)
            .with("step_metrics", metrics_batch(cx.stage_name(), &metrics)?))
    }
}
