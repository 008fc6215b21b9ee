//! The external-trainer contract: where one machine is not enough, an existing distributed
//! trainer (verl, OpenRLHF) takes each step's update batch and the policy servers reload what
//! it wrote. sesa keeps the loop, the rewards and the advantages; the trainer only minimises
//! the loss. The contract, step by step (docs/external-trainer.md):
//!
//! 1. sesa writes `DIR/step-NNNNNNNN/batch.parquet` (one row per trajectory: role, group,
//!    reward, advantage, prompt and response text and token ids, loss mask, the serving
//!    log-probabilities, tokens_exact, policy_version) and `manifest.json` beside it. When the
//!    proposer has its own model (`proposer_model:`), each model gets its own batch, manifest
//!    and checkpoint, in `step-NNNNNNNN/proposer_model/` and `step-NNNNNNNN/model/`, and the
//!    manifest's `model` says which (the trainer starts the proposer's from its own weights).
//! 2. It runs `command` with the manifest's path as its last argument and `SESA_MANIFEST`,
//!    `SESA_RESULT` and `SESA_CHECKPOINT_DIR` set; its output goes to `trainer.log`.
//! 3. Exit 0 with `result.json` written (`{"checkpoint": PATH, "metrics": {ROLE: {...}}}`) is
//!    success. Any other exit, a missing or malformed result, or a run past `timeout_s`
//!    (the trainer is killed) fails the step cleanly: nothing is committed, and
//!    `sesa resume` runs the step again.
//! 4. Once every model's trainer succeeded, sesa has the servers load each checkpoint
//!    (`reload_command` and/or a `POST` of `{"checkpoint", "version", "model"}` to
//!    `reload_url`), then records the new policy versions.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sesa_engine::StageError;

use std::sync::Arc;

use sesa_engine::{StageContext, Tables};

use super::batch::RoleBatch;
use super::{Outcome, Update, UpdateRow};
use crate::selfplay::SelfPlay;
use crate::selfplay::stages::{elapsed_ms, failed, role_named};
use crate::selfplay::training::{PolicyVersion, Published, TrainedModel, by_model, policy_versions_batch};
use sesa_engine::columns::Columns;
use sesa_models::policy::ServerUrls;
use sesa_models::train::{ClippedObjective, OptimizerConfig};

/// The version of this contract, in every manifest of a run whose models are the one shared
/// `model:`.
pub const CONTRACT_VERSION: u64 = 1;

/// The contract of a run whose proposer has its own model: version 1 with each manifest's
/// `model` to read, so that a trainer written for one model refuses it rather than start the
/// proposer from the solver's weights.
pub const CONTRACT_VERSION_APART: u64 = 2;

/// An external trainer.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExternalTrainer {
    /// The program and its arguments; the manifest's path is appended.
    pub command: Vec<String>,
    /// Where each step's batch, manifest, result and log go (`DIR/step-NNNNNNNN/`, or
    /// `DIR/step-NNNNNNNN/<model>/` per model when the proposer has its own).
    pub dir: PathBuf,
    /// Seconds the trainer may run before it is killed and the step fails.
    #[serde(default = "hour")]
    pub timeout_s: u64,
    /// Run after a successful update, with `SESA_CHECKPOINT`, `SESA_POLICY_VERSION`,
    /// `SESA_MODEL` (`model`, or `proposer_model` for the proposer's own) and `SESA_SERVERS`
    /// (the model's `base_url`s, space-separated) set: has every policy server load the new
    /// checkpoint, once per trained model; a non-zero exit fails the step.
    #[serde(default)]
    pub reload_command: Option<Vec<String>>,
    /// POSTed `{"checkpoint": PATH, "version": N, "model": KEY}` after a successful update, once
    /// per trained model; a list is POSTed to each in turn, and the first that fails fails the
    /// step.
    #[serde(default)]
    pub reload_url: Option<ServerUrls>,
}

