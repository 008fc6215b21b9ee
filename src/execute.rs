//! Executing a run from the command line: Ctrl-C handling, then what `sesa run` prints at the
//! end (rows per table and step, the loop's numbers per step, where each stage's time went).

use anyhow::{Context, Result};
use sesa_engine::manifest::{StepCommit, layout};
use sesa_engine::{ArtifactStore, Progress, Run, RunOutcome, StopRequest};
use tokio::sync::watch;

use sesa_stages::selfplay::STEP_SUMMARY;

use crate::support::{EXIT_INTERRUPTED, split_run_location, truncate};

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
    let order: Vec<String> = run.pipeline().spec().stages.iter().map(|s| s.name.clone()).collect();
    print!("{}", loop_summary(&batches, &order)?);
    Ok(())
}

/// The text of [`print_loop_summary`]: a row of [`STEP_SUMMARY`] numbers per step; per
/// benchmark, its exact match at each evaluation in run order (steps, then the spec's stage
/// `order`: a warm start's evaluation before and after it reads as one line); then each stage's
/// wall time split into generation, search and training (`generation_ms`, `search_ms`,
/// `train_ms`), and the share of stage time that none of them explains.
fn loop_summary(batches: &[(u64, arrow_array::RecordBatch)], order: &[String]) -> Result<String> {
    use std::fmt::Write;
    let mut out = String::new();
    // Per benchmark: (step, stage's place in `order`, stage, exact match).
    let mut evaluations: std::collections::BTreeMap<String, Vec<(u64, usize, String, f64)>> = Default::default();
    let mut steps: std::collections::BTreeMap<u64, std::collections::BTreeMap<String, f64>> = Default::default();
    // Per stage: wall, generation, search and training milliseconds over the run.
    let mut stages: std::collections::BTreeMap<String, [f64; 4]> = Default::default();
    for (step, batch) in batches {
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
            if let Some(benchmark) = metric.strip_suffix("/em").filter(|b| !b.contains('/') && *b != "average") {
                let place = order.iter().position(|s| s == stage).unwrap_or(order.len());
                evaluations.entry(benchmark.to_string()).or_default().push((*step, place, stage.to_string(), value));
            }
            let slot = ["wall_ms", "generation_ms", "search_ms", "train_ms"].iter().position(|m| *m == metric);
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
        return Ok(out);
    }
    let mut header = format!("{:>6}", "step");
    for (_, title) in STEP_SUMMARY {
        header.push_str(&format!(" {title:>9}"));
    }
    writeln!(out, "{header}")?;
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
        writeln!(out, "{line}")?;
    }
    for (benchmark, mut points) in evaluations {
        points.sort_by_key(|&(step, place, _, _)| (step, place));
        let points: Vec<String> =
            points.iter().map(|(step, _, stage, em)| format!("{:.1}% ({stage}, step {step})", 100.0 * em)).collect();
        writeln!(out, "{benchmark} exact match: {}", points.join(" → "))?;
    }
    writeln!(out, "{:<16} {:>10} {:>12} {:>10} {:>10}", "stage", "wall s", "generation s", "search s", "training s")?;
    let mut totals = [0.0; 4];
    for (stage, times) in &stages {
        let [wall, generation, search, training] = times.map(|ms| ms / 1e3);
        writeln!(out, "{stage:<16} {wall:>10.1} {generation:>12.1} {search:>10.2} {training:>10.1}")?;
        totals.iter_mut().zip(times).for_each(|(total, ms)| *total += ms);
    }
    let [wall, generation, search, training] = totals;
    if wall > 0.0 {
        writeln!(
            out,
            "outside generation, search and training: {:.1}% of stage time",
            100.0 * (wall - generation - search - training).max(0.0) / wall
        )?;
    }
    Ok(out)
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Float64Array, RecordBatch, StringArray};

    fn metrics(rows: &[(&str, &str, f64)]) -> RecordBatch {
        let stages = StringArray::from_iter_values(rows.iter().map(|r| r.0));
        let names = StringArray::from_iter_values(rows.iter().map(|r| r.1));
        RecordBatch::try_from_iter([
            ("stage", Arc::new(stages) as arrow_array::ArrayRef),
            ("metric", Arc::new(names)),
            ("value", Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.2)))),
        ])
        .unwrap()
    }

    /// Training and evaluation time count as what they are, not as time outside everything.
    #[test]
    fn training_and_evaluation_time_are_attributed() {
        let step = metrics(&[
            ("warmup", "train_ms", 9_000.0),
            ("warmup", "wall_ms", 10_000.0),
            ("eval", "generation_ms", 3_000.0),
            ("eval", "search_ms", 500.0),
            ("eval", "wall_ms", 4_000.0),
            ("solve", "valid_rate", 0.5),
            ("solve", "generation_ms", 1_000.0),
            ("solve", "wall_ms", 1_000.0),
        ]);
        let text = super::loop_summary(&[(1, step)], &[]).unwrap();
        let line =
            |stage: &str| text.lines().find(|l| l.starts_with(stage)).unwrap().split_whitespace().collect::<Vec<_>>();
        assert_eq!(line("warmup"), ["warmup", "10.0", "0.0", "0.00", "9.0"], "{text}");
        assert_eq!(line("eval"), ["eval", "4.0", "3.0", "0.50", "0.0"], "{text}");
        // (15 − 4 − 0.5 − 9) s of 15 s.
        assert!(text.contains("outside generation, search and training: 10.0% of stage time"), "{text}");
    }

    /// A benchmark's evaluations read as one line in run order: steps, then the spec's order
    /// of stages (not their names' order).
    #[test]
    fn evaluations_of_a_benchmark_read_as_one_line_in_run_order() {
        let first = metrics(&[
            ("after", "held_out/em", 0.4),
            ("after", "held_out/hops1/em", 0.9),
            ("after", "average/em", 0.4),
            ("before", "held_out/em", 0.0),
            ("solve", "valid_rate", 0.5),
        ]);
        let third = metrics(&[("eval", "held_out/em", 0.45)]);
        let order = ["before", "warmup", "after", "solve", "eval"].map(String::from);
        let text = super::loop_summary(&[(1, first), (3, third)], &order).unwrap();
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("exact match")).collect();
        assert_eq!(
            lines,
            ["held_out exact match: 0.0% (before, step 1) → 40.0% (after, step 1) → 45.0% (eval, step 3)"],
            "{text}"
        );
    }
}
