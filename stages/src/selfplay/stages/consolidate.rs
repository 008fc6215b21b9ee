//! `consolidate`: when the pending queue holds enough failures, a judge (or, with
//! `distiller: rules`, rule-based induction) distils them into candidate skills, which are
//! deduplicated against the bank and admitted; harmful skills are evicted; the bank gets a new
//! version.

use std::time::Instant;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, Stage, StageContext, StageError, TableSpec, Tables};

use super::{elapsed_ms, failed, metrics_batch, metrics_table, skill_events_table, skills_table};
use crate::memory::{
    Distiller, FailureRecord, Induction, SkillEvent, SkillEventKind, SkillMeta, events_batch, induce_batch,
    skills_batch,
};
use crate::sections::MAX_TOKENS;
use crate::selfplay::resources::{SelfPlay, SkillMemory, Templates};
use sesa_engine::columns::{Columns, schema_of};
use sesa_models::policy::Sampling;

/// The config of `consolidate`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsolidateConfig {
    /// Queued failures needed to distil (paper: 20).
    #[serde(default = "twenty")]
    pub min_failures: usize,
    /// Failures per judge call.
    #[serde(default = "ten")]
    pub batch: usize,
    /// Skills per judge call at most.
    #[serde(default = "three")]
    pub max_skills: usize,
    /// Tokens per judge call at most.
    #[serde(default = "tokens")]
    pub max_tokens: usize,
    /// Who distils: `judge` (the paper's way: the judge model, else the policy, with the
    /// `distill` prompt), `rules` (no model: each question's failures contrasted with a
    /// successful rollout of it, see `memory::induce`) or `episodic` (no model: the successful
    /// rollout kept as it was, question and searches).
    #[serde(default)]
    pub distiller: DistillerKind,
}

/// Who turns failures into skills.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DistillerKind {
    /// A model with the `distill` prompt.
    #[default]
    Judge,
    /// Rule-based induction, no model.
    Rules,
    /// Raw successful trajectories as exemplars, no model.
    Episodic,
}

impl DistillerKind {
    /// How skills are induced without a model; `None` for the judge.
    fn induction(self) -> Option<Induction> {
        match self {
            DistillerKind::Judge => None,
            DistillerKind::Rules => Some(Induction::Rules),
            DistillerKind::Episodic => Some(Induction::Episodic),
        }
    }
}

fn twenty() -> usize {
    20
}
fn ten() -> usize {
    10
}
fn three() -> usize {
    3
}
fn tokens() -> usize {
    768
}

/// Distils, deduplicates, evicts.
pub struct Consolidate {
    config: ConsolidateConfig,
}

/// What one consolidation did, a row of `consolidations` (also how a resumed run knows which
/// failures left the queue).
struct Consolidation {
    failure_ids: Vec<String>,
    candidates: u64,
    added: u64,
    duplicates: u64,
    malformed: u64,
    /// Candidates that quoted an answer of their source failures.
    leaked: u64,
    evicted: u64,
}

fn consolidations_batch(rows: &[Consolidation]) -> Result<RecordBatch, ArrowError> {
    Columns::default()
        .strs("failure_ids", rows.iter().map(|r| r.failure_ids.iter().map(String::as_str)))
        .u64("candidates", rows.iter().map(|r| r.candidates))
        .u64("added", rows.iter().map(|r| r.added))
        .u64("duplicates", rows.iter().map(|r| r.duplicates))
        .u64("malformed", rows.iter().map(|r| r.malformed))
        .u64("leaked", rows.iter().map(|r| r.leaked))
        .u64("evicted", rows.iter().map(|r| r.evicted))
        .finish()
}

impl Stage for Consolidate {
    const KIND: &'static str = "consolidate";
    const ABOUT: &'static str =
        "distil queued failures into skills (a judge, or rules), deduplicate, evict; a new bank version";
    type Config = ConsolidateConfig;

    fn new(config: ConsolidateConfig) -> Result<Self, Vec<ConfigProblem>> {
        let problems: Vec<ConfigProblem> = [
            ConfigProblem::size("batch", config.batch, 1..=100_000),
            ConfigProblem::size("max_skills", config.max_skills, 1..=100_000),
            ConfigProblem::size("max_tokens", config.max_tokens, 1..=MAX_TOKENS),
        ]
        .into_iter()
        .flatten()
        .collect();
        if problems.is_empty() { Ok(Consolidate { config }) } else { Err(problems) }
    }

    fn outputs(&self) -> Vec<TableSpec> {
        vec![
            skills_table(),
            skill_events_table(),
            TableSpec::new("consolidations", schema_of(|| consolidations_batch(&[]))),
            metrics_table(),
        ]
    }

