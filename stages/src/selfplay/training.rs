//! The run's trainer as a resource: the `trainer:` section, the model being trained (loaded on
//! the first training stage), its policy versions, and the checkpoint tables that make
//! training resumable.
//!
//! A policy version is an artifact like a skill version: every training stage run makes one,
//! written as a row of `policy_versions` and as a `checkpoints` table (one row per tensor: the
//! trained weights, or the LoRA adapters, and AdamW's moments), committed with the step like
//! any table. Resume rebuilds the trainer from the last checkpoint and serves its weights
//! again, so a resumed run ends with the weights of an uninterrupted one.
//!
//! A run trains one model, or two when the spec gives the proposer its own
//! (`proposer_model:`): each has its own trainer, optimizer and version count, and the
//! `model` column of both tables says whose weights a row holds.

use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::builder::LargeBinaryBuilder;
use arrow_array::{LargeBinaryArray, RecordBatch};
use arrow_schema::ArrowError;
use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{
    ArtifactStore, ConfigProblem, RunError, Section, StageError, Steps, TableSpec, read_table, read_table_steps,
};
use sha2::{Digest, Sha256};

use crate::agent::Role;
use crate::sections::MAX_TOKENS;
use sesa_engine::columns::{Columns, Reader, schema_of};
use sesa_models::policy::Policy;
use sesa_models::train::{LoraMethod, Method, TrainModel, Trainer, new_adapters};
use sesa_models::weights::LlamaWeights;

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
        problems.extend(ConfigProblem::size("micro_batch_tokens", self.micro_batch_tokens, 1..=MAX_TOKENS));
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
    /// The stage whose objective the optimizer's moments were gathered on: another stage
    /// starts from fresh moments (a warm start's second moments would scale RL's steps down
    /// for a thousand steps).
    pub optimizer_stage: String,
    /// The proposer's running-mean reward baseline, once an update has set it.
    pub proposer_baseline: Option<f64>,
    /// The frozen initial weights, the KL reference of full fine-tuning (loaded on first use;
    /// LoRA's reference is its base weights).
    pub reference: Option<TrainModel>,
}

impl TrainState {
    /// Readies the optimizer for `stage`: fresh moments if another stage gathered them.
    pub fn optimizer_for(&mut self, stage: &str) {
        if self.optimizer_stage != stage {
            self.trainer.reset_optimizer();
            self.optimizer_stage = stage.to_string();
        }
    }
}

/// Which of a spec's models a trainer trains, by the spec key that names it: `model` (the
/// solver's, and the proposer's too without `proposer_model:`) or `proposer_model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TrainedModel {
    /// `model:`.
    Model,
    /// `proposer_model:`.
    ProposerModel,
}

impl TrainedModel {
    /// The spec key, as the tables' `model` column records it.
    pub fn key(self) -> &'static str {
        match self {
            TrainedModel::Model => "model",
            TrainedModel::ProposerModel => "proposer_model",
        }
    }

    /// The step metric that records its policy version.
    pub fn version_metric(self) -> &'static str {
        match self {
            TrainedModel::Model => "policy_version",
            TrainedModel::ProposerModel => "proposer_policy_version",
        }
    }

    /// The model whose weights play `role`: the proposer's own with `proposer_model:`.
    pub fn playing(role: Role, selfplay: &crate::selfplay::SelfPlay) -> TrainedModel {
        match (role, &selfplay.proposer_policy) {
            (Role::Proposer, Some(_)) => TrainedModel::ProposerModel,
            _ => TrainedModel::Model,
        }
    }

    /// The policy that serves these weights in the loop.
    pub fn served_by(self, selfplay: &crate::selfplay::SelfPlay) -> Arc<dyn Policy> {
        match self {
            TrainedModel::Model => selfplay.policy.clone(),
            TrainedModel::ProposerModel => selfplay.policy_of(Role::Proposer).clone(),
        }
    }

    /// The model a table row's `model` value names (absent in runs made before proposers
    /// could have their own: `model`).
    fn from_column(value: Option<&str>) -> TrainedModel {
        match value {
            Some("proposer_model") => TrainedModel::ProposerModel,
            _ => TrainedModel::Model,
        }
    }
}

