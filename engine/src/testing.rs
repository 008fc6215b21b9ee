//! Support for the workspace's tests: how a test that cannot run says so.

use std::io::Write;

/// Says that `test` did not run and why: on stderr, and as a line of the file that
/// `SESA_SKIPPED` names, which `scripts/test` counts into its closing line. Under CI (`CI` set)
/// it fails the test instead: a CI run never passes a test that did not run.
pub fn skip(test: &str, reason: &str) {
    assert!(std::env::var_os("CI").is_none(), "{test} must run under CI, but {reason}");
    eprintln!("SKIPPED {test}: {reason}");
    if let Some(path) = std::env::var_os("SESA_SKIPPED")
        && let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(path)
    {
        // A skip that cannot be recorded is still said on stderr.
        let _ = writeln!(file, "{test}: {reason}");
    }
}
