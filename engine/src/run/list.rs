//! Listing the runs of a store (`sesa runs`): each run's manifest, committed steps and writer.

use super::{RunError, lease};
use crate::manifest::{RunManifest, RunStatus, layout};
use crate::store::ArtifactStore;

/// A run found in a store, for listings.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// The manifest as written.
    pub manifest: RunManifest,
    /// Where the run lives.
    pub location: String,
    /// Who writes it now, if anyone holds its lease (it may be a writer that died).
    pub lease: Option<lease::LeaseHolder>,
}

impl RunSummary {
    /// The run in `store`, with its committed steps counted from the commit records; `None`
    /// where there is no readable manifest.
    pub async fn read(store: &ArtifactStore) -> Result<Option<RunSummary>, RunError> {
        let Some(bytes) = store.get(layout::MANIFEST).await? else { return Ok(None) };
        let Ok(mut manifest) = serde_json::from_slice::<RunManifest>(&bytes) else { return Ok(None) };
        // The manifest is updated after each commit; the commit records are the truth.
        let committed = store.list(layout::COMMITS).await?.iter().filter_map(|k| layout::commit_step(k)).count();
        manifest.committed_steps = committed as u64;
        let lease = lease::read_lease(store).await.unwrap_or(None);
        Ok(Some(RunSummary { manifest, location: store.describe(""), lease }))
    }

    /// Whether a live writer is running it now (marked running, and its lease's holder alive).
    pub fn is_writing(&self) -> bool {
        self.manifest.status == RunStatus::Running
            && self.lease.as_ref().is_some_and(|holder| holder.liveness() == lease::Liveness::Alive)
    }

    /// The status to show: a run marked running whose writer is gone (no lease, or its holder
    /// is dead) is `stopped`, wherever it was started.
    pub fn status(&self) -> String {
        match self.manifest.status {
            RunStatus::Running if !self.is_writing() => "stopped".to_string(),
            status => status.to_string(),
        }
    }
}

/// The runs under `root`, oldest first. Directories without a readable manifest are skipped.
pub async fn list_runs(root: &ArtifactStore) -> Result<Vec<RunSummary>, RunError> {
    let mut runs = Vec::new();
    for name in root.list_dirs("").await? {
        if let Some(summary) = RunSummary::read(&root.scoped(&name)).await? {
            runs.push(summary);
        }
    }
    runs.sort_by(|a, b| a.manifest.created_at.cmp(&b.manifest.created_at));
    Ok(runs)
}