fn hour() -> u64 {
    3600
}

fn model_key() -> String {
    TrainedModel::Model.key().to_string()
}

/// The newest checkpoint an external trainer wrote of each model (its version is the one the
/// policy serves): where the model's next update starts from. A run's resources hold it; a
/// resumed run rebuilds it from `policy_versions`.
#[derive(Debug, Default)]
pub struct ExternalCheckpoint(Mutex<BTreeMap<TrainedModel, String>>);

impl ExternalCheckpoint {
    /// The newest checkpoint of `model`, if an external trainer wrote one.
    pub fn of(&self, model: TrainedModel) -> Option<String> {
        self.0.lock().expect("checkpoint lock").get(&model).cloned()
    }

    /// Records `path` as the newest checkpoint of `model`.
    pub fn set(&self, model: TrainedModel, path: String) {
        self.0.lock().expect("checkpoint lock").insert(model, path);
    }
}

/// What sesa tells the trainer, as `manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`CONTRACT_VERSION`], or [`CONTRACT_VERSION_APART`].
    pub contract: u64,
    /// The loop step.
    pub step: u64,
    /// The spec key of the model trained: `model`, or `proposer_model` when the proposer has
    /// its own (manifests written before that existed have none: `model`).
    #[serde(default = "model_key")]
    pub model: String,
    /// The policy version the batch was generated by (the trainer starts from it).
    pub policy_version: u64,
    /// The version the trainer's checkpoint will be.
    pub next_version: u64,
    /// The checkpoint of `policy_version`, when an external trainer wrote one (else the
    /// initial model, which the trainer is configured with).
    pub previous_checkpoint: Option<String>,
    /// The batch (Parquet), the result to write and where to write the checkpoint.
    pub batch: PathBuf,
    pub result: PathBuf,
    pub checkpoint_dir: PathBuf,
    /// Rows of the batch per role, in the order to update them.
    pub roles: Vec<(String, usize)>,
    /// Log-probabilities are those of the logits divided by this.
    pub temperature: f32,
    pub loss: ClippedObjective,
    pub optimizer: OptimizerConfig,
    pub ppo_epochs: usize,
    pub mini_batch: Option<usize>,
}

/// What the trainer reports, as `result.json`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainerResult {
    /// The new weights (whatever the servers load: a HF directory, a verl checkpoint).
    pub checkpoint: String,
    /// Per role, what its update did (any of the `updates` table's numeric columns).
    #[serde(default)]
    pub metrics: BTreeMap<String, RoleMetrics>,
}

/// One role's numbers in `result.json`; absent ones are recorded as 0.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RoleMetrics {
    pub optimizer_steps: u64,
    pub loss: f64,
    pub pg_loss: f64,
    pub kl: f64,
    pub clip_fraction: f64,
    pub entropy: f64,
    pub grad_norm: f64,
    pub lr: f64,
    pub tokens: u64,
    pub logprob_gap: f64,
    pub logprob_gap_max: f64,
    /// In-process only (`replay`, which an external trainer is refused): not in `result.json`.
    #[serde(skip)]
    pub replay_nll: f64,
}

impl RoleMetrics {
    /// One role's `updates` rows summed up: means over its optimizer steps.
    pub(super) fn of<'a>(rows: impl IntoIterator<Item = &'a UpdateRow>) -> RoleMetrics {
        let rows: Vec<&UpdateRow> = rows.into_iter().collect();
        let trained: Vec<&UpdateRow> = rows.iter().copied().filter(|r| r.optimizer_step > 0).collect();
        let n = trained.len().max(1) as f64;
        let average = |f: fn(&UpdateRow) -> f64| trained.iter().map(|r| f(r)).sum::<f64>() / n;
        RoleMetrics {
            optimizer_steps: trained.len() as u64,
            loss: average(|r| r.loss),
            pg_loss: average(|r| r.pg_loss),
            kl: average(|r| r.kl),
            clip_fraction: average(|r| r.clip_fraction),
            entropy: average(|r| r.entropy),
            replay_nll: average(|r| r.replay_nll),
            grad_norm: average(|r| r.grad_norm),
            lr: average(|r| r.lr),
            tokens: rows.iter().map(|r| r.tokens).sum(),
            logprob_gap: rows.first().map_or(0.0, |r| r.logprob_gap),
            logprob_gap_max: rows.first().map_or(0.0, |r| r.logprob_gap_max),
        }
    }
}

