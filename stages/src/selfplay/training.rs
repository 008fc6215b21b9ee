//! The run's trainer as a resource: the `trainer:` section, the model being trained (loaded on
//! the first training stage), its policy versions, and the checkpoint tables that make
//! training resumable.
//!
//! A policy version is an artifact like a skill version: every training stage run makes one,
//! written as a row of `policy_versions` and as a `checkpoints` table (one row per tensor: the
//! trained weights, or the LoRA adapters, and AdamW's moments), committed with the step like
//! any table. Resume rebuilds the trainer from the last checkpoint and serves its weights
//! again, so a resumed run ends with the weights of an uninterrupted one.

use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ArtifactStore, ConfigProblem, RunError, Section, StageError, TableSpec, read_table};
use sha2::{Digest, Sha256};

use crate::columns::{Columns, Reader, schema_of};
use crate::policy::Policy;
use crate::train::{Method, TrainModel, Trainer, new_adapters};
use crate::weights::LlamaWeights;

/// The `trainer:` section: what is trained and how much memory a micro-batch may take.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TrainerSection {
    /// Full fine-tuning (`{kind: full}`, the default) or LoRA (`{kind: lora, rank, alpha,
    /// targets}`).
    #[serde(default = "full")]
    pub method: Method,
    /// Tokens per micro-batch at most; gradients of micro-batches accumulate into one
    /// optimizer step. Activations take about 1 MB per token for SmolLM2-135M.
    #[serde(default = "micro_batch_tokens")]
    pub micro_batch_tokens: usize,
}

fn full() -> Method {
    Method::Full
}

fn micro_batch_tokens() -> usize {
    2048
}

impl Default for TrainerSection {
    fn default() -> Self {
        TrainerSection { method: Method::Full, micro_batch_tokens: micro_batch_tokens() }
    }
}

impl Section for TrainerSection {
    const KEY: &'static str = "trainer";

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems: Vec<ConfigProblem> = self
            .method
            .problems()
            .into_iter()
            .map(|(key, message)| ConfigProblem::new(format!("method.{key}"), message))
            .collect();
        if self.micro_batch_tokens == 0 {
            problems.push(ConfigProblem::new("micro_batch_tokens", "must be at least 1"));
        }
        problems
    }
}

/// The trainer and the version of the weights it holds.
pub struct TrainState {
    /// The model and its optimizer.
    pub trainer: Trainer,
    /// The policy version of the trainer's weights (0: as loaded).
    pub version: u64,
    /// Tokens trained on so far, over all versions.
    pub tokens_trained: u64,
}

/// The run's training resource.
pub struct Training {
    /// The section.
    pub section: TrainerSection,
    /// Where the initial weights are read from.
    source: PathBuf,
    /// Loaded on first use: most runs never train.
    state: tokio::sync::Mutex<Option<TrainState>>,
}

impl Training {
    /// Training of the weights of the model at `source` (a GGUF file or a Hugging Face
    /// directory).
    pub fn new(section: TrainerSection, source: PathBuf) -> Training {
        Training { section, source, state: tokio::sync::Mutex::new(None) }
    }

    fn initial(&self) -> Result<TrainModel, String> {
        let weights = crate::policy::ModelFiles::read(&self.source)?.weights;
        let mut model = TrainModel::new(weights);
        if let Method::Lora { rank, alpha, targets } = &self.section.method {
            model.adapters = Some(new_adapters(&model.weights, *rank, *alpha, targets, 0));
        }
        Ok(model)
    }

    /// The trainer state, loading the initial weights on first use; the caller puts it back
    /// with [`Self::put`].
    pub async fn take(self: &Arc<Self>) -> Result<TrainState, StageError> {
        let mut guard = self.state.lock().await;
        if let Some(state) = guard.take() {
            return Ok(state);
        }
        let this = self.clone();
        let model = tokio::task::spawn_blocking(move || this.initial())
            .await
            .map_err(|e| StageError::Failed(e.to_string()))?
            .map_err(StageError::Failed)?;
        Ok(TrainState { trainer: Trainer::new(model, self.section.micro_batch_tokens), version: 0, tokens_trained: 0 })
    }

    /// Puts the state back after a training stage.
    pub async fn put(&self, state: TrainState) {
        *self.state.lock().await = Some(state);
    }