/// The `model` column of a `policy_versions` or `checkpoints` batch, one value per row
/// (`model` for tables written before the column existed).
pub(crate) fn model_column(table: &str, batch: &RecordBatch) -> Result<Vec<TrainedModel>, StageError> {
    if batch.column_by_name("model").is_none() {
        return Ok(vec![TrainedModel::Model; batch.num_rows()]);
    }
    Ok(Reader::new(table, batch).str("model")?.into_iter().map(|m| TrainedModel::from_column(Some(m))).collect())
}

/// The proposer's own trainer, a resource of runs with `proposer_model: {backend: candle}`.
pub struct ProposerTraining(pub Arc<Training>);

/// Items grouped by the trainer they go to (see [`by_training`]).
pub type TrainingGroups<T> = Vec<(Arc<Training>, Vec<T>)>;

/// `items` grouped by the model whose weights play the role each belongs to, in order of first
/// appearance: one group when both roles share `model:`, the proposer's and the solver's apart
/// with `proposer_model:`.
pub fn by_model<T>(
    selfplay: &crate::selfplay::SelfPlay,
    items: impl IntoIterator<Item = (Role, T)>,
) -> Vec<(TrainedModel, Vec<T>)> {
    let mut groups: Vec<(TrainedModel, Vec<T>)> = Vec::new();
    for (role, item) in items {
        let model = TrainedModel::playing(role, selfplay);
        match groups.iter_mut().find(|(m, _)| *m == model) {
            Some((_, group)) => group.push(item),
            None => groups.push((model, vec![item])),
        }
    }
    groups
}

/// [`by_model`] with each model's in-process trainer. `stage` names the stage in the error
/// when a trainer is missing.
pub fn by_training<T>(
    cx: &sesa_engine::StageContext,
    selfplay: &crate::selfplay::SelfPlay,
    stage: &str,
    items: impl IntoIterator<Item = (Role, T)>,
) -> Result<TrainingGroups<T>, StageError> {
    by_model(selfplay, items)
        .into_iter()
        .map(|(model, group)| {
            let training = match model {
                TrainedModel::Model => cx.resource::<Training>(),
                TrainedModel::ProposerModel => cx.resource::<ProposerTraining>().map(|t| t.0.clone()),
            };
            let training = training.map_err(|_| {
                StageError::Failed(format!(
                    "`{stage}` trains `{}:` in process, which needs `backend: candle` there \
                     (mistral.rs and OpenAI-compatible servers cannot take trained weights in process)",
                    model.key()
                ))
            })?;
            Ok((training, group))
        })
        .collect()
}

/// The run's training resource.
pub struct Training {
    /// Whose weights.
    pub model: TrainedModel,
    /// The section.
    pub section: TrainerSection,
    /// Where the initial weights are read from.
    source: PathBuf,
    /// Loaded on first use: most runs never train.
    state: tokio::sync::Mutex<Option<TrainState>>,
}

impl Training {
    /// Training of the weights of the model at `source` (a GGUF file or a Hugging Face
    /// directory), which the spec names at `model`.
    pub fn new(model: TrainedModel, section: TrainerSection, source: PathBuf) -> Training {
        Training { model, section, source, state: tokio::sync::Mutex::new(None) }
    }

    fn initial(&self) -> Result<TrainModel, String> {
        Ok(model_for(sesa_models::policy::ModelFiles::read(&self.source)?.weights, &self.section.method))
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
        Ok(TrainState {
            trainer: Trainer::new(model, self.section.micro_batch_tokens),
            version: 0,
            tokens_trained: 0,
            optimizer_stage: String::new(),
            proposer_baseline: None,
            reference: None,
        })
    }

