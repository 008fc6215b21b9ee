//! `sesa report`: writes the report once, or with `--watch` after every committed step of the
//! runs until none is running.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use sesa_engine::ArtifactStore;
use sesa_engine::run::RunSummary;

/// Each run's (committed steps, whether a live writer is running it): what a new report
/// waits for. A run marked running whose writer died counts as stopped.
async fn progress(runs: &[(String, String)]) -> Result<Vec<(u64, bool)>> {
    let mut states = Vec::with_capacity(runs.len());
    for (root, id) in runs {
        let location = format!("{}/{id}", root.trim_end_matches('/'));
        let store = ArtifactStore::open(&location)?;
        let run = RunSummary::read(&store).await?.with_context(|| format!("{location} is not a run"))?;
        states.push((run.manifest.committed_steps, run.is_writing()));
    }
    Ok(states)
}

/// `sesa report RUN… --out DIR [--watch]`.
pub async fn report(runs: &[String], out: &Path, watch: bool, interval_s: u64) -> Result<u8> {
    let runs: Vec<(String, String)> =
        runs.iter().map(|r| crate::support::split_run_location(r)).collect::<Result<_>>()?;
    let refresh = watch.then_some(interval_s.max(1) as u32);
    let mut seen = progress(&runs).await?;
    loop {
        let clock = std::time::Instant::now();
        let written = sesa_report::write_report(&runs, out, refresh).await.context("writing the report")?;
        let steps: u64 = seen.iter().map(|(s, _)| s).sum();
        eprintln!(
            "report of {} runs ({steps} steps) → {} ({} files, {:.2} s)",
            runs.len(),
            out.join("report.html").display(),
            written.len(),
            clock.elapsed().as_secs_f64()
        );
        if !watch || seen.iter().all(|(_, writing)| !writing) {
            return Ok(0);
        }
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(interval_s.max(1))) => {}
                _ = tokio::signal::ctrl_c() => return Ok(0),
            }
            let now = progress(&runs).await?;
            if now != seen {
                seen = now;
                break;
            }
        }
    }
}
