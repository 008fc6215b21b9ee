//! Publishing a policy version: the policy serves the trained weights from the next stage on,
//! and the version's `policy_versions` row and checkpoint go to the stage to commit.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use sesa_engine::{StageError, TableSpec};

use super::{Checkpoint, TrainState, TrainedModel, Training};
use sesa_engine::columns::{Columns, schema_of};

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