    /// The initial weights as a model without adapters: full fine-tuning's KL reference.
    pub async fn reference_model(self: &Arc<Self>) -> Result<TrainModel, StageError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            sesa_models::policy::ModelFiles::read(&this.source).map(|f| TrainModel::new(f.weights))
        })
        .await
        .map_err(|e| StageError::Failed(e.to_string()))?
        .map_err(StageError::Failed)
    }

    /// Puts the state back after a training stage.
    pub async fn put(&self, state: TrainState) {
        *self.state.lock().await = Some(state);
    }

    /// Rebuilds the trainer from the run's last checkpoint of its model, if any, and has
    /// `policy` serve its weights.
    pub async fn restore(
        self: &Arc<Self>,
        root: &ArtifactStore,
        run_id: &str,
        policy: &dyn Policy,
    ) -> Result<(), RunError> {
        let corrupt = |reason: String| RunError::Corrupt { location: format!("run {run_id}: checkpoints"), reason };
        let batches = read_table_steps(root, run_id, "checkpoints", Steps::Last).await?;
        let Some(checkpoint) = newest(&batches, self.model, None).map_err(|e| corrupt(e.to_string()))? else {
            return Ok(());
        };
        let mut state = self.take().await.map_err(|e| corrupt(e.to_string()))?;
        checkpoint.apply(&mut state).map_err(corrupt)?;
        policy
            .load_weights(&state.trainer.model.serving_weights(), state.version)
            .map_err(|e| corrupt(e.to_string()))?;
        self.put(state).await;
        Ok(())
    }
}

/// A model to train from `weights`: full fine-tuning, or fresh LoRA adapters on them.
fn model_for(weights: LlamaWeights, method: &Method) -> TrainModel {
    let mut model = TrainModel::new(weights);
    if let Method::Lora(LoraMethod { rank, alpha, targets }) = method {
        model.adapters = Some(new_adapters(&model.weights, *rank, *alpha, targets, 0));
    }
    model
}

/// The `policy_versions` table: one row per version a training stage made.
pub fn policy_versions_batch(rows: &[PolicyVersion]) -> Result<RecordBatch, ArrowError> {
    Columns::default()
        .str("model", rows.iter().map(|r| r.model.key()))
        .u64("version", rows.iter().map(|r| r.version))
        .u64("parent_version", rows.iter().map(|r| r.parent))
        .str("stage", rows.iter().map(|r| r.stage.as_str()))
        .str("method", rows.iter().map(|r| r.method.as_str()))
        .u64("checkpoint_step", rows.iter().map(|r| r.checkpoint_step))
        .str("sha256", rows.iter().map(|r| r.sha256.as_str()))
        .u64("checkpoint_bytes", rows.iter().map(|r| r.bytes))
        .u64("tokens_trained", rows.iter().map(|r| r.tokens_trained))
        .str("external_checkpoint", rows.iter().map(|r| r.external_checkpoint.as_str()))
        .finish()
}

/// A row of `policy_versions`.
pub struct PolicyVersion {
    /// Whose weights.
    pub model: TrainedModel,
    /// This version.
    pub version: u64,
    /// The version it was trained from.
    pub parent: u64,
    /// The stage that made it.
    pub stage: String,
    /// `full` or `lora`.
    pub method: String,
    /// The step whose `checkpoints` rows hold its tensors (deleted once superseded, when the
    /// stage keeps only some checkpoints).
    pub checkpoint_step: u64,
    /// SHA-256 of the tensors' bytes, in table order.
    pub sha256: String,
    /// Bytes of tensors.
    pub bytes: u64,
    /// Tokens trained on over all versions up to this one.
    pub tokens_trained: u64,
    /// Where an external trainer wrote this version (empty when trained in process).
    pub external_checkpoint: String,
}

/// The `policy_versions` table's spec.
pub fn policy_versions_table() -> TableSpec {
    TableSpec::new("policy_versions", schema_of(|| policy_versions_batch(&[])))
}

/// The `checkpoints` table's spec.
pub fn checkpoints_table() -> TableSpec {
    TableSpec::new("checkpoints", schema_of(|| Checkpoint::default().batch()))
}

