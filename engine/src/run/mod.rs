//! Runs: creating one from a pipeline, executing its steps, and resuming it after a crash.
//!
//! A step runs its active stages as a DAG on tokio (independent stages concurrently), stages
//! every output table under `_staging/`, then commits by writing the step's commit record, and
//! only then moves the files to their published place. A crash before the record leaves
//! nothing visible (the staging area is swept on resume); a crash after it is rolled forward
//! on resume. Either way a resumed run has each committed step's rows exactly once.
//!
//! A run has one writer at a time: see [`lease`].

mod error;
pub mod lease;
mod list;
mod read;
mod step;

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tracing::Instrument;

pub use self::error::RunError;
use self::lease::Lease;
pub use self::list::{RunSummary, list_runs};
use self::read::read_commit;
pub use self::read::{Steps, read_table, read_table_steps};
use crate::manifest::{RunManifest, RunStatus, StepCommit, layout, now};
use crate::plan::Pipeline;
use crate::progress::Progress;
use crate::registry::Registry;
use crate::resources::Resources;
use crate::spec::{SourceDoc, Spec, SpecErrors};
use crate::store::ArtifactStore;

/// How far a stop request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StopRequest {
    /// Keep going.
    None,
    /// Finish and commit the current step, then stop.
    AfterStep,
    /// Abandon the current step now; committed steps stay.
    Now,
}

/// How a call to [`Run::execute`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOutcome {
    /// Every step is committed.
    Completed,
    /// Stopped on request; `sesa resume` continues.
    Interrupted,
}

/// The latest committed version of a table: which step wrote it, with what fingerprint.
#[derive(Debug, Clone)]
struct TableVersion {
    step: u64,
    fingerprint: String,
}

/// A run: a pipeline bound to a place in the artifact store.
pub struct Run {
    store: ArtifactStore,
    pipeline: Arc<Pipeline>,
    resources: Arc<Resources>,
    manifest: RunManifest,
    latest: HashMap<String, TableVersion>,
    /// The run's lease while this process writes it (taken again if the run executes after
    /// it stopped); always `None` for a run opened for reading.
    lease: Option<Lease>,
    /// Opened with [`Run::inspect`]: it never executes.
    read_only: bool,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run").field("id", &self.manifest.run_id).field("store", &self.store).finish()
    }
}

/// SHA-256 of the resolved spec as canonical (key-sorted) JSON.
pub fn spec_hash(spec: &Spec) -> String {
    let json = serde_json::to_value(&spec.resolved).unwrap_or(serde_json::Value::Null);
    hex(&Sha256::digest(canonical_json(&json).as_bytes()))
}