    /// Rebuilds the trainer from the run's last checkpoint, if any, and has `policy` serve its
    /// weights.
    pub async fn restore(
        self: &Arc<Self>,
        root: &ArtifactStore,
        run_id: &str,
        policy: &dyn Policy,
    ) -> Result<(), RunError> {
        let corrupt = |reason: String| RunError::Corrupt { location: format!("run {run_id}: checkpoints"), reason };
        let Some(batch) = read_table(root, run_id, "checkpoints").await?.into_iter().map(|(_, b)| b).last() else {
            return Ok(());
        };
        let checkpoint = Checkpoint::read(&batch).map_err(|e| corrupt(e.to_string()))?;
        let mut state = self.take().await.map_err(|e| corrupt(e.to_string()))?;
        checkpoint.apply(&mut state).map_err(corrupt)?;
        let weights = state.trainer.model.serving_weights();
        let version = state.version;
        policy.load_weights(&weights, version).map_err(|e| corrupt(e.to_string()))?;
        self.put(state).await;
        Ok(())
    }
}

/// The `policy_versions` table: one row per version a training stage made.
pub fn policy_versions_batch(rows: &[PolicyVersion]) -> Result<RecordBatch, ArrowError> {
    Columns::default()
        .u64("version", rows.iter().map(|r| r.version))
        .u64("parent_version", rows.iter().map(|r| r.parent))
        .str("stage", rows.iter().map(|r| r.stage.as_str()))
        .str("method", rows.iter().map(|r| r.method.as_str()))
        .str("checkpoint", rows.iter().map(|r| r.checkpoint.as_str()))
        .str("sha256", rows.iter().map(|r| r.sha256.as_str()))
        .u64("checkpoint_bytes", rows.iter().map(|r| r.bytes))
        .u64("tokens_trained", rows.iter().map(|r| r.tokens_trained))
        .finish()
}

/// A row of `policy_versions`.
pub struct PolicyVersion {
    /// This version.
    pub version: u64,
    /// The version it was trained from.
    pub parent: u64,
    /// The stage that made it.
    pub stage: String,
    /// `full` or `lora`.
    pub method: String,
    /// Where its tensors are: the `checkpoints` table's partition of this step (deleted
    /// once superseded, when the stage keeps only some checkpoints).
    pub checkpoint: String,
    /// SHA-256 of the tensors' bytes, in table order.
    pub sha256: String,
    /// Bytes of tensors.
    pub bytes: u64,
    /// Tokens trained on over all versions up to this one.
    pub tokens_trained: u64,
}

/// The `policy_versions` table's spec.
pub fn policy_versions_table() -> TableSpec {
    TableSpec::new("policy_versions", schema_of(|| policy_versions_batch(&[])))
}

/// The `checkpoints` table's spec.
pub fn checkpoints_table() -> TableSpec {
    TableSpec::new("checkpoints", schema_of(|| Checkpoint::default().batch()))
}

/// The tensors of one policy version: what is trained and the optimizer's moments.
#[derive(Debug, Default)]
pub struct Checkpoint {
    /// The version.
    pub version: u64,
    /// AdamW's step count.
    pub adam_step: u64,
    /// Tokens trained on over all versions up to this one.
    pub tokens_trained: u64,
    /// (name, values) of every tensor: `weights.N` or `adapters.N`, `adam_m.N`, `adam_v.N`.
    pub tensors: Vec<(String, Vec<f32>)>,
}

impl Checkpoint {
    /// The checkpoint of `state`.
    pub fn of(state: &TrainState) -> Checkpoint {
        let model = &state.trainer.model;
        let kind = if model.adapters.is_some() { "adapters" } else { "weights" };
        let mut tensors: Vec<(String, Vec<f32>)> =
            model.trained().into_iter().enumerate().map(|(i, t)| (format!("{kind}.{i}"), t.clone())).collect();
        let adam = &state.trainer.adam;
        tensors.extend(adam.m.iter().enumerate().map(|(i, t)| (format!("adam_m.{i}"), t.clone())));
        tensors.extend(adam.v.iter().enumerate().map(|(i, t)| (format!("adam_v.{i}"), t.clone())));
        Checkpoint { version: state.version, adam_step: adam.step, tokens_trained: state.tokens_trained, tensors }
    }

    fn bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// SHA-256 of the tensors' bytes and their total size.
    pub fn digest(&self) -> (String, u64) {
        let mut hasher = Sha256::new();
        let mut total = 0;
        for (_, values) in &self.tensors {
            let bytes = Self::bytes(values);
            total += bytes.len() as u64;
            hasher.update(&bytes);
        }
        (format!("{:x}", hasher.finalize()), total)
    }

