//! `sesa model export`: a run's trained policy, or a local model, as a Hugging Face directory.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use sesa_engine::{ArtifactStore, Registry, Run};
use sesa_models::policy::ModelFiles;
use sesa_stages::sections::TrainerSection;
use sesa_stages::sections::{ModelSection, ProposerModelSection};
use sesa_stages::selfplay::training::{TrainedModel, weights_at};

/// Writes version `version` (the last when `None`) of `model`'s weights in the run at `run`
/// into `out`; or, where `run` names a local model (a GGUF file, a known model's name), that
/// model's weights as loaded (a GGUF's dequantized to F32), for trainers that read Hugging Face
/// directories.
pub async fn export(
    run: &str,
    model: TrainedModel,
    version: Option<u64>,
    out: &Path,
    registry: &Registry,
) -> Result<u8> {
    if Path::new(run).is_file() || sesa_models::cache::KNOWN_MODELS.iter().any(|m| m.name == run) {
        if version.is_some() || model != TrainedModel::Model {
            bail!("`{run}` is a model, not a run: it has no policy versions and no proposer model");
        }
        let source = sesa_stages::sections::local_model(run).await?;
        let files =
            tokio::task::spawn_blocking(move || ModelFiles::read(&source)).await?.map_err(anyhow::Error::msg)?;
        let target = out.to_path_buf();
        tokio::task::spawn_blocking(move || files.export(&files.weights, &target))
            .await?
            .map_err(anyhow::Error::msg)?;
        println!("{}: model `{run}` (config.json, model.safetensors in F32, tokenizer.json)", out.display());
        return Ok(0);
    }
    let (root, run_id) = crate::support::split_run_location(run)?;
    let root = ArtifactStore::open(&root)?;
    let opened = Run::inspect(&root, &run_id, registry).await.with_context(|| format!("opening run `{run}`"))?;
    let version = export_policy(&root, &opened, model, version, out).await?;
    println!(
        "{}: `{}` policy version {version} of run {run_id} (config.json, model.safetensors, tokenizer.json)",
        out.display(),
        model.key()
    );
    Ok(0)
}

/// Writes version `version` (the last when `None`) of `model`'s weights in `run` into `out`;
/// returns the version written.
pub async fn export_policy(
    root: &ArtifactStore,
    run: &Run,
    model: TrainedModel,
    version: Option<u64>,
    out: &Path,
) -> Result<u64> {
    let spec = run.pipeline().spec();
    let name = run.location();
    let key = model.key();
    let section = match model {
        TrainedModel::Model => spec.section::<ModelSection>(),
        TrainedModel::ProposerModel => spec.section::<ProposerModelSection>().map(|s| Arc::new(s.0.clone())),
    };
    let Some(section) = section else { bail!("run `{name}` has no `{key}:` section: nothing of it was trained") };
    let ModelSection::Candle(config) = &*section else {
        bail!(
            "run `{name}` serves `{key}:` with another backend than `candle`: its weights were not trained in process"
        )
    };
    let trainer = spec.section::<TrainerSection>().map(|s| (*s).clone()).unwrap_or_default();
    let source = sesa_stages::sections::local_model(&config.model).await?;
    let files = tokio::task::spawn_blocking(move || ModelFiles::read(&source)).await?.map_err(anyhow::Error::msg)?;
    let (version, weights) = weights_at(root, run.id(), model, version, files.weights.clone(), &trainer)
        .await
        .with_context(|| format!("reading the checkpoints of `{name}`"))?;
    let target = out.to_path_buf();
    tokio::task::spawn_blocking(move || files.export(&weights, &target)).await?.map_err(anyhow::Error::msg)?;
    Ok(version)
}
