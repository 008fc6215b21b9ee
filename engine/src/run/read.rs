//! Reading a run's tables: the committed batches of a table, from the steps' commit records,
//! without writing anything (safe while the run is live).

use arrow_array::RecordBatch;

use super::RunError;
use crate::manifest::{CommittedFile, StepCommit, layout};
use crate::store::ArtifactStore;
use crate::table::decode_parquet;

/// Every committed batch of `table` in run `run_id` under `root`, in step order (within a step,
/// in the order of the commit record), with the step that wrote it. Read-only: safe while the
/// run is live, and it sees a committed step whose files are not published yet.
pub async fn read_table(root: &ArtifactStore, run_id: &str, table: &str) -> Result<Vec<(u64, RecordBatch)>, RunError> {
    read_table_steps(root, run_id, table, Steps::All).await
}

/// Which committed steps of a table to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Steps {
    /// Every one.
    All,
    /// The last step that wrote the table.
    Last,
    /// This step only.
    Only(u64),
}

/// [`read_table`] of the chosen steps only: the others' files are never fetched or decoded
/// (a table of large snapshots, such as model checkpoints, is read one step at a time).
pub async fn read_table_steps(
    root: &ArtifactStore,
    run_id: &str,
    table: &str,
    which: Steps,
) -> Result<Vec<(u64, RecordBatch)>, RunError> {
    let store = root.scoped(run_id);
    if !store.exists(layout::MANIFEST).await? {
        return Err(RunError::NotARun { location: store.describe("") });
    }
    let mut steps: Vec<u64> =
        store.list(layout::COMMITS).await?.iter().filter_map(|k| layout::commit_step(k)).collect();
    steps.sort_unstable();
    let mut commits = Vec::with_capacity(steps.len());
    for step in steps {
        commits.push((step, read_commit(&store, step).await?));
    }
    let superseded: std::collections::HashSet<&str> = commits
        .iter()
        .flat_map(|(_, c)| c.files.iter().flat_map(|f| f.supersedes.iter().map(String::as_str)))
        .collect();
    let files: Vec<(u64, &CommittedFile)> = commits
        .iter()
        .flat_map(|(step, c)| c.files.iter().map(move |f| (*step, f)))
        .filter(|(_, f)| f.table == table && !superseded.contains(f.path.as_str()))
        .collect();
    let chosen = match which {
        Steps::All => None,
        Steps::Last => files.last().map(|(step, _)| *step),
        Steps::Only(step) => Some(step),
    };
    let mut batches = Vec::new();
    for (step, file) in files.into_iter().filter(|(step, _)| chosen.is_none_or(|chosen| chosen == *step)) {
        let bytes = match store.get(&file.path).await? {
            Some(bytes) => bytes,
            None => store.get(&file.staging).await?.ok_or_else(|| RunError::Corrupt {
                location: store.describe(&file.path),
                reason: "committed but missing".into(),
            })?,
        };
        let batch = tokio::task::spawn_blocking(move || decode_parquet(bytes))
            .await
            .map_err(|e| RunError::Internal(e.to_string()))?
            .map_err(|e| RunError::Corrupt { location: store.describe(&file.path), reason: e.to_string() })?;
        batches.push((step, batch));
    }
    Ok(batches)
}

/// The commit record of `step`.
pub(super) async fn read_commit(store: &ArtifactStore, step: u64) -> Result<StepCommit, RunError> {
    let key = layout::commit(step);
    let bytes = store
        .get(&key)
        .await?
        .ok_or_else(|| RunError::Corrupt { location: store.describe(&key), reason: "missing".into() })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| RunError::Corrupt { location: store.describe(&key), reason: e.to_string() })
}
