//! What a report reads of a run: its manifest and commits, its `step_metrics` as curves and
//! its `evals` rows. Read-only, through the engine's `read_table`.

use std::collections::BTreeMap;

use sesa_engine::columns::Reader;
use sesa_engine::manifest::{RunManifest, StepCommit, layout};
use sesa_engine::{ArtifactStore, read_table};

use crate::ReportError;

/// One question's evaluation.
#[derive(Debug, Clone)]
pub struct EvalRecord {
    /// The step that evaluated.
    pub step: u64,
    /// `base`, `memory_off` or `memory_on`.
    pub mode: String,
    /// The question set.
    pub benchmark: String,
    /// Exact match, 0 or 1.
    pub em: f64,
    /// Judge accuracy, 0 or 1, when a judge ruled.
    pub accuracy: Option<f64>,
    /// The policy version that answered.
    pub policy_version: u64,
    /// The bank version whose skills the solver saw (0: none).
    pub bank_version: u64,
}

/// A run as the report sees it.
#[derive(Debug, Clone)]
pub struct RunData {
    /// Where the run lives (`runs/<id>`, `s3://…/<id>`).
    pub location: String,
    /// Its manifest.
    pub manifest: RunManifest,
    /// The spec's `model.model`, when it has one.
    pub model: Option<String>,
    /// Whether the run only evaluates (as `sesa eval` makes): its stages are `evaluate` and at
    /// most a `priming`. Its step numbers are not training steps, so it has no curves.
    pub evaluation_only: bool,
    /// Wall time of its committed steps, in milliseconds.
    pub wall_ms: u64,
    /// `step_metrics`: metric → stage → step → value.
    pub metrics: BTreeMap<String, BTreeMap<String, BTreeMap<u64, f64>>>,
    /// Every `evals` row.
    pub evals: Vec<EvalRecord>,
}

impl RunData {
    /// Reads run `run_id` of the store at `root`.
    pub async fn load(root: &str, run_id: &str) -> Result<RunData, ReportError> {
        let location = format!("{}/{run_id}", root.trim_end_matches('/'));
        let store = ArtifactStore::open(root)?;
        let run = ArtifactStore::open(&location)?;
        let json = |key: &str| {
            let (run, key, location) = (&run, key.to_string(), location.clone());
            async move {
                let bytes = run.get(&key).await?.ok_or_else(|| ReportError::NotARun(location.clone()))?;
                Ok::<_, ReportError>(bytes)
            }
        };
        let manifest: RunManifest = serde_json::from_slice(&json(layout::MANIFEST).await?)
            .map_err(|e| ReportError::Corrupt(format!("{location}/{}: {e}", layout::MANIFEST)))?;
        let spec: serde_yaml::Value = match run.get(layout::SPEC).await? {
            Some(bytes) => serde_yaml::from_slice(&bytes).unwrap_or(serde_yaml::Value::Null),
            None => serde_yaml::Value::Null,
        };
        let model = spec.get("model").and_then(|m| m.get("model")).and_then(|m| m.as_str()).map(str::to_string);
        let kinds: Vec<&str> = spec
            .get("stages")
            .and_then(|s| s.as_mapping())
            .map(|stages| stages.values().filter_map(|s| s.get("kind").and_then(|k| k.as_str())).collect())
            .unwrap_or_default();
        let evaluation_only = kinds.contains(&"evaluate") && kinds.iter().all(|k| *k == "evaluate" || *k == "priming");
        let mut wall_ms = 0;
        for step in 1..=manifest.committed_steps {
            if let Some(bytes) = run.get(&layout::commit(step)).await? {
                let commit: StepCommit = serde_json::from_slice(&bytes)
                    .map_err(|e| ReportError::Corrupt(format!("{location}/{}: {e}", layout::commit(step))))?;
                wall_ms += commit.wall_ms;
            }
        }
        let corrupt = |table: &str, e: String| ReportError::Corrupt(format!("{location}: table `{table}`: {e}"));
        let mut metrics: BTreeMap<String, BTreeMap<String, BTreeMap<u64, f64>>> = BTreeMap::new();
        for (step, batch) in read_table(&store, run_id, "step_metrics").await? {
            let reader = Reader::new("step_metrics", &batch);
            let read = || {
                Ok::<_, sesa_engine::StageError>((reader.str("stage")?, reader.str("metric")?, reader.f64("value")?))
            };
            let (stages, names, values) = read().map_err(|e| corrupt("step_metrics", e.to_string()))?;
            for ((stage, metric), value) in stages.into_iter().zip(names).zip(values) {
                metrics
                    .entry(metric.to_string())
                    .or_default()
                    .entry(stage.to_string())
                    .or_default()
                    .insert(step, value);
            }
        }
        let mut evals = Vec::new();
        for (step, batch) in read_table(&store, run_id, "evals").await? {
            let reader = Reader::new("evals", &batch);
            let read = || {
                Ok::<_, sesa_engine::StageError>((
                    reader.str("mode")?,
                    reader.str("benchmark")?,
                    reader.f64("em")?,
                    reader.u64("policy_version")?,
                    reader.u64("bank_version")?,
                ))
            };
            let (modes, benchmarks, ems, policies, banks) = read().map_err(|e| corrupt("evals", e.to_string()))?;
            // Runs written before judge accuracy existed have no `accuracy` column.
            let accuracy =
                if batch.column_by_name("accuracy").is_some() { reader.opt_f64("accuracy").ok() } else { None };
            for i in 0..modes.len() {
                evals.push(EvalRecord {
                    step,
                    mode: modes[i].to_string(),
                    benchmark: benchmarks[i].to_string(),
                    em: ems[i],
                    accuracy: accuracy.as_ref().and_then(|a| a[i]),
                    policy_version: policies[i],
                    bank_version: banks[i],
                });
            }
        }
        Ok(RunData { location, manifest, model, evaluation_only, wall_ms, metrics, evals })
    }