/// The tensors of one policy version: what is trained and the optimizer's moments, as the
/// little-endian F32 bytes the table stores. They are written once into the Arrow array the
/// table is made of, and read back from it in place: a checkpoint of SmolLM2-135M is 1.6 GB,
/// and each copy of it would add as much to a training run's peak memory.
#[derive(Debug)]
pub struct Checkpoint {
    /// Whose weights.
    pub model: TrainedModel,
    /// The version.
    pub version: u64,
    /// AdamW's step count.
    pub adam_step: u64,
    /// Tokens trained on over all versions up to this one.
    pub tokens_trained: u64,
    /// The stage the optimizer's moments belong to.
    pub optimizer_stage: String,
    /// The proposer's reward baseline.
    pub proposer_baseline: Option<f64>,
    /// The name of every tensor: `weights.N` or `adapters.N`, `adam_m.N`, `adam_v.N`.
    pub names: Vec<String>,
    /// Their bytes, one value per name.
    values: LargeBinaryArray,
}

impl Default for Checkpoint {
    fn default() -> Self {
        Checkpoint {
            model: TrainedModel::Model,
            version: 0,
            adam_step: 0,
            tokens_trained: 0,
            optimizer_stage: String::new(),
            proposer_baseline: None,
            names: Vec::new(),
            values: LargeBinaryBuilder::new().finish(),
        }
    }
}

/// Overwrites `target` with the F32 values of `bytes`, which must be as many.
fn fill_from(target: &mut [f32], bytes: &[u8], what: &str) -> Result<(), String> {
    if bytes.len() != 4 * target.len() {
        return Err(format!("{what}: {} values where {} are expected", bytes.len() / 4, target.len()));
    }
    for (value, chunk) in target.iter_mut().zip(bytes.chunks_exact(4)) {
        *value = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
    }
    Ok(())
}

impl Checkpoint {
    /// The checkpoint of `state`, the trainer of `model`.
    pub fn of(model: TrainedModel, state: &TrainState) -> Checkpoint {
        let trained = &state.trainer.model;
        let kind = if trained.adapters.is_some() { "adapters" } else { "weights" };
        let adam = &state.trainer.adam;
        let groups: [(&str, Vec<&Vec<f32>>); 3] =
            [(kind, trained.trained()), ("adam_m", adam.m.iter().collect()), ("adam_v", adam.v.iter().collect())];
        let count = groups.iter().map(|(_, tensors)| tensors.len()).sum();
        let bytes = groups.iter().flat_map(|(_, tensors)| tensors.iter().map(|t| 4 * t.len())).sum();
        let mut names = Vec::with_capacity(count);
        let mut values = LargeBinaryBuilder::with_capacity(count, bytes);
        // One tensor's bytes at a time: the scratch is as large as the largest tensor.
        let mut scratch = Vec::new();
        for (prefix, tensors) in &groups {
            for (i, tensor) in tensors.iter().enumerate() {
                names.push(format!("{prefix}.{i}"));
                scratch.clear();
                scratch.extend(tensor.iter().flat_map(|v| v.to_le_bytes()));
                values.append_value(&scratch);
            }
        }
        Checkpoint {
            model,
            version: state.version,
            adam_step: adam.step,
            tokens_trained: state.tokens_trained,
            optimizer_stage: state.optimizer_stage.clone(),
            proposer_baseline: state.proposer_baseline,
            names,
            values: values.finish(),
        }
    }

    /// The tensors, by name.
    fn tensors(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.names.iter().map(String::as_str).zip(self.values.iter().map(Option::unwrap_or_default))
    }

    /// SHA-256 of the tensors' bytes and their total size.
    pub fn digest(&self) -> (String, u64) {
        let mut hasher = Sha256::new();
        let mut size = 0;
        for (_, bytes) in self.tensors() {
            hasher.update(bytes);
            size += bytes.len() as u64;
        }
        (format!("{:x}", hasher.finalize()), size)
    }