/// The update batch as a table.
pub fn batch_table(batches: &[RoleBatch]) -> Result<RecordBatch, ArrowError> {
    let rows: Vec<(&str, &super::batch::Sample)> =
        batches.iter().flat_map(|b| b.samples.iter().map(move |s| (b.role, s))).collect();
    Columns::default()
        .str("role", rows.iter().map(|(r, _)| *r))
        .u64("group", rows.iter().map(|(_, s)| s.group))
        .f64("reward", rows.iter().map(|(_, s)| s.reward))
        .f64("advantage", rows.iter().map(|(_, s)| s.advantage))
        .str("prompt", rows.iter().map(|(_, s)| s.prompt.as_str()))
        .str("response", rows.iter().map(|(_, s)| s.response.as_str()))
        .u32s("prompt_ids", rows.iter().map(|(_, s)| s.prompt_ids.as_slice()))
        .u32s("response_ids", rows.iter().map(|(_, s)| s.response_ids.as_slice()))
        .u32s("loss_mask", rows.iter().map(|(_, s)| s.loss_mask.as_slice()))
        .f32s("old_logprobs", rows.iter().map(|(_, s)| s.logprobs.as_slice()))
        .bool("tokens_exact", rows.iter().map(|(_, s)| s.exact))
        .u64("policy_version", rows.iter().map(|(_, s)| s.policy_version))
        .finish()
}

fn io(what: &str, path: &Path, e: impl std::fmt::Display) -> StageError {
    StageError::Failed(format!("external trainer: {what} {}: {e}", path.display()))
}

/// The last `bytes` of a file, for an error message.
fn tail(path: &Path, bytes: usize) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    String::from_utf8_lossy(&text[text.len().saturating_sub(bytes)..]).trim().to_string()
}

/// Writes the step's batch and manifest (the manifest last, so a trainer never sees a
/// manifest without its batch). Returns the manifest's path.
pub fn write_step(directory: &Path, batch: &RecordBatch, manifest: &Manifest) -> Result<PathBuf, StageError> {
    std::fs::create_dir_all(directory).map_err(|e| io("creating", directory, e))?;
    let parquet = sesa_engine::table::encode_parquet(batch).map_err(|e| io("encoding", &manifest.batch, e))?;
    write_atomically(&manifest.batch, &parquet)?;
    let path = directory.join("manifest.json");
    let json = serde_json::to_vec_pretty(manifest).map_err(|e| io("encoding", &path, e))?;
    write_atomically(&path, &json)?;
    Ok(path)
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), StageError> {
    sesa_engine::store::write_whole(path, bytes).map_err(|e| io("writing", path, e))
}