    /// As a table.
    pub fn batch(&self) -> Result<RecordBatch, ArrowError> {
        let bytes: Vec<Vec<u8>> = self.tensors.iter().map(|(_, v)| Self::bytes(v)).collect();
        Columns::default()
            .u64("version", self.tensors.iter().map(|_| self.version))
            .u64("adam_step", self.tensors.iter().map(|_| self.adam_step))
            .u64("tokens_trained", self.tensors.iter().map(|_| self.tokens_trained))
            .str("tensor", self.tensors.iter().map(|(n, _)| n.as_str()))
            .bytes("values", bytes.iter().map(Vec::as_slice))
            .finish()
    }

    /// From a table.
    pub fn read(batch: &RecordBatch) -> Result<Checkpoint, StageError> {
        let reader = Reader::new("checkpoints", batch);
        let versions = reader.u64("version")?;
        let steps = reader.u64("adam_step")?;
        let tokens = reader.u64("tokens_trained")?;
        let names = reader.str("tensor")?;
        let values = reader.bytes("values")?;
        let tensors = names
            .iter()
            .zip(values)
            .map(|(name, bytes)| {
                let floats = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
                (name.to_string(), floats)
            })
            .collect();
        Ok(Checkpoint {
            version: versions.first().copied().unwrap_or(0),
            adam_step: steps.first().copied().unwrap_or(0),
            tokens_trained: tokens.first().copied().unwrap_or(0),
            tensors,
        })
    }

    /// Puts the checkpoint's tensors into `state` (shapes checked).
    pub fn apply(self, state: &mut TrainState) -> Result<(), String> {
        let trainer = &mut state.trainer;
        let count = trainer.adam.m.len();
        if self.tensors.len() != 3 * count {
            return Err(format!(
                "{} tensors, expected {} for this trainer (another method or model?)",
                self.tensors.len(),
                3 * count
            ));
        }
        let mut tensors = self.tensors.into_iter().map(|(_, v)| v);
        let targets: Vec<&mut Vec<f32>> = trainer.model.trained_mut();
        for target in targets {
            let values = tensors.next().expect("counted");
            if values.len() != target.len() {
                return Err(format!("a tensor of {} values where {} are trained", values.len(), target.len()));
            }
            *target = values;
        }
        for moment in trainer.adam.m.iter_mut().chain(trainer.adam.v.iter_mut()) {
            let values = tensors.next().expect("counted");
            if values.len() != moment.len() {
                return Err(format!("an optimizer moment of {} values, expected {}", values.len(), moment.len()));
            }
            *moment = values;
        }
        trainer.adam.step = self.adam_step;
        state.version = self.version;
        state.tokens_trained = self.tokens_trained;
        Ok(())
    }
}

/// Restores the weights of `version` (the last one when `None`) from a run's checkpoints
/// into a model built from `initial` as `method` says: what `sesa model export` serves.
pub async fn weights_at(
    root: &ArtifactStore,
    run_id: &str,
    version: Option<u64>,
    initial: LlamaWeights,
    method: &Method,
) -> Result<(u64, LlamaWeights), RunError> {
    let corrupt = |reason: String| RunError::Corrupt { location: format!("run {run_id}: checkpoints"), reason };
    let batches = read_table(root, run_id, "checkpoints").await?;
    let mut found = None;
    for (_, batch) in batches {
        let checkpoint = Checkpoint::read(&batch).map_err(|e| corrupt(e.to_string()))?;
        if version.is_none_or(|v| v == checkpoint.version) {
            found = Some(checkpoint);
        }
    }
    let Some(checkpoint) = found else {
        return Err(corrupt(match version {
            Some(v) => format!(
                "no policy version {v}: see the `policy_versions` table (a stage's `keep_every` may have \
                 deleted its checkpoint)"
            ),
            None => "the run has trained no policy version".into(),
        }));
    };
    let mut model = TrainModel::new(initial);
    if let Method::Lora { rank, alpha, targets } = method {
        model.adapters = Some(new_adapters(&model.weights, *rank, *alpha, targets, 0));
    }
    let mut state = TrainState { trainer: Trainer::new(model, 1), version: 0, tokens_trained: 0 };
    checkpoint.apply(&mut state).map_err(corrupt)?;
    Ok((state.version, state.trainer.model.serving_weights()))
}
