//! One step: the active stages run as a DAG, their outputs staged, then one commit record.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use arrow_array::RecordBatch;
use sha2::{Digest, Sha256};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::{RunError, canonical_json, hex};
use crate::manifest::{CommittedFile, InputRecord, StageRecord, StepCommit, layout, now};
use crate::plan::Pipeline;
use crate::progress::Progress;
use crate::resources::Resources;
use crate::stage::{StageContext, Tables};
use crate::store::ArtifactStore;
use crate::table::{decode_parquet, describe_schema, encode_parquet, matches_schema};

/// Everything a step needs, owned, so its tasks can run on any tokio worker.
pub(super) struct StepJob {
    pub(super) step: u64,
    pub(super) store: ArtifactStore,
    pub(super) pipeline: Arc<Pipeline>,
    pub(super) resources: Arc<Resources>,
    pub(super) progress: Progress,
    /// For each table, the step and fingerprint of its latest committed version.
    pub(super) latest: HashMap<String, (u64, String)>,
}

/// What a finished stage hands to the step.
struct StageDone {
    index: usize,
    outputs: Tables,
    record: StageRecord,
    files: Vec<CommittedFile>,
}

/// Runs the active stages of `job.step`, stages their outputs, writes the commit record and
/// returns it. The caller publishes. Dropping the future aborts every stage still running.
pub(super) async fn run_step(job: StepJob) -> Result<StepCommit, RunError> {
    let job = Arc::new(job);
    let started_at = now();
    let clock = Instant::now();
    let active = job.pipeline.active(job.step);
    let mut waiting: BTreeMap<usize, Vec<usize>> =
        active.iter().map(|&i| (i, job.pipeline.active_dependencies(i, job.step))).collect();
    let mut done: HashMap<usize, (Tables, String)> = HashMap::new();
    let mut records = BTreeMap::new();
    let mut files = Vec::new();
    let mut tasks: JoinSet<Result<StageDone, RunError>> = JoinSet::new();
    loop {
        let ready: Vec<usize> =
            waiting.iter().filter(|(_, deps)| deps.iter().all(|d| done.contains_key(d))).map(|(&i, _)| i).collect();
        for index in ready {
            waiting.remove(&index);
            let inputs = this_step_inputs(&job, index, &done);
            let job = job.clone();
            let stage = &job.pipeline.spec().stages[index];
            let span = tracing::info_span!("stage", stage = %stage.name, kind = %stage.kind);
            tasks.spawn(run_stage(job.clone(), index, inputs).instrument(span));
        }
        let Some(joined) = tasks.join_next().await else {
            break;
        };
        let finished =
            joined.map_err(|e| RunError::Internal(format!("a stage task panicked or was cancelled: {e}")))??;
        let name = job.pipeline.spec().stages[finished.index].name.clone();
        files.extend(finished.files);
        done.insert(finished.index, (finished.outputs, finished.record.fingerprint.clone()));
        records.insert(name, finished.record);
    }
    if !waiting.is_empty() {
        return Err(RunError::Internal("stages left waiting after the step drained (a bug in the planner)".into()));
    }
    files.sort_by(|a, b| a.table.cmp(&b.table));
    let commit = StepCommit {
        step: job.step,
        started_at,
        committed_at: now(),
        wall_ms: clock.elapsed().as_millis() as u64,
        stages: records,
        files,
    };
    let json = serde_json::to_vec_pretty(&commit).map_err(|e| RunError::Internal(e.to_string()))?;
    // Created only if absent: of two writers on one run, only one can commit a step.
    if !job.store.create(&layout::commit(job.step), json.into()).await? {
        return Err(RunError::StepTaken { location: job.store.describe(""), step: job.step });
    }
    Ok(commit)
}

/// The inputs of stage `index` that stages of this step produced: (table, batch, fingerprint).
fn this_step_inputs(
    job: &StepJob,
    index: usize,
    done: &HashMap<usize, (Tables, String)>,
) -> Vec<(String, RecordBatch, InputRecord)> {
    let mut inputs = Vec::new();
    for table in job.pipeline.inputs(index) {
        let Some(writer) = job.pipeline.writer(&table.name) else {
            continue;
        };
        if let Some((tables, fingerprint)) = done.get(&writer)
            && let Ok(batch) = tables.get(&table.name)
        {
            let record = InputRecord { step: job.step, fingerprint: fingerprint.clone() };
            inputs.push((table.name.clone(), batch.clone(), record));
        }
    }
    inputs
}