    /// As a table (sharing the tensors' bytes).
    pub fn batch(&self) -> Result<RecordBatch, ArrowError> {
        let rows = || self.names.iter();
        Columns::default()
            .str("model", rows().map(|_| self.model.key()))
            .u64("version", rows().map(|_| self.version))
            .u64("adam_step", rows().map(|_| self.adam_step))
            .u64("tokens_trained", rows().map(|_| self.tokens_trained))
            .str("optimizer_stage", rows().map(|_| self.optimizer_stage.as_str()))
            .opt_f64("proposer_baseline", rows().map(|_| self.proposer_baseline))
            .str("tensor", rows().map(String::as_str))
            .bytes("values", self.values.clone())
            .finish()
    }

    /// From a table (sharing its bytes).
    pub fn read(batch: &RecordBatch) -> Result<Checkpoint, StageError> {
        let reader = Reader::new("checkpoints", batch);
        let first = |column: &str| -> Result<u64, StageError> { Ok(reader.u64(column)?.first().copied().unwrap_or(0)) };
        Ok(Checkpoint {
            model: model_column("checkpoints", batch)?.first().copied().unwrap_or(TrainedModel::Model),
            version: first("version")?,
            adam_step: first("adam_step")?,
            tokens_trained: first("tokens_trained")?,
            optimizer_stage: reader.str("optimizer_stage")?.first().map_or(String::new(), |s| s.to_string()),
            proposer_baseline: reader.opt_f64("proposer_baseline")?.first().copied().flatten(),
            names: reader.str("tensor")?.iter().map(|name| name.to_string()).collect(),
            values: reader.bytes("values")?,
        })
    }

    /// Puts the trained tensors into `model` (lengths checked); returns the optimizer's.
    fn apply_to_model<'a>(&'a self, model: &mut TrainModel) -> Result<Vec<(&'a str, &'a [u8])>, String> {
        let targets = model.trained_mut();
        if self.names.len() < targets.len() {
            return Err(format!(
                "{} tensors, fewer than the {} trained here (another method or model?)",
                self.names.len(),
                targets.len()
            ));
        }
        let mut tensors = self.tensors();
        for (target, (name, bytes)) in targets.into_iter().zip(tensors.by_ref()) {
            fill_from(target, bytes, name)?;
        }
        Ok(tensors.collect())
    }

    /// Puts the checkpoint's tensors into `state` (shapes checked).
    pub fn apply(self, state: &mut TrainState) -> Result<(), String> {
        let trainer = &mut state.trainer;
        let moments = self.apply_to_model(&mut trainer.model)?;
        if moments.len() != trainer.adam.m.len() + trainer.adam.v.len() {
            return Err(format!("{} optimizer moments, expected {}", moments.len(), 2 * trainer.adam.m.len()));
        }
        for (moment, (name, bytes)) in trainer.adam.m.iter_mut().chain(trainer.adam.v.iter_mut()).zip(moments) {
            fill_from(moment, bytes, name)?;
        }
        trainer.adam.step = self.adam_step;
        state.version = self.version;
        state.tokens_trained = self.tokens_trained;
        state.optimizer_stage = self.optimizer_stage;
        state.proposer_baseline = self.proposer_baseline;
        Ok(())
    }
}

/// The checkpoint of `model`'s `version` among one step's `checkpoints` files (several
/// training stages may run in a step, and a stage that trains two models writes both in its
/// file), or its newest one when `None`.
fn newest(
    batches: &[(u64, RecordBatch)],
    model: TrainedModel,
    version: Option<u64>,
) -> Result<Option<Checkpoint>, StageError> {
    let mut found: Option<Checkpoint> = None;
    for (_, batch) in batches {
        // The rows of `model`: a contiguous run (each checkpoint's rows are written together).
        let models = model_column("checkpoints", batch)?;
        let Some(start) = models.iter().position(|m| *m == model) else { continue };
        let rows = models[start..].iter().take_while(|m| **m == model).count();
        let checkpoint = Checkpoint::read(&batch.slice(start, rows))?;
        let wanted = version.is_none_or(|v| v == checkpoint.version);
        if wanted && found.as_ref().is_none_or(|f| checkpoint.version > f.version) {
            found = Some(checkpoint);
        }
    }
    Ok(found)
}