/// Runs `command` (the manifest's path appended) with the contract's environment, its output
/// in `log`, killed after `timeout`.
async fn run(command: &[String], envs: &[(&str, &Path)], log: &Path, timeout: Duration) -> Result<(), StageError> {
    let Some((program, args)) = command.split_first() else {
        return Err(StageError::Failed("external trainer: `command` is empty".into()));
    };
    let output = std::fs::File::create(log).map_err(|e| io("creating", log, e))?;
    let errors = output.try_clone().map_err(|e| io("opening", log, e))?;
    let mut process = tokio::process::Command::new(program);
    process.args(args).stdout(output).stderr(errors).stdin(std::process::Stdio::null()).kill_on_drop(true);
    for (key, value) in envs {
        process.env(key, value);
    }
    let mut child =
        process.spawn().map_err(|e| StageError::Failed(format!("external trainer: cannot start `{program}`: {e}")))?;
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => Err(StageError::Failed(format!(
            "`{}` failed ({status}); `sesa resume` runs the step again. The end of {}:\n{}",
            command.join(" "),
            log.display(),
            tail(log, 2000)
        ))),
        Ok(Err(e)) => Err(StageError::Failed(format!("external trainer: waiting for `{program}`: {e}"))),
        Err(_) => {
            let _ = child.kill().await;
            Err(StageError::Failed(format!(
                "`{}` did not finish within timeout_s = {} s and was killed; `sesa resume` runs the step again",
                command.join(" "),
                timeout.as_secs()
            )))
        }
    }
}

impl ExternalTrainer {
    /// Runs the trainer on the written step and reads its result.
    pub async fn train(&self, manifest_path: &Path, manifest: &Manifest) -> Result<TrainerResult, StageError> {
        let log = manifest_path.with_file_name("trainer.log");
        let _ = std::fs::remove_file(&manifest.result);
        let mut command = self.command.clone();
        command.push(manifest_path.display().to_string());
        let envs = [
            ("SESA_MANIFEST", manifest_path),
            ("SESA_RESULT", manifest.result.as_path()),
            ("SESA_CHECKPOINT_DIR", manifest.checkpoint_dir.as_path()),
        ];
        run(&command, &envs, &log, Duration::from_secs(self.timeout_s)).await?;
        let text = std::fs::read(&manifest.result).map_err(|e| {
            io("reading the result the trainer must write (exit 0 without it is a failure):", &manifest.result, e)
        })?;
        serde_json::from_slice(&text).map_err(|e| io("parsing", &manifest.result, e))
    }

    /// Has the servers of `model` (`servers`: its base URLs) load `checkpoint` as `version`.
    pub async fn reload(
        &self,
        model: TrainedModel,
        servers: &[String],
        checkpoint: &str,
        version: u64,
        log: &Path,
    ) -> Result<(), StageError> {
        if let Some(command) = &self.reload_command {
            let (version_text, servers_text) = (version.to_string(), servers.join(" "));
            let envs = [
                ("SESA_CHECKPOINT", Path::new(checkpoint)),
                ("SESA_POLICY_VERSION", Path::new(&version_text)),
                ("SESA_MODEL", Path::new(model.key())),
                ("SESA_SERVERS", Path::new(&servers_text)),
            ];
            run(command, &envs, log, Duration::from_secs(self.timeout_s)).await?;
        }
        let urls = self.reload_url.as_ref().map(ServerUrls::as_slice).unwrap_or_default();
        for (i, url) in urls.iter().enumerate() {
            let failed = |e: String| {
                let done = if i == 0 { String::new() } else { format!(" ({} did reload)", urls[..i].join(", ")) };
                StageError::Failed(format!("reloading the policy at {url}: {e}{done}"))
            };
            let response = reqwest::Client::new()
                .post(url)
                .json(&serde_json::json!({"checkpoint": checkpoint, "version": version, "model": model.key()}))
                .timeout(Duration::from_secs(self.timeout_s))
                .send()
                .await
                .map_err(|e| failed(e.to_string()))?;
            if !response.status().is_success() {
                return Err(failed(format!("HTTP {}", response.status())));
            }
        }
        Ok(())
    }
}