async fn run_stage(
    job: Arc<StepJob>,
    index: usize,
    fresh: Vec<(String, RecordBatch, InputRecord)>,
) -> Result<StageDone, RunError> {
    let clock = Instant::now();
    let instance = &job.pipeline.spec().stages[index];
    let mut inputs = Tables::new();
    let mut input_records = BTreeMap::new();
    for (table, batch, record) in fresh {
        inputs.insert(table.clone(), batch);
        input_records.insert(table, record);
    }
    for table in job.pipeline.inputs(index) {
        if input_records.contains_key(&table.name) {
            continue;
        }
        let writer = job.pipeline.writer(&table.name).expect("the plan checked every input has a writer");
        let Some((step, fingerprint)) = job.latest.get(&table.name) else {
            let writer = &job.pipeline.spec().stages[writer];
            return Err(RunError::InputNotReady {
                stage: instance.name.clone(),
                step: job.step,
                table: table.name.clone(),
                writer: writer.name.clone(),
                schedule: writer.schedule.to_string(),
            });
        };
        let key = layout::table(&table.name, *step, &job.pipeline.spec().stages[writer].name);
        let bytes = job.store.get(&key).await?.ok_or_else(|| RunError::Corrupt {
            location: job.store.describe(&key),
            reason: "committed but missing".into(),
        })?;
        let batch = tokio::task::spawn_blocking(move || decode_parquet(bytes))
            .await
            .map_err(|e| RunError::Internal(e.to_string()))?
            .map_err(|e| RunError::Corrupt { location: job.store.describe(&key), reason: e.to_string() })?;
        inputs.insert(table.name.clone(), batch);
        input_records.insert(table.name.clone(), InputRecord { step: *step, fingerprint: fingerprint.clone() });
    }

    let spec = job.pipeline.spec();
    let context = StageContext {
        step: job.step,
        steps: spec.steps,
        stage: instance.name.as_str().into(),
        run_seed: spec.seed,
        resources: job.resources.clone(),
        progress: job.progress.clone(),
    };
    let fingerprint =
        fingerprint(instance.kind.as_str(), &instance.config, spec.seed, job.step, &instance.name, &input_records);
    let outputs = instance.stage.run(&context, inputs).await.map_err(|error| RunError::Stage {
        stage: instance.name.clone(),
        step: job.step,
        error,
    })?;

    let declared = job.pipeline.outputs(index);
    for (table, _) in outputs.iter() {
        if !declared.iter().any(|d| d.name == table) {
            return Err(RunError::UndeclaredOutput { stage: instance.name.clone(), table: table.to_string() });
        }
    }
    let mut rows = BTreeMap::new();
    let mut files = Vec::new();
    for table in declared {
        let batch = outputs
            .get(&table.name)
            .map_err(|_| RunError::MissingOutput { stage: instance.name.clone(), table: table.name.clone() })?;
        if !matches_schema(batch, &table.schema) {
            return Err(RunError::Schema {
                stage: instance.name.clone(),
                table: table.name.clone(),
                expected: describe_schema(&table.schema),
                found: describe_schema(&batch.schema()),
            });
        }
        let batch_for_encoding = batch.clone();
        let encoded = tokio::task::spawn_blocking(move || encode_parquet(&batch_for_encoding))
            .await
            .map_err(|e| RunError::Internal(e.to_string()))?
            .map_err(|e| RunError::Internal(format!("encoding table `{}` as Parquet: {e}", table.name)))?;
        let staging = layout::staging(&table.name, job.step, &instance.name);
        let bytes = encoded.len() as u64;
        job.store.put(&staging, encoded).await?;
        rows.insert(table.name.clone(), batch.num_rows() as u64);
        // The table's previous version goes unless its step is one to keep.
        let supersedes = match (table.keep_every, job.latest.get(&table.name)) {
            (Some(every), Some((previous, _))) if previous % every != 0 => {
                vec![layout::table(&table.name, *previous, &instance.name)]
            }
            _ => Vec::new(),
        };
        files.push(CommittedFile {
            table: table.name.clone(),
            staging,
            path: layout::table(&table.name, job.step, &instance.name),
            rows: batch.num_rows() as u64,
            bytes,
            fingerprint: fingerprint.clone(),
            supersedes,
        });
    }
    let wall_ms = clock.elapsed().as_millis() as u64;
    tracing::info!(rows = rows.values().sum::<u64>(), wall_ms, "stage finished");
    let record = StageRecord { kind: instance.kind.clone(), fingerprint, inputs: input_records, rows, wall_ms };
    Ok(StageDone { index, outputs, record, files })
}

/// What determines a deterministic stage's output: its kind and config, the seed and step
/// (through which its randomness is derived), its name (part of the seed) and its inputs.
fn fingerprint(
    kind: &str,
    config: &serde_json::Value,
    seed: u64,
    step: u64,
    stage: &str,
    inputs: &BTreeMap<String, InputRecord>,
) -> String {
    let mut hasher = Sha256::new();
    for part in [kind, &canonical_json(config), &seed.to_string(), &step.to_string(), stage] {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    for (table, input) in inputs {
        hasher.update(table.as_bytes());
        hasher.update(input.fingerprint.as_bytes());
    }
    hex(&hasher.finalize())
}

/// Deletes whatever a failed or abandoned step staged. Best effort: resume sweeps it too.
pub(super) async fn discard_staging(store: &ArtifactStore, step: u64) {
    let prefix = layout::staging_step_prefix(step);
    if let Ok(keys) = store.list(layout::STAGING).await {
        for key in keys.into_iter().filter(|key| key.starts_with(&prefix)) {
            let _ = store.delete(&key).await;
        }
    }
}