/// `value` as compact JSON with every object's keys sorted. `Value::to_string` is not enough:
/// when any crate in the build turns on serde_json's `preserve_order`, maps keep the order the
/// YAML was written in, and a hash would change when a user reorders keys.
pub(crate) fn canonical_json(value: &serde_json::Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &serde_json::Value, out: &mut String) {
    match value {
        serde_json::Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        serde_json::Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Run {
    /// Creates a new run of `pipeline` under `root`, named after the spec and the time.
    pub async fn create(root: &ArtifactStore, pipeline: Pipeline, code_version: &str) -> Result<Run, RunError> {
        let spec = pipeline.spec();
        let created_at = now();
        let stamp: String = created_at.chars().filter(|c| c.is_ascii_digit()).take(14).collect();
        let suffix = format!("{:04x}", rand::random::<u16>());
        let run_id = format!("{}-{}T{}-{suffix}", slug(&spec.name), &stamp[..8], &stamp[8..]);
        let store = root.scoped(&run_id);
        let lease = Lease::acquire(&store, false).await?;
        let manifest = RunManifest {
            run_id,
            name: spec.name.clone(),
            spec_hash: spec_hash(spec),
            seed: spec.seed,
            steps: spec.steps,
            committed_steps: 0,
            code_version: code_version.to_string(),
            created_at: created_at.clone(),
            updated_at: created_at,
            finished_at: None,
            status: RunStatus::Running,
            error: None,
            pid: Some(std::process::id()),
        };
        let yaml = serde_yaml::to_string(&spec.resolved).map_err(|e| RunError::Internal(e.to_string()))?;
        let header = "# The resolved spec of this run: `extends` merged and overrides applied.\n";
        store.put(layout::SPEC, Bytes::from(format!("{header}{yaml}"))).await?;
        let resources = Arc::new(spec.sections.clone());
        let run = Run {
            store,
            pipeline: Arc::new(pipeline),
            resources,
            manifest,
            latest: HashMap::new(),
            lease: Some(lease),
            read_only: false,
        };
        run.write_manifest().await?;
        Ok(run)
    }

    /// Opens run `run_id` under `root` to resume it: takes its lease (refused while another
    /// live process writes it), re-validates its saved spec with `registry`, rolls a
    /// committed-but-unpublished step forward and sweeps uncommitted files.
    pub async fn open(root: &ArtifactStore, run_id: &str, registry: &Registry) -> Result<Run, RunError> {
        Self::open_for_writing(root, run_id, registry, false).await
    }

    /// [`Run::open`], taking the lease over even from a writer that looks alive: for the user
    /// who knows it is gone (`sesa resume --force`).
    pub async fn open_taking_over(root: &ArtifactStore, run_id: &str, registry: &Registry) -> Result<Run, RunError> {
        Self::open_for_writing(root, run_id, registry, true).await
    }

    async fn open_for_writing(
        root: &ArtifactStore,
        run_id: &str,
        registry: &Registry,
        force: bool,
    ) -> Result<Run, RunError> {
        let store = root.scoped(run_id);
        if !store.exists(layout::MANIFEST).await? {
            return Err(RunError::NotARun { location: store.describe("") });
        }
        let lease = Lease::acquire(&store, force).await?;
        let mut run = Self::load(store, registry).await?;
        run.lease = Some(lease);
        let store = &run.store;
        let mut committed = Vec::new();
        for key in store.list(layout::COMMITS).await? {
            if let Some(step) = layout::commit_step(&key) {
                committed.push(step);
            }
        }
        committed.sort_unstable();
        if let Some((position, &step)) = committed.iter().enumerate().find(|(i, s)| **s != *i as u64 + 1) {
            return Err(RunError::Corrupt {
                location: store.describe(layout::COMMITS),
                reason: format!("step {step} is committed but step {} is not", position + 1),
            });
        }
        let mut latest = HashMap::new();
        let mut last_commit = None;
        for &step in &committed {
            let commit = read_commit(store, step).await?;
            for file in &commit.files {
                latest.insert(file.table.clone(), TableVersion { step, fingerprint: file.fingerprint.clone() });
            }
            last_commit = Some(commit);
        }
        if let Some(commit) = &last_commit {
            publish(store, commit).await?;
        }
        store.delete_all(layout::STAGING).await?;
        run.latest = latest;
        run.manifest.committed_steps = committed.len() as u64;
        run.manifest.pid = Some(std::process::id());
        Ok(run)
    }

    /// Opens run `run_id` under `root` to read its spec and manifest, without its lease and
    /// without touching its files: safe while another process writes it. It cannot execute.
    pub async fn inspect(root: &ArtifactStore, run_id: &str, registry: &Registry) -> Result<Run, RunError> {
        let mut run = Self::load(root.scoped(run_id), registry).await?;
        run.read_only = true;
        Ok(run)
    }

    /// Reads the manifest and the saved spec, and re-validates the spec with `registry`.
    async fn load(store: ArtifactStore, registry: &Registry) -> Result<Run, RunError> {
        let manifest_bytes =
            store.get(layout::MANIFEST).await?.ok_or_else(|| RunError::NotARun { location: store.describe("") })?;
        let manifest: RunManifest = serde_json::from_slice(&manifest_bytes)
            .map_err(|e| RunError::Corrupt { location: store.describe(layout::MANIFEST), reason: e.to_string() })?;
        let spec_bytes = store
            .get(layout::SPEC)
            .await?
            .ok_or_else(|| RunError::Corrupt { location: store.describe(layout::SPEC), reason: "missing".into() })?;
        let spec_text = String::from_utf8_lossy(&spec_bytes).into_owned();
        let source = SourceDoc::from_text(&spec_text, &store.describe(layout::SPEC)).map_err(SpecErrors::from)?;
        let spec = Spec::from_source(&source, registry)?;
        let hash = spec_hash(&spec);
        // Runs made before hashes were canonical hashed the keys in the order written.
        let written_order =
            || hex(&Sha256::digest(serde_json::to_value(&spec.resolved).unwrap_or_default().to_string()));
        if hash != manifest.spec_hash && written_order() != manifest.spec_hash {
            return Err(RunError::Corrupt {
                location: store.describe(layout::SPEC),
                reason: format!("its hash {hash} differs from the manifest's {}", manifest.spec_hash),
            });
        }
        let pipeline = Pipeline::new(spec, &source)?;
        let resources = Arc::new(pipeline.spec().sections.clone());
        Ok(Run {
            store,
            pipeline: Arc::new(pipeline),
            resources,
            manifest,
            latest: HashMap::new(),
            lease: None,
            read_only: false,
        })
    }

    /// The run's id.
    pub fn id(&self) -> &str {
        &self.manifest.run_id
    }

    /// The run's manifest as it stands.
    pub fn manifest(&self) -> &RunManifest {
        &self.manifest
    }

    /// The pipeline the run executes.
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// Where the run lives, as a person writes it.
    pub fn location(&self) -> String {
        self.store.describe("")
    }

    /// Adds shared resources for the stages (beyond the spec's sections).
    pub fn with_resources(mut self, extend: impl FnOnce(&mut Resources)) -> Run {
        let mut resources = (*self.resources).clone();
        extend(&mut resources);
        self.resources = Arc::new(resources);
        self
    }

    /// Runs the remaining steps. Watches `stop` between and during steps.
    pub async fn execute(
        &mut self,
        progress: &Progress,
        mut stop: watch::Receiver<StopRequest>,
    ) -> Result<RunOutcome, RunError> {
        if self.read_only {
            return Err(RunError::ReadOnly { location: self.store.describe("") });
        }
        let lease = match &mut self.lease {
            Some(lease) => lease,
            None => self.lease.insert(Lease::acquire(&self.store, false).await?),
        };
        lease.keep_alive();
        let steps = self.manifest.steps;
        let span = tracing::info_span!("run", id = %self.manifest.run_id);
        progress.start_steps(steps, self.manifest.committed_steps);
        self.manifest.status = RunStatus::Running;
        self.manifest.error = None;
        self.write_manifest().await?;
        let mut outcome = RunOutcome::Completed;
        while self.manifest.committed_steps < steps {
            if *stop.borrow() != StopRequest::None {
                outcome = RunOutcome::Interrupted;
                break;
            }
            self.check_lease()?;
            let step = self.manifest.committed_steps + 1;
            let step_future = step::run_step(self.step_inputs(step, progress))
                .instrument(tracing::info_span!(parent: &span, "step", step));
            let stop_now = async {
                while *stop.borrow_and_update() != StopRequest::Now {
                    if stop.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            };
            let result = tokio::select! {
                result = step_future => Some(result),
                () = stop_now => None,
            };
            match result {
                Some(Ok(commit)) => {
                    self.check_lease()?;
                    self.committed(commit, progress).await?
                }
                Some(Err(error @ (RunError::StepTaken { .. } | RunError::LeaseLost { .. }))) => {
                    // Another writer owns the run now: leave its staging and manifest alone.
                    progress.finish();
                    self.lease = None;
                    return Err(error);
                }
                Some(Err(error)) => {
                    step::discard_staging(&self.store, step).await;
                    self.stop_with(RunStatus::Failed, Some(error.to_string())).await?;
                    progress.finish();
                    return Err(error);
                }
                None => {
                    step::discard_staging(&self.store, step).await;
                    outcome = RunOutcome::Interrupted;
                    break;
                }
            }
        }
        progress.finish();
        let status = match outcome {
            RunOutcome::Completed => RunStatus::Completed,
            RunOutcome::Interrupted => RunStatus::Interrupted,
        };
        self.stop_with(status, None).await?;
        Ok(outcome)
    }

    fn step_inputs(&self, step: u64, progress: &Progress) -> step::StepJob {
        step::StepJob {
            step,
            store: self.store.clone(),
            pipeline: self.pipeline.clone(),
            resources: self.resources.clone(),
            progress: progress.clone(),
            latest: self.latest.iter().map(|(t, v)| (t.clone(), (v.step, v.fingerprint.clone()))).collect(),
        }
    }

    async fn committed(&mut self, commit: StepCommit, progress: &Progress) -> Result<(), RunError> {
        publish(&self.store, &commit).await?;
        for file in &commit.files {
            self.latest
                .insert(file.table.clone(), TableVersion { step: commit.step, fingerprint: file.fingerprint.clone() });
        }
        self.manifest.committed_steps = commit.step;
        self.manifest.updated_at = commit.committed_at.clone();
        self.write_manifest().await?;
        let rows: u64 = commit.files.iter().map(|f| f.rows).sum();
        tracing::info!(step = commit.step, wall_ms = commit.wall_ms, rows, "step committed");
        progress.step_done(commit.step, &format!("step {} committed, {rows} rows", commit.step));
        Ok(())
    }

    /// Fails, giving up the lease, when another writer took it.
    fn check_lease(&mut self) -> Result<(), RunError> {
        let checked = self.lease.as_ref().map_or(Ok(()), Lease::check);
        if checked.is_err() {
            self.lease = None;
        }
        checked
    }

    /// Records how the run stopped, then releases its lease.
    async fn stop_with(&mut self, status: RunStatus, error: Option<String>) -> Result<(), RunError> {
        self.manifest.status = status;
        self.manifest.error = error;
        let time = now();
        self.manifest.updated_at = time.clone();
        self.manifest.finished_at = Some(time);
        self.write_manifest().await?;
        match self.lease.take() {
            Some(lease) => lease.release().await,
            None => Ok(()),
        }
    }

    async fn write_manifest(&self) -> Result<(), RunError> {
        let json = serde_json::to_vec_pretty(&self.manifest).map_err(|e| RunError::Internal(e.to_string()))?;
        self.store.put(layout::MANIFEST, Bytes::from(json)).await?;
        Ok(())
    }
}

/// Moves a committed step's files from staging to their published place, then deletes the
/// files they supersede. Idempotent, so a crash halfway is finished by running it again.
async fn publish(store: &ArtifactStore, commit: &StepCommit) -> Result<(), RunError> {
    publish_files(store, commit).await?;
    for old in commit.files.iter().flat_map(|f| &f.supersedes) {
        store.delete(old).await?;
    }
    Ok(())
}

async fn publish_files(store: &ArtifactStore, commit: &StepCommit) -> Result<(), RunError> {
    for file in &commit.files {
        let staged = store.exists(&file.staging).await?;
        if store.exists(&file.path).await? {
            if staged {
                store.delete(&file.staging).await?;
            }
        } else if staged {
            store.rename(&file.staging, &file.path).await?;
        } else {
            return Err(RunError::Corrupt {
                location: store.describe(&file.path),
                reason: format!("step {} is committed but this file is neither published nor staged", commit.step),
            });
        }
    }
    Ok(())
}

/// A run id friendly name: lowercase letters, digits and dashes.
fn slug(name: &str) -> String {
    let slug: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    let slug = slug.trim_matches('-').to_string();
    if slug.is_empty() { "run".to_string() } else { slug }
}
