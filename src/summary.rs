//! Executing a run from the command line: Ctrl-C handling, then what `sesa run` prints at the
//! end (rows per table and step, the loop's numbers per step, where each stage's time went).

use anyhow::{Context, Result};
use sesa_engine::manifest::{StepCommit, layout};
use sesa_engine::{ArtifactStore, Progress, Run, RunOutcome, StopRequest};
use tokio::sync::watch;

use sesa_stages::selfplay::STEP_SUMMARY;

use crate::cli::{EXIT_INTERRUPTED, split_run_location, truncate};

/// Runs the remaining steps with Ctrl-C handling, then prints a summary.
pub(crate) async fn execute(mut run: Run, progress: &Progress) -> Result<u8> {
    let (stop_sender, stop) = watch::channel(StopRequest::None);
    let signals = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("\nstopping after the current step is committed; press Ctrl-C again to abandon it");
            let _ = stop_sender.send(StopRequest::AfterStep);
        }
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("\nabandoning the current step; committed steps are kept");
            let _ = stop_sender.send(StopRequest::Now);
        }
    });
    let outcome = run.execute(progress, stop).await;
    signals.abort();
    let outcome = outcome
        .with_context(|| format!("run {} stopped; fix the cause, then `sesa resume {}`", run.id(), run.location()))?;
    print_summary(&run).await?;
    print_loop_summary(&run).await?;
    match outcome {
        RunOutcome::Completed => {
            println!(
                "artifacts: {}/tables (DuckDB: read_parquet('{}/tables/<table>/*/*.parquet', hive_partitioning=true))",
                run.location(),
                run.location()
            );
            Ok(0)
        }
        RunOutcome::Interrupted => {
            eprintln!(
                "interrupted after step {}; continue with `sesa resume {}`",
                run.manifest().committed_steps,
                run.location()
            );
            Ok(EXIT_INTERRUPTED)
        }
    }
}

/// The loop's numbers per step, from `step_metrics` (nothing for runs without it).
async fn print_loop_summary(run: &Run) -> Result<()> {
    let (root, run_id) = split_run_location(&run.location())?;
    let root = ArtifactStore::open(&root)?;
    let batches = sesa_engine::read_table(&root, &run_id, "step_metrics").await?;
    if batches.is_empty() {
        return Ok(());
    }
    let mut steps: std::collections::BTreeMap<u64, std::collections::BTreeMap<String, f64>> = Default::default();
    // Per stage: wall, generation and search milliseconds over the run.
    let mut stages: std::collections::BTreeMap<String, [f64; 3]> = Default::default();
    for (step, batch) in &batches {
        let column = |name: &str| batch.column_by_name(name).cloned();
        let (Some(names), Some(metrics), Some(values)) = (column("stage"), column("metric"), column("value")) else {
            continue;
        };
        let names = names.as_any().downcast_ref::<arrow_array::StringArray>().context("step_metrics.stage")?;
        let metrics = metrics.as_any().downcast_ref::<arrow_array::StringArray>().context("step_metrics.metric")?;
        let values = values.as_any().downcast_ref::<arrow_array::Float64Array>().context("step_metrics.value")?;
        let row = steps.entry(*step).or_default();
        for ((stage, metric), value) in names.iter().zip(metrics.iter()).zip(values.iter()) {
            let (Some(stage), Some(metric), Some(value)) = (stage, metric, value) else { continue };
            let slot = ["wall_ms", "generation_ms", "search_ms"].iter().position(|m| *m == metric);
            if let Some(slot) = slot {
                stages.entry(stage.to_string()).or_default()[slot] += value;
            }
            // Tokens add up over stages; for the rest, the last stage to report wins.
            if metric == "tokens" {
                *row.entry(metric.to_string()).or_default() += value;
            } else {
                row.insert(metric.to_string(), value);
            }
        }
    }
    if !steps.values().any(|row| STEP_SUMMARY.iter().any(|(metric, _)| row.contains_key(*metric))) {
        return Ok(());
    }
    let mut header = format!("{:>6}", "step");
    for (_, title) in STEP_SUMMARY {
        header.push_str(&format!(" {title:>9}"));
    }
    println!("{header}");
    for (step, row) in &steps {
        let mut line = format!("{step:>6}");
        for (metric, _) in STEP_SUMMARY {
            let cell = match row.get(*metric) {
                Some(value) if value.fract() == 0.0 => format!("{value:.0}"),
                Some(value) => format!("{value:.3}"),
                None => "-".into(),
            };
            line.push_str(&format!(" {cell:>9}"));
        }
        println!("{line}");
    }
    println!("{:<12} {:>10} {:>12} {:>10}", "stage", "wall s", "generation s", "search s");
    let mut totals = [0.0; 3];
    for (stage, [wall, generation, search]) in &stages {
        println!("{stage:<12} {:>10.1} {:>12.1} {:>10.2}", wall / 1e3, generation / 1e3, search / 1e3);
        totals = [totals[0] + wall, totals[1] + generation, totals[2] + search];
    }
    if totals[0] > 0.0 {
        println!(
            "outside generation and search: {:.1}% of stage time",
            100.0 * (totals[0] - totals[1] - totals[2]).max(0.0) / totals[0]
        );
    }
    Ok(())
}

/// One line per committed step: wall time, then rows per table.
async fn print_summary(run: &Run) -> Result<()> {
    let store = ArtifactStore::open(&run.location()).ok();
    let mut commits: Vec<StepCommit> = Vec::new();
    if let Some(store) = store {
        for step in 1..=run.manifest().committed_steps {
            if let Some(bytes) = store.get(&layout::commit(step)).await? {
                commits.push(serde_json::from_slice(&bytes)?);
            }
        }
    }
    let mut tables: Vec<String> = commits.iter().flat_map(|c| c.files.iter().map(|f| f.table.clone())).collect();
    tables.sort();
    tables.dedup();
    let mut header = format!("{:>6} {:>10}", "step", "wall");
    for table in &tables {
        header.push_str(&format!(" {:>12}", truncate(table, 12)));
    }
    println!("{header}");
    for commit in &commits {
        let mut line = format!("{:>6} {:>9.2}s", commit.step, commit.wall_ms as f64 / 1000.0);
        for table in &tables {
            let files: Vec<_> = commit.files.iter().filter(|f| &f.table == table).collect();
            let rows =
                if files.is_empty() { "-".into() } else { files.iter().map(|f| f.rows).sum::<u64>().to_string() };
            line.push_str(&format!(" {rows:>12}"));
        }
        println!("{line}");
    }
    Ok(())
}