/// The `updates` rows of an external update: one per role, with the trainer's numbers.
pub fn rows(batches: &[RoleBatch], result: &TrainerResult, wall_ms: f64) -> Vec<UpdateRow> {
    batches
        .iter()
        .map(|batch| {
            let m = result.metrics.get(batch.role).cloned().unwrap_or_default();
            UpdateRow {
                role: batch.role,
                optimizer_step: m.optimizer_steps,
                sequences: batch.samples.len() as u64,
                tokens: m.tokens,
                trained_tokens: batch
                    .samples
                    .iter()
                    .map(|s| s.loss_mask.iter().filter(|&&x| x != 0).count() as u64)
                    .sum(),
                loss: m.loss,
                pg_loss: m.pg_loss,
                kl: m.kl,
                clip_fraction: m.clip_fraction,
                entropy: m.entropy,
                grad_norm: m.grad_norm,
                lr: m.lr,
                groups: batch.groups as u64,
                groups_without_signal: batch.groups_without_signal as u64,
                mean_reward: crate::selfplay::stages::mean(batch.rewards.iter().copied()),
                logprob_gap: m.logprob_gap,
                logprob_gap_max: m.logprob_gap_max,
                wall_ms,
                ..UpdateRow::default()
            }
        })
        .collect()
}

/// The update batch of a step, read back as the roles' batches, in the manifest's order.
fn read_batch(manifest: &Manifest) -> Result<Vec<RoleBatch>, String> {
    let bytes = std::fs::read(&manifest.batch).map_err(|e| format!("reading {}: {e}", manifest.batch.display()))?;
    let table = sesa_engine::table::decode_parquet(bytes.into())
        .map_err(|e| format!("decoding {}: {e}", manifest.batch.display()))?;
    let reader = sesa_engine::columns::Reader::new("batch", &table);
    let column = |e: StageError| e.to_string();
    let (roles, groups) = (reader.str("role").map_err(column)?, reader.u64("group").map_err(column)?);
    let (rewards, advantages) = (reader.f64("reward").map_err(column)?, reader.f64("advantage").map_err(column)?);
    let mut samples = super::batch::read_samples(&reader, "response_ids", "old_logprobs", &groups).map_err(column)?;
    for (i, sample) in samples.iter_mut().enumerate() {
        (sample.reward, sample.advantage) = (rewards[i], advantages[i]);
    }
    Ok(manifest
        .roles
        .iter()
        .map(|(role, _)| {
            let rows: Vec<usize> = (0..reader.rows()).filter(|&i| roles[i] == role).collect();
            RoleBatch {
                role: if role == "proposer" { "proposer" } else { "solver" },
                samples: rows.iter().map(|&i| samples[i].clone()).collect(),
                rewards: rows.iter().map(|&i| rewards[i]).collect(),
                groups: rows.iter().map(|&i| groups[i]).collect::<std::collections::BTreeSet<_>>().len(),
                groups_without_signal: 0,
            }
        })
        .collect())
}