/// Restores the weights of `model`'s `version` (the last one when `None`) from a run's
/// checkpoints into a model built from `initial` as `method` says: what `sesa model export`
/// serves. Only that version's checkpoint is read.
pub async fn weights_at(
    root: &ArtifactStore,
    run_id: &str,
    model: TrainedModel,
    version: Option<u64>,
    initial: LlamaWeights,
    method: &Method,
) -> Result<(u64, LlamaWeights), RunError> {
    let corrupt = |reason: String| RunError::Corrupt { location: format!("run {run_id}: checkpoints"), reason };
    let mut made = Vec::new();
    for (_, batch) in read_table(root, run_id, "policy_versions").await? {
        let reader = Reader::new("policy_versions", &batch);
        let (models, versions, steps) = (
            model_column("policy_versions", &batch).map_err(|e| corrupt(e.to_string()))?,
            reader.u64("version").map_err(|e| corrupt(e.to_string()))?,
            reader.u64("checkpoint_step").map_err(|e| corrupt(e.to_string()))?,
        );
        made.extend(
            models.into_iter().zip(versions.into_iter().zip(steps)).filter(|(m, _)| *m == model).map(|(_, v)| v),
        );
    }
    let found = match version {
        Some(v) => made.iter().find(|(made, _)| *made == v),
        None => made.last(),
    };
    let missing = || match version {
        Some(v) => format!(
            "no policy version {v} of `{}`: see the `policy_versions` table (a stage's `keep_every` may have \
             deleted its checkpoint)",
            model.key()
        ),
        None => format!("the run has trained no policy version of `{}`", model.key()),
    };
    let &(version, step) = found.ok_or_else(|| corrupt(missing()))?;
    let batches = read_table_steps(root, run_id, "checkpoints", Steps::Only(step)).await?;
    let checkpoint = newest(&batches, model, Some(version))
        .map_err(|e| corrupt(e.to_string()))?
        .ok_or_else(|| corrupt(missing()))?;
    let mut restored = model_for(initial, method);
    checkpoint.apply_to_model(&mut restored).map_err(corrupt)?;
    Ok((version, restored.serving_weights().into_owned()))
}

/// What [`publish_version`] made: the tables of the new version, and how long serving took.
pub struct Published {
    /// Its `policy_versions` row.
    pub policy_versions: RecordBatch,
    /// Its `checkpoints` rows.
    pub checkpoints: RecordBatch,
    /// Milliseconds the policy took to take the weights.
    pub serve_ms: f64,
    /// Milliseconds spent laying out and hashing the checkpoint (its write is the commit's).
    pub checkpoint_ms: f64,
}

impl Published {
    /// The tables of several versions made by one stage (one per model it trained), as one.
    pub fn merge(parts: Vec<Published>) -> Result<Published, ArrowError> {
        let concat = |tables: Vec<&RecordBatch>| -> Result<RecordBatch, ArrowError> {
            let schema = tables.first().map_or_else(|| Arc::new(arrow_schema::Schema::empty()), |t| t.schema());
            arrow_select::concat::concat_batches(&schema, tables)
        };
        if parts.len() == 1 {
            return Ok(parts.into_iter().next().expect("one part"));
        }
        Ok(Published {
            policy_versions: concat(parts.iter().map(|p| &p.policy_versions).collect())?,
            checkpoints: concat(parts.iter().map(|p| &p.checkpoints).collect())?,
            serve_ms: parts.iter().map(|p| p.serve_ms).sum(),
            checkpoint_ms: parts.iter().map(|p| p.checkpoint_ms).sum(),
        })
    }
}

