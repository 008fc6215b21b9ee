//! `sesa data`: data files a spec reads.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sesa_stages::data::datasets::load_questions;
use sesa_stages::data::targets::{TargetOptions, targets_from};

/// `sesa data targets`: the proposer's targets from question sets, written whole or not at all.
pub fn write_targets(questions: &[PathBuf], out: &Path, options: TargetOptions) -> Result<u8> {
    let mut all = Vec::new();
    for path in questions {
        all.extend(load_questions(path)?);
    }
    let made = targets_from(&all, &options);
    if made.targets.is_empty() {
        anyhow::bail!("no gold answers in {} questions: nothing to write", all.len());
    }
    let mut text = String::new();
    for target in &made.targets {
        text.push_str(&serde_json::to_string(target)?);
        text.push('\n');
    }
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    sesa_engine::store::write_whole(out, text.as_bytes()).with_context(|| format!("writing {}", out.display()))?;
    println!(
        "{}: {} targets from {} questions ({} repeated answers and {} without one skipped)",
        out.display(),
        made.targets.len(),
        all.len(),
        made.duplicates,
        made.unanswered
    );
    Ok(0)
}