    async fn run(&self, cx: &StageContext, _inputs: Tables) -> Result<Tables, StageError> {
        let clock = Instant::now();
        let selfplay = cx.resource::<SelfPlay>()?;
        let memory = cx
            .resource::<SkillMemory>()
            .map_err(|_| failed("consolidate", "the spec has no `memory:` section to consolidate into"))?;
        let queued: Vec<FailureRecord> = memory.queue.lock().expect("queue lock").records().cloned().collect();
        let mut tables = Tables::new();
        let mut events: Vec<SkillEvent> = Vec::new();
        let mut consolidations = Vec::new();
        let mut snapshot = skills_batch(0, &[])?;
        let mut version = memory.bank.lock().expect("bank lock").version();
        let mut generation_ms = 0.0;
        if queued.len() >= self.config.min_failures && !queued.is_empty() {
            let batches: Vec<&[FailureRecord]> = queued.chunks(self.config.batch).collect();
            let generation = Instant::now();
            let distilled = match self.config.distiller.induction() {
                None => {
                    let distiller = Distiller {
                        policy: selfplay.judge_or_policy(),
                        template: Templates::require(&selfplay.templates.distill, "distill")?,
                        max_skills: self.config.max_skills,
                        max_tokens: self.config.max_tokens,
                        sampling: Sampling::GREEDY,
                    };
                    let seeds: Vec<u64> = (0..batches.len() as u64).map(|b| cx.seed(b)).collect();
                    distiller.distill(&batches, &seeds).await.map_err(|e| failed("distillation", e))?
                }
                Some(how) => batches.iter().map(|b| induce_batch(b, self.config.max_skills, how)).collect(),
            };
            generation_ms = elapsed_ms(generation);
            let mut record = Consolidation {
                failure_ids: queued.iter().map(|f| f.id.clone()).collect(),
                candidates: 0,
                added: 0,
                duplicates: 0,
                malformed: 0,
                leaked: 0,
                evicted: 0,
            };
            let mut bank = memory.bank.lock().expect("bank lock");
            let mut n = 0;
            for (batch, out) in batches.iter().zip(&distilled) {
                for reason in &out.malformed {
                    record.malformed += 1;
                    events.push(SkillEvent::new(
                        SkillEventKind::Rejected,
                        format!("s{}-{n}", cx.step()),
                        String::new(),
                        match self.config.distiller.induction() {
                            None => format!("malformed judge output: {reason}"),
                            Some(_) => format!("no skill induced: {reason}"),
                        },
                    ));
                    n += 1;
                }
                let texts: Vec<String> = out.candidates.iter().map(|c| c.embedding_text()).collect();
                let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                let vectors = memory.embedder.embed(&refs).map_err(|e| failed("embedding candidates", e))?;
                let answers: Vec<&str> = batch.iter().map(|f| f.target.as_str()).collect();
                for (candidate, vector) in out.candidates.iter().zip(vectors) {
                    record.candidates += 1;
                    if let Some(answer) = candidate.quoted_answer(&answers) {
                        record.leaked += 1;
                        events.push(SkillEvent::new(
                            SkillEventKind::Rejected,
                            format!("s{}-{n}", cx.step()),
                            candidate.description.clone(),
                            format!("quotes `{answer}`, the answer of a failure it was distilled from"),
                        ));
                        n += 1;
                        continue;
                    }
                    let meta = SkillMeta {
                        origin_step: cx.step(),
                        origin_failures: batch.iter().map(|f| f.id.clone()).collect(),
                        ..SkillMeta::default()
                    };
                    let admitted = bank.admit(format!("s{}-{n}", cx.step()), candidate.clone(), meta, vector);
                    n += 1;
                    for event in admitted {
                        match event.kind {
                            SkillEventKind::Added => record.added += 1,
                            SkillEventKind::RejectedDuplicate => record.duplicates += 1,
                            SkillEventKind::Evicted => record.evicted += 1,
                            _ => {}
                        }
                        events.push(event);
                    }
                }
            }
            let evicted = bank.evict_harmful();
            record.evicted += evicted.len() as u64;
            events.extend(evicted);
            if let Some(new_version) = bank.commit() {
                version = new_version;
                snapshot = skills_batch(new_version, bank.skills())?;
            }
            memory.queue.lock().expect("queue lock").remove(&record.failure_ids);
            consolidations.push(record);
        }
        let bank_size = memory.bank.lock().expect("bank lock").len();
        let metrics = [
            ("distilled", f64::from(!consolidations.is_empty() as u8)),
            ("skills_added", consolidations.iter().map(|c| c.added as f64).sum()),
            ("skills_rejected", consolidations.iter().map(|c| (c.duplicates + c.malformed + c.leaked) as f64).sum()),
            ("skills_evicted", consolidations.iter().map(|c| c.evicted as f64).sum()),
            ("bank_size", bank_size as f64),
            ("queue_length", memory.queue.lock().expect("queue lock").len() as f64),
            ("generation_ms", generation_ms),
            ("wall_ms", elapsed_ms(clock)),
        ];
        tables.insert("skills", snapshot);
        tables.insert("skill_events", events_batch(version, &events)?);
        tables.insert("consolidations", consolidations_batch(&consolidations)?);
        tables.insert("step_metrics", metrics_batch(cx.stage_name(), &metrics)?);
        Ok(tables)
    }
}
