//! Why a run failed, grouped by who is at fault.

use crate::spec::SpecErrors;
use crate::stage::StageError;
use crate::store::StoreError;

/// Why a run could not be created, resumed or finished.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The spec (or the spec saved in a run) is invalid.
    #[error("{0}")]
    Spec(#[from] SpecErrors),
    /// The artifact store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A stage returned an error.
    // The stage's message is part of this one, not a `source`: a cause chain printed in full
    // would say it twice.
    #[error("stage `{stage}` failed at step {step}: {error}")]
    Stage {
        /// The stage.
        stage: String,
        /// The step.
        step: u64,
        /// What it said.
        error: StageError,
    },
    /// A stage returned a table with other columns than it declared (a bug in the stage).
    #[error("stage `{stage}` wrote table `{table}` with columns ({found}) but declares ({expected})")]
    Schema {
        /// The stage.
        stage: String,
        /// The table.
        table: String,
        /// Declared columns.
        expected: String,
        /// Written columns.
        found: String,
    },
    /// A stage returned a table it does not declare (a bug in the stage).
    #[error("stage `{stage}` wrote table `{table}`, which it does not declare")]
    UndeclaredOutput {
        /// The stage.
        stage: String,
        /// The table.
        table: String,
    },
    /// A stage did not return a table it declares (a bug in the stage).
    #[error("stage `{stage}` did not write table `{table}`, which it declares")]
    MissingOutput {
        /// The stage.
        stage: String,
        /// The table.
        table: String,
    },
    /// A stage runs before the stage that writes one of its inputs ever ran.
    #[error(
        "stage `{stage}` needs table `{table}` at step {step}, but its writer `{writer}` ({schedule}) has not run yet; change one of their schedules"
    )]
    InputNotReady {
        /// The reading stage.
        stage: String,
        /// The step.
        step: u64,
        /// The table.
        table: String,
        /// The writing stage.
        writer: String,
        /// The writer's schedule.
        schedule: String,
    },
    /// The location holds no run.
    #[error("no run at `{location}` (no manifest.json); `sesa runs` lists the runs of a store")]
    NotARun {
        /// Where we looked.
        location: String,
    },
    /// A run's files contradict each other.
    #[error("the run is damaged: `{location}`: {reason}")]
    Corrupt {
        /// The file.
        location: String,
        /// What is wrong.
        reason: String,
    },
    /// Another live process writes this run (it holds the run's lease).
    #[error(
        "run `{location}` is being written by {holder}; wait for it to stop, or pass `--force` if you know it is gone"
    )]
    Held {
        /// The run.
        location: String,
        /// Who holds the lease.
        holder: String,
    },
    /// Another writer took this run's lease while this process was writing it.
    #[error("run `{location}`: its lease was taken by {holder}; this process stops writing it")]
    LeaseLost {
        /// The run.
        location: String,
        /// Who holds the lease now.
        holder: String,
    },
    /// Another writer committed the step this process was about to commit.
    #[error("run `{location}`: step {step} was committed by another writer; this process stops writing it")]
    StepTaken {
        /// The run.
        location: String,
        /// The step.
        step: u64,
    },
    /// The run was opened for reading (`Run::inspect`), not to be executed.
    #[error("run `{location}` was opened for reading only; resume it to run its steps")]
    ReadOnly {
        /// The run.
        location: String,
    },
    /// A bug in sesa.
    #[error("internal error: {0} (a bug in sesa)")]
    Internal(String),
}