    /// A metric per step. Where several stages report it in a step (the bank's size after
    /// `reward` and after `consolidate`), the value after the step's last change counts:
    /// `consolidate`'s, then any other stage's.
    pub fn curve(&self, metric: &str) -> Vec<(u64, f64)> {
        let Some(stages) = self.metrics.get(metric) else { return Vec::new() };
        let mut by_step: BTreeMap<u64, f64> = BTreeMap::new();
        for values in stages.iter().filter(|(stage, _)| stage.as_str() != "consolidate").map(|(_, v)| v) {
            by_step.extend(values.iter().map(|(&s, &v)| (s, v)));
        }
        if let Some(values) = stages.get("consolidate") {
            by_step.extend(values.iter().map(|(&s, &v)| (s, v)));
        }
        by_step.into_iter().collect()
    }

    /// The modes this run evaluated.
    pub fn modes(&self) -> Vec<&str> {
        let mut modes: Vec<&str> = self.evals.iter().map(|e| e.mode.as_str()).collect();
        modes.sort_unstable();
        modes.dedup();
        modes
    }
}

/// A benchmark's score over its questions: judge accuracy where every answer was judged,
/// else exact match (and the report says which).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Score {
    /// In [0, 1].
    pub value: f64,
    /// Whether it is judge accuracy (else exact match).
    pub judged: bool,
    /// Questions.
    pub questions: usize,
}

/// Scores per benchmark of `records`.
pub fn scores<'a>(records: impl IntoIterator<Item = &'a EvalRecord>) -> BTreeMap<String, Score> {
    let mut grouped: BTreeMap<String, Vec<&EvalRecord>> = BTreeMap::new();
    for record in records {
        grouped.entry(record.benchmark.clone()).or_default().push(record);
    }
    grouped
        .into_iter()
        .map(|(benchmark, rows)| {
            let judged = rows.iter().all(|r| r.accuracy.is_some());
            let sum: f64 = rows.iter().map(|r| if judged { r.accuracy.unwrap_or(0.0) } else { r.em }).sum();
            (benchmark, Score { value: sum / rows.len() as f64, judged, questions: rows.len() })
        })
        .collect()
}

/// The unweighted mean over benchmarks, as the paper averages.
pub fn average(scores: &BTreeMap<String, Score>) -> Option<f64> {
    (!scores.is_empty()).then(|| scores.values().map(|s| s.value).sum::<f64>() / scores.len() as f64)
}
