//! What a run records about itself: `manifest.json` (the run), one commit record per step, and
//! the layout of keys in the run's store.
//!
//! The commit record of step n is the single point that publishes step n: its tables are
//! written under `_staging/` first, and only a step whose record exists counts. Records are
//! one small file per step, so a commit costs the same at step 1 and step 100,000.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The state of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Steps are being run (or the process died: see [`RunManifest::pid`]).
    Running,
    /// Every step is committed.
    Completed,
    /// A stage failed; `sesa resume` retries from the last committed step.
    Failed,
    /// Stopped by Ctrl-C after the last committed step.
    Interrupted,
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = match self {
            RunStatus::Running => "running",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Interrupted => "interrupted",
        };
        f.write_str(text)
    }
}

/// `manifest.json`: what the run is. Per-step facts live in the commit records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunManifest {
    /// The run's id; also its directory name.
    pub run_id: String,
    /// The spec's name.
    pub name: String,
    /// SHA-256 of the resolved spec (canonical JSON).
    pub spec_hash: String,
    /// The run seed.
    pub seed: u64,
    /// Steps planned.
    pub steps: u64,
    /// Steps committed so far.
    pub committed_steps: u64,
    /// The sesa version and commit that wrote the run.
    pub code_version: String,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
    /// When the last step was committed or the run stopped, RFC 3339.
    pub finished_at: Option<String>,
    /// Where the run stands.
    pub status: RunStatus,
    /// The error that stopped the run, if any.
    pub error: Option<String>,
    /// The process that last worked on the run, so `sesa runs` can tell a dead run.
    pub pid: Option<u32>,
}

/// The record that commits one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepCommit {
    /// The step, from 1.
    pub step: u64,
    /// RFC 3339.
    pub started_at: String,
    /// RFC 3339.
    pub committed_at: String,
    /// Wall time of the step, in milliseconds.
    pub wall_ms: u64,
    /// Each stage that ran, by name.
    pub stages: BTreeMap<String, StageRecord>,
    /// The tables the step published.
    pub files: Vec<CommittedFile>,
}

/// What one stage did in one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageRecord {
    /// The stage's kind.
    pub kind: String,
    /// SHA-256 over kind, config, seed, step and input fingerprints: equal fingerprints mean
    /// equal outputs for a deterministic stage.
    pub fingerprint: String,
    /// Input tables and the step and fingerprint they came from.
    pub inputs: BTreeMap<String, InputRecord>,
    /// Rows written per output table.
    pub rows: BTreeMap<String, u64>,
    /// Wall time, in milliseconds.
    pub wall_ms: u64,
}

/// Which version of a table a stage read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputRecord {
    /// The step that wrote it.
    pub step: u64,
    /// The writer's fingerprint at that step.
    pub fingerprint: String,
}

/// One published table file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommittedFile {
    /// The table.
    pub table: String,
    /// Where it was staged.
    pub staging: String,
    /// Where it is published.
    pub path: String,
    /// Rows in the file.
    pub rows: u64,
    /// Bytes in the file.
    pub bytes: u64,
    /// The fingerprint of the stage that wrote it.
    pub fingerprint: String,
    /// Published files of earlier steps this one supersedes (a table that keeps only some
    /// versions): deleted once this step is published, skipped by readers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supersedes: Vec<String>,
}

/// Keys inside a run's store.
pub mod layout {
    /// The run manifest.
    pub const MANIFEST: &str = "manifest.json";
    /// The resolved spec, as YAML.
    pub const SPEC: &str = "spec.yaml";
    /// Commit records.
    pub const COMMITS: &str = "commits";
    /// Staged, uncommitted tables.
    pub const STAGING: &str = "_staging";

    /// The commit record of `step`.
    pub fn commit(step: u64) -> String {
        format!("{COMMITS}/step-{step:08}.json")
    }

    /// The step of a commit record key.
    pub fn commit_step(key: &str) -> Option<u64> {
        key.strip_prefix(COMMITS)?.strip_prefix("/step-")?.strip_suffix(".json")?.parse().ok()
    }

    /// Where `stage` publishes `table` of `step`: hive-partitioned by step, one file per
    /// writer (a table may have several writers, see `Pipeline`).
    pub fn table(table: &str, step: u64, stage: &str) -> String {
        format!("tables/{table}/step={step}/{stage}.parquet")
    }

    /// Where `stage` stages `table` of `step` before the commit. Flat, so that publishing by
    /// rename leaves no empty directories behind on a local disk.
    pub fn staging(table: &str, step: u64, stage: &str) -> String {
        format!("{}{table}.{stage}.parquet", staging_step_prefix(step))
    }

    /// The common prefix of the staged files of `step`.
    pub fn staging_step_prefix(step: u64) -> String {
        format!("{STAGING}/step-{step:08}-")
    }
}

/// Now, as RFC 3339 with milliseconds.
pub(crate) fn now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}
