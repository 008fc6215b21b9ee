//! `sesa report`: the paper's tables and Figure 3 from runs' artifacts.
//!
//! Runs are matched to the paper's rows by spec name: `ssp`, `sesa`, and the ablations
//! (`sesa-no-priming`, `sesa-no-frontier`, `sesa-no-distillation`; `ablation_*` names work as
//! well). Runs of one name pool their evaluations, so a training run and a later `sesa eval` of
//! it fill one row. A table cell holds the last evaluation of a mode: `base` (Table 1's base),
//! `memory_off` (SSP; SESA-Off), `memory_on` (SESA-On, +SESA, Table 3). The score is judge
//! accuracy where every answer was judged, else exact match, and the report says which.
//!
//! Output: `report.md` (figures as PNG files beside it), `report.html` (one self-contained page,
//! figures inline as SVG) and each figure as `<name>.png` and `<name>.svg`. Every file is
//! written to a temporary name and renamed, so a page being watched is never half-written.

mod data;
mod document;
mod figures;
mod paper;

use std::path::{Path, PathBuf};

pub use data::{EvalRecord, RunData, Score};
pub use document::Report;

/// Why a report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The artifact store failed.
    #[error(transparent)]
    Store(#[from] sesa_engine::StoreError),
    /// A table could not be read.
    #[error(transparent)]
    Run(#[from] sesa_engine::RunError),
    /// No run at that location.
    #[error("{0} is not a run (it has no manifest.json)")]
    NotARun(String),
    /// A run's files do not parse.
    #[error("{0}")]
    Corrupt(String),
    /// A figure could not be drawn.
    #[error("drawing figure `{name}`: {reason}")]
    Figure {
        /// The figure.
        name: String,
        /// What failed.
        reason: String,
    },
    /// The output directory could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// Reads the runs (each a store root and a run id) and writes the report into `out`;
/// `refresh_s` makes the page reload itself (for `--watch`). Returns the paths written.
pub async fn write_report(
    runs: &[(String, String)],
    out: &Path,
    refresh_s: Option<u32>,
) -> Result<Vec<PathBuf>, ReportError> {
    let mut loaded = Vec::with_capacity(runs.len());
    for (root, id) in runs {
        loaded.push(RunData::load(root, id).await?);
    }
    let report = Report::new(loaded);
    report.write(out, refresh_s)
}

/// Writes `bytes` to `path` through a temporary file and a rename.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    sesa_engine::store::write_whole(path, bytes)
        .map_err(|source| ReportError::Write { path: path.to_path_buf(), source })
}