/// sesa's own trainer behind the contract (`sesa train-external`): trains the weights of the
/// manifest's previous checkpoint (or the initial weights, which are also the KL reference:
/// `model`, or `proposer_model` for a manifest of the proposer's own model) on its batch with
/// the in-process trainer, full fine-tuning, then writes the new weights as a Hugging Face
/// directory and `result.json`. It keeps no optimizer state between steps (AdamW starts afresh
/// each step): a reference for the contract and for checking another trainer's loss on the
/// same batch, not a replacement for a distributed one.
pub fn train_with_sesa(
    manifest_path: &Path,
    model: &Path,
    proposer_model: Option<&Path>,
    micro_batch_tokens: usize,
) -> Result<TrainerResult, String> {
    use crate::selfplay::training::TrainState;
    use sesa_models::policy::ModelFiles;
    use sesa_models::train::{TrainModel, Trainer};
    let text = std::fs::read(manifest_path).map_err(|e| format!("reading {}: {e}", manifest_path.display()))?;
    let manifest: Manifest =
        serde_json::from_slice(&text).map_err(|e| format!("parsing {}: {e}", manifest_path.display()))?;
    if manifest.contract != CONTRACT_VERSION && manifest.contract != CONTRACT_VERSION_APART {
        return Err(format!(
            "contract {} is not one of the supported {CONTRACT_VERSION} and {CONTRACT_VERSION_APART}",
            manifest.contract
        ));
    }
    let batches = read_batch(&manifest)?;
    let initial = match (manifest.model.as_str(), proposer_model) {
        ("model", _) => ModelFiles::read(model)?,
        ("proposer_model", Some(proposer_model)) => ModelFiles::read(proposer_model)?,
        ("proposer_model", None) => {
            return Err(format!(
                "{} trains the proposer's own model: give its initial weights with --proposer-model",
                manifest_path.display()
            ));
        }
        (other, _) => {
            return Err(format!(
                "{}: unknown model `{other}` (this trainer knows `model` and `proposer_model`)",
                manifest_path.display()
            ));
        }
    };
    let weights = match &manifest.previous_checkpoint {
        Some(previous) => ModelFiles::read(Path::new(previous))?.weights,
        None => initial.weights.clone(),
    };
    let mut state = TrainState {
        trainer: Trainer::new(TrainModel::new(weights), micro_batch_tokens),
        version: manifest.policy_version,
        tokens_trained: 0,
        optimizer_stage: String::new(),
        proposer_baseline: None,
        reference: (manifest.loss.kl_coef > 0.0).then(|| TrainModel::new(initial.weights.clone())),
    };
    let config = super::UpdateConfig {
        roles: manifest.roles.iter().map(|(r, _)| r.clone()).collect(),
        optimizer: manifest.optimizer.clone(),
        loss: manifest.loss,
        ppo_epochs: manifest.ppo_epochs,
        mini_batch: manifest.mini_batch,
        proposer_baseline: None,
        proposer_baseline_per_hops: false,
        skip_groups_without_signal: false,
        written_weight: 1.0,
        misstep_penalty: 0.0,
        written_sft: 0.0,
        keep_every: None,
        served_block_inputs: false,
        replay: None,
        external: None,
    };
    let plan = super::in_process::Plan {
        config: &config,
        temperature: manifest.temperature,
        total_lr_steps: super::in_process::optimizer_steps(&batches, &config),
        serving: None,
    };
    let mut metrics = BTreeMap::new();
    for batch in &batches {
        let rows =
            super::in_process::update_role(&mut state, batch, &plan, &mut super::in_process::Timings::default())?;
        metrics.insert(batch.role.to_string(), RoleMetrics::of(&rows));
    }
    initial.export(&state.trainer.model.weights, &manifest.checkpoint_dir)?;
    let checkpoint = manifest.checkpoint_dir.display().to_string();
    let result = serde_json::json!({"checkpoint": checkpoint, "metrics": metrics});
    let json = serde_json::to_vec_pretty(&result).map_err(|e| e.to_string())?;
    write_atomically(&manifest.result, &json).map_err(|e| e.to_string())?;
    Ok(TrainerResult { checkpoint, metrics })
}