/// Makes the trainer's weights the next policy version after `parent`: the policy serves them
/// from the next stage on, and the version's row and checkpoint are returned for the stage to
/// commit.
pub async fn publish_version(
    cx: &sesa_engine::StageContext,
    selfplay: &Arc<crate::selfplay::SelfPlay>,
    training: &Training,
    mut state: TrainState,
    parent: u64,
) -> Result<(TrainState, Published), StageError> {
    state.version = parent + 1;
    let policy = training.model.served_by(selfplay);
    let model = training.model;
    let failed = |e: String| StageError::Failed(format!("serving the trained weights: {e}"));
    let (state, checkpoint, (sha256, bytes), serve_ms, checkpoint_ms) = tokio::task::spawn_blocking(move || {
        let clock = std::time::Instant::now();
        let loaded = policy.load_weights(&state.trainer.model.serving_weights(), state.version);
        let serve_ms = clock.elapsed().as_secs_f64() * 1e3;
        let clock = std::time::Instant::now();
        let checkpoint = Checkpoint::of(model, &state);
        let digest = checkpoint.digest();
        let checkpoint_ms = clock.elapsed().as_secs_f64() * 1e3;
        loaded.map(|()| (state, checkpoint, digest, serve_ms, checkpoint_ms)).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| failed(e.to_string()))?
    .map_err(failed)?;
    let version = PolicyVersion {
        model,
        version: state.version,
        parent,
        stage: cx.stage_name().to_string(),
        method: training.section.method.name().into(),
        checkpoint_step: cx.step(),
        sha256,
        bytes,
        tokens_trained: state.tokens_trained,
        external_checkpoint: String::new(),
    };
    let published = Published {
        policy_versions: policy_versions_batch(&[version])?,
        checkpoints: checkpoint.batch()?,
        serve_ms,
        checkpoint_ms,
    };
    Ok((state, published))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sesa_models::weights::testing::{random, tiny_shape};

    fn state(seed: u64) -> TrainState {
        TrainState {
            trainer: Trainer::new(TrainModel::new(random(tiny_shape(), true, seed)), 64),
            version: 0,
            tokens_trained: 0,
            optimizer_stage: String::new(),
            proposer_baseline: None,
            reference: None,
        }
    }

    #[test]
    fn a_checkpoints_digest_covers_every_tensors_little_endian_bytes_in_order() {
        let saved = state(3);
        let checkpoint = Checkpoint::of(TrainedModel::Model, &saved);
        let model = &saved.trainer.model;
        let adam = &saved.trainer.adam;
        let tensors: Vec<&Vec<f32>> = model.trained().into_iter().chain(&adam.m).chain(&adam.v).collect();
        let bytes: Vec<u8> = tensors.iter().flat_map(|t| t.iter().flat_map(|v| v.to_le_bytes())).collect();
        assert_eq!(checkpoint.digest(), (format!("{:x}", Sha256::digest(&bytes)), bytes.len() as u64));
        assert_eq!(checkpoint.names.len(), tensors.len());
        assert_eq!(
            (checkpoint.names[0].as_str(), checkpoint.names.last().unwrap().starts_with("adam_v.")),
            ("weights.0", true)
        );
        // Read back from its table, it shares the table's bytes and digests the same.
        let batch = checkpoint.batch().unwrap();
        assert_eq!(Checkpoint::read(&batch).unwrap().digest(), checkpoint.digest());
    }

    #[test]
    fn a_checkpoint_read_back_restores_weights_moments_and_the_update_state() {
        let mut saved = state(1);
        saved.version = 7;
        saved.tokens_trained = 1234;
        saved.optimizer_stage = "update".into();
        saved.proposer_baseline = Some(-0.25);
        saved.trainer.adam.step = 3;
        saved.trainer.adam.m[0][0] = 0.5;
        let batch = Checkpoint::of(TrainedModel::Model, &saved).batch().unwrap();
        let mut restored = state(2);
        Checkpoint::read(&batch).unwrap().apply(&mut restored).unwrap();
        assert_eq!(restored.trainer.model.weights, saved.trainer.model.weights);
        assert_eq!(restored.trainer.adam, saved.trainer.adam);
        assert_eq!(
            (restored.version, restored.tokens_trained, restored.optimizer_stage.as_str(), restored.proposer_baseline),
            (7, 1234, "update", Some(-0.25))
        );
        // Another stage starts from fresh moments; the same one keeps them.
        restored.optimizer_for("update");
        assert_eq!(restored.trainer.adam.step, 3);
        restored.optimizer_for("warmup");
        assert_eq!((restored.trainer.adam.step, restored.trainer.adam.m[0][0]), (0, 0.0));
    }
}
