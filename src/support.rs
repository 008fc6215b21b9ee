//! What the command modules share: the exit codes, the code version runs record, run
//! locations as users write them, and text cut to a column.

use std::path::Path;

use anyhow::{Context, Result};

/// Exit code of a command that failed.
pub(crate) const EXIT_FAILURE: u8 = 1;
/// Exit code of an invalid spec or command line.
pub(crate) const EXIT_INVALID_SPEC: u8 = 2;
/// Exit code of a run stopped by Ctrl-C (as a shell reports SIGINT).
pub(crate) const EXIT_INTERRUPTED: u8 = 130;

/// The version and commit of this binary, as runs record it.
pub(crate) fn code_version() -> &'static str {
    concat!(env!("CARGO_PKG_VERSION"), " (", env!("SESA_GIT_COMMIT"), ")")
}

/// `text` cut to `width` characters, an ellipsis marking the cut.
pub(crate) fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width { text.to_string() } else { text.chars().take(width - 1).chain(['…']).collect() }
}

/// Splits `runs/<id>` or `s3://bucket/prefix/<id>` into the store root and the run id.
pub(crate) fn split_run_location(location: &str) -> Result<(String, String)> {
    let trimmed = location.trim_end_matches('/');
    if trimmed.contains("://") {
        let (root, id) = trimmed
            .rsplit_once('/')
            .filter(|(root, _)| !root.ends_with(':') && !root.ends_with('/'))
            .with_context(|| format!("`{location}` is not a run location; expected s3://bucket/prefix/<run-id>"))?;
        return Ok((root.to_string(), id.to_string()));
    }
    let path = Path::new(trimmed);
    let id = path
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("`{location}` is not a run directory; expected runs/<run-id>"))?;
    let root =
        path.parent().map(|p| p.to_string_lossy().into_owned()).filter(|p| !p.is_empty()).unwrap_or_else(|| ".".into());
    Ok((root, id.to_string()))
}