impl Update {
    /// Hands each trained model's batch to the external trainer, the proposer's own model first
    /// when it has one, and once every one succeeded has the servers reload their checkpoints:
    /// a failing trainer leaves every server on the weights of the last committed step. A reload
    /// that fails after another model's succeeded fails the step and names the servers already
    /// ahead of the run's records, with the checkpoint to load again before resuming.
    pub(super) async fn external(
        &self,
        cx: &StageContext,
        selfplay: &Arc<SelfPlay>,
        trainer: &ExternalTrainer,
        inputs: &Tables,
        temperature: f32,
        clock: Instant,
    ) -> Result<Outcome, StageError> {
        let latest = cx.resource::<ExternalCheckpoint>()?;
        let batches = self.batches(inputs, &mut None)?;
        let by_model = by_model(selfplay, batches.into_iter().map(|b| (role_named(b.role), b)));
        let step_directory = trainer.dir.join(format!("step-{:08}", cx.step()));
        let apart = selfplay.proposer_policy.is_some();
        let mut trained = Vec::new();
        for (model, batches) in by_model {
            let directory = if apart { step_directory.join(model.key()) } else { step_directory.clone() };
            let parent = model.served_by(selfplay).version();
            let manifest = Manifest {
                contract: if apart { CONTRACT_VERSION_APART } else { CONTRACT_VERSION },
                step: cx.step(),
                model: model.key().to_string(),
                policy_version: parent,
                next_version: parent + 1,
                previous_checkpoint: latest.of(model),
                batch: directory.join("batch.parquet"),
                result: directory.join("result.json"),
                checkpoint_dir: directory.join("checkpoint"),
                roles: batches.iter().map(|b| (b.role.to_string(), b.samples.len())).collect(),
                temperature,
                loss: self.config.loss,
                optimizer: self.config.optimizer.clone(),
                ppo_epochs: self.config.ppo_epochs,
                mini_batch: self.config.mini_batch,
            };
            let manifest_path = write_step(&directory, &batch_table(&batches)?, &manifest)?;
            let result = trainer.train(&manifest_path, &manifest).await?;
            trained.push((model, batches, parent, directory, result));
        }
        let train_ms = elapsed_ms(clock);
        // Every server is told before any in-process policy swaps weights or any checkpoint is
        // recorded, so a failed reload changes no state of this process.
        let serving = Instant::now();
        for (i, (model, _, parent, directory, result)) in trained.iter().enumerate() {
            let servers = model.served_by(selfplay).servers().to_vec();
            let log = directory.join("reload.log");
            let reloaded = trainer.reload(*model, &servers, &result.checkpoint, parent + 1, &log).await;
            let ahead: Vec<TrainedModel> = trained[..i].iter().map(|(model, ..)| *model).collect();
            reloaded.map_err(|e| naming_servers_ahead(e, &ahead, &latest))?;
        }
        let (mut rows, mut records, mut versions) = (Vec::new(), Vec::new(), Vec::new());
        for (model, batches, parent, _, result) in trained {
            let (policy, path) = (model.served_by(selfplay), PathBuf::from(&result.checkpoint));
            tokio::task::spawn_blocking(move || policy.reloaded(parent + 1, &path))
                .await
                .map_err(|e| failed("serving the new checkpoint", e))?
                .map_err(|e| failed("serving the new checkpoint", e))?;
            latest.set(model, result.checkpoint.clone());
            rows.extend(self::rows(&batches, &result, train_ms));
            records.push(PolicyVersion {
                model,
                version: parent + 1,
                parent,
                stage: cx.stage_name().to_string(),
                method: "external".into(),
                checkpoint_step: cx.step(),
                sha256: String::new(),
                bytes: 0,
                tokens_trained: 0,
                external_checkpoint: result.checkpoint,
            });
            versions.push((model, parent + 1));
        }
        let published = Published {
            policy_versions: policy_versions_batch(&records)?,
            checkpoints: crate::selfplay::training::Checkpoint::default().batch()?,
            serve_ms: elapsed_ms(serving),
            checkpoint_ms: 0.0,
        };
        Ok(Outcome { rows, published, versions, train_ms, timings: None, replayed: Vec::new() })
    }
}

/// A reload's error, told which models' servers already loaded this step's checkpoints (the
/// run records none of them) and what to load again before `sesa resume`.
fn naming_servers_ahead(error: StageError, ahead: &[TrainedModel], latest: &ExternalCheckpoint) -> StageError {
    let StageError::Failed(message) = error else { return error };
    if ahead.is_empty() {
        return StageError::Failed(message);
    }
    let undo: Vec<String> = ahead
        .iter()
        .map(|model| {
            let previous = latest.of(*model).unwrap_or_else(|| "its initial weights".into());
            format!("`{}:` already loaded this step's checkpoint; have it load {previous} again", model.key())
        })
        .collect();
    StageError::Failed(format!("{message}\nbefore `sesa resume`: {}", undo.join("; ")))
}

#[cfg(test)]
mod tests;
