//! The run's trainer as a resource: the model being trained (loaded on the first training
//! stage, as the `trainer:` section says), its policy versions (`versions`), and the checkpoint
//! tables that make training resumable (`checkpoint`).
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

use arrow_array::RecordBatch;
use sesa_engine::{ArtifactStore, RunError, StageError, Steps, read_table_steps};

use crate::agent::Role;
use crate::sections::TrainerSection;
use sesa_engine::columns::Reader;
use sesa_models::policy::Policy;
use sesa_models::train::{TrainModel, Trainer};

mod checkpoint;
mod versions;

use self::checkpoint::newest;
pub use self::checkpoint::{Checkpoint, checkpoints_table, weights_at};
pub use self::versions::{PolicyVersion, Published, policy_versions_batch, policy_versions_table, publish_version};

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
        Ok(TrainModel::for_method(sesa_models::policy::ModelFiles::read(&self.source)?.weights, &self.section.method))
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
        checkpoint.apply(&mut state, self.section.update_adapters()).map_err(corrupt)?;
        policy
            .load_weights(&state.trainer.model.serving_weights(), state.version)
            .map_err(|e| corrupt(e.to_string()))?;
        self.put(state).await;
        Ok(())
    }
}
