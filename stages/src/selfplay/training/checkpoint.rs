//! A policy version's tensors as the `checkpoints` table holds them: what is trained and the
//! optimizer's moments, written once into the table's Arrow array and read back in place.

use arrow_array::builder::LargeBinaryBuilder;
use arrow_array::{LargeBinaryArray, RecordBatch};
use arrow_schema::ArrowError;
use sesa_engine::{ArtifactStore, RunError, StageError, Steps, TableSpec, read_table, read_table_steps};
use sha2::{Digest, Sha256};

use super::{TrainState, TrainedModel, model_column};
use crate::sections::TrainerSection;
use sesa_engine::columns::{Columns, Reader, schema_of};
use sesa_models::train::{LoraMethod, TrainModel};
use sesa_models::weights::LlamaWeights;

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
    /// The name of every tensor: `weights.N` or `adapters.N`, `adam_m.N`, `adam_v.N`, and
    /// `merged.N` for adapters merged into the base weights (`trainer.update_method`).
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

/// The name of the group of tensors `model` trains: its adapters, or its weights.
fn trained_group(model: &TrainModel) -> &'static str {
    if model.adapters.is_some() { "adapters" } else { "weights" }
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
        let adam = &state.trainer.adam;
        let mut groups: Vec<(&str, Vec<&Vec<f32>>)> = vec![
            (trained_group(trained), trained.trained()),
            ("adam_m", adam.m.iter().collect()),
            ("adam_v", adam.v.iter().collect()),
        ];
        groups.extend(trained.merged.as_ref().map(|merged| ("merged", merged.tensors())));
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

    /// The tensors named `{prefix}.N`, in order.
    fn group<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, &'a [u8])> {
        self.tensors().filter(move |(name, _)| name.split_once('.').is_some_and(|(p, _)| p == prefix))
    }

    /// Fills `targets` from the tensors named `{prefix}.N`, which must be as many.
    fn fill(&self, prefix: &str, targets: Vec<&mut Vec<f32>>) -> Result<(), String> {
        let tensors: Vec<_> = self.group(prefix).collect();
        if tensors.len() != targets.len() {
            return Err(format!(
                "{} `{prefix}` tensors where {} are expected: another model, or another `trainer.method` or \
                 `trainer.update_method` than the run's?",
                tensors.len(),
                targets.len()
            ));
        }
        targets.into_iter().zip(tensors).try_for_each(|(target, (name, bytes))| fill_from(target, bytes, name))
    }

    /// Puts the trained tensors into `model`, built from the model's files as `trainer.method`
    /// says. With merged adapters (`trainer.update_method`), those go in first and the model
    /// switches to `update_adapters` ([`TrainModel::adapt_anew`]), as the run did; whether it
    /// switched.
    fn restore_model(&self, model: &mut TrainModel, update_adapters: Option<&LoraMethod>) -> Result<bool, String> {
        let switched = if self.group("merged").next().is_some() {
            let Some(update_adapters) = update_adapters else {
                return Err("its adapters were trained on others merged into the base, and the spec names no \
                            `trainer.update_method`: give it the run's"
                    .to_string());
            };
            let Some(adapters) = model.adapters.as_mut() else {
                return Err("it holds merged adapters, and `trainer.method` is not LoRA: give it the run's".to_string());
            };
            self.fill("merged", adapters.tensors_mut())?;
            model.adapt_anew(update_adapters)
        } else {
            false
        };
        self.fill(trained_group(model), model.trained_mut())?;
        Ok(switched)
    }

    /// Puts the checkpoint's tensors into `state`, whose trainer was built from the model's
    /// files as `trainer.method` says (shapes checked).
    pub fn apply(self, state: &mut TrainState, update_adapters: Option<&LoraMethod>) -> Result<(), String> {
        let trainer = &mut state.trainer;
        if self.restore_model(&mut trainer.model, update_adapters)? {
            trainer.reset_optimizer();
        }
        self.fill("adam_m", trainer.adam.m.iter_mut().collect())?;
        self.fill("adam_v", trainer.adam.v.iter_mut().collect())?;
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
pub(super) fn newest(
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
/// checkpoints into a model built from `initial` as `trainer` says: what `sesa model export`
/// serves. Only that version's checkpoint is read.
pub async fn weights_at(
    root: &ArtifactStore,
    run_id: &str,
    model: TrainedModel,
    version: Option<u64>,
    initial: LlamaWeights,
    trainer: &TrainerSection,
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
    let mut restored = TrainModel::for_method(initial, &trainer.method);
    checkpoint.restore_model(&mut restored, trainer.update_adapters()).map_err(corrupt)?;
    Ok((version, restored.serving_weights().into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sesa_models::train::{Method, Trainer};
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
        Checkpoint::read(&batch).unwrap().apply(&mut restored, None).unwrap();
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

    #[test]
    fn adapters_trained_over_merged_ones_restore_from_the_models_files() {
        let every = LoraMethod::everywhere(2, 4.0);
        let top = LoraMethod { top_layers: Some(1), ..every.clone() };
        // As `Training::take` builds it from the files, for `trainer.method`.
        let fresh = || TrainState {
            trainer: Trainer::new(
                TrainModel::for_method(random(tiny_shape(), true, 1), &Method::Lora(every.clone())),
                64,
            ),
            ..state(1)
        };
        let mut saved = fresh();
        let nudge = |tensors: Vec<&mut Vec<f32>>, by: f32| {
            tensors.into_iter().flatten().enumerate().for_each(|(i, v)| *v += by * ((i % 5) as f32 - 2.0));
        };
        nudge(saved.trainer.model.trained_mut(), 0.01);
        saved.trainer.adapt_anew(&top);
        nudge(saved.trainer.model.trained_mut(), 0.02);
        nudge(saved.trainer.adam.m.iter_mut().collect(), 0.5);
        saved.trainer.adam.step = 2;
        let batch = Checkpoint::of(TrainedModel::Model, &saved).batch().unwrap();
        let mut restored = fresh();
        Checkpoint::read(&batch).unwrap().apply(&mut restored, Some(&top)).unwrap();
        let (a, b) = (&restored.trainer.model, &saved.trainer.model);
        assert_eq!((&a.weights, &a.adapters, &a.merged), (&b.weights, &b.adapters, &b.merged));
        assert_eq!(restored.trainer.adam, saved.trainer.adam);
        assert_eq!(*a.serving_weights(), *b.serving_weights());
        // A spec without `update_method` cannot rebuild the base.
        let error = Checkpoint::read(&batch).unwrap().apply(&mut fresh(), None).unwrap_err();
        assert!(error.contains("names no `trainer.update_method`"), "{error}");
    }
}
