//! The wall time of `sesa report` on a 200-step run. Run with `cargo bench -p sesa-report`.
//!
//! The run is synthetic but shaped like a real one: every step the loop's ~30 metrics in
//! `step_metrics`, and every 10 steps an evaluation of 7 benchmarks × 500 questions with memory
//! on and off (7,000 `evals` rows with question, answers and prediction text), written through
//! the engine like any run.

use std::time::Instant;

use sesa_engine::columns::Columns;
use sesa_engine::*;

struct SyntheticLoop;

#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct NoConfig {}

const METRICS: [&str; 10] = [
    "valid_rate",
    "pass_rate",
    "solver_success",
    "mean_p_hat",
    "frontier_share",
    "proposer_reward_mean",
    "bank_size",
    "queue_length",
    "tokens",
    "wall_ms",
];
const STAGES: [&str; 3] = ["propose", "reward", "consolidate"];
const BENCHMARKS: [&str; 7] = ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"];

fn evals(step: u64) -> Result<arrow_array::RecordBatch, arrow_schema::ArrowError> {
    let rows: Vec<(&str, &str, usize)> = ["memory_off", "memory_on"]
        .into_iter()
        .flat_map(|mode| BENCHMARKS.into_iter().flat_map(move |b| (0..500).map(move |q| (mode, b, q))))
        .collect();
    let question = "Which river flows through the capital of the country where the author of the novel was born?";
    let right = |q: usize| (q as u64 + step).is_multiple_of(3);
    Columns::default()
        .str("mode", rows.iter().map(|r| r.0))
        .str("benchmark", rows.iter().map(|r| r.1))
        .str("question_id", rows.iter().map(|_| "q-000123"))
        .str("question", rows.iter().map(|_| question))
        .strs("golden_answers", rows.iter().map(|_| ["the Danube", "Danube"]))
        .opt_str("prediction", rows.iter().map(|_| Some("the Danube river")))
        .f64("em", rows.iter().map(|r| f64::from(u8::from(right(r.2)))))
        .f64("f1", rows.iter().map(|r| if right(r.2) { 1.0 } else { 0.4 }))
        .opt_f64("accuracy", rows.iter().map(|r| Some(f64::from(u8::from(right(r.2) || r.2 % 7 == 0)))))
        .u64("policy_version", rows.iter().map(|_| step))
        .u64("bank_version", rows.iter().map(|_| step / 10))
        .finish()
}

impl Stage for SyntheticLoop {
    const KIND: &'static str = "synthetic_loop";
    const ABOUT: &'static str = "writes a loop's metrics every step and evaluations every 10";
    type Config = NoConfig;
    fn new(_: NoConfig) -> Result<Self, Vec<ConfigProblem>> {
        Ok(SyntheticLoop)
    }
    fn outputs(&self) -> Vec<TableSpec> {
        let metrics = Columns::default().str("stage", []).str("metric", []).f64("value", []).finish().unwrap();
        vec![TableSpec::new("step_metrics", metrics.schema()), TableSpec::new("evals", evals(0).unwrap().schema())]
    }
    async fn run(&self, cx: &StageContext, _inputs: Tables) -> Result<Tables, StageError> {
        let step = cx.step();
        let rows: Vec<(&str, &str, f64)> = STAGES
            .iter()
            .flat_map(|s| {
                METRICS.iter().enumerate().map(move |(i, m)| (*s, *m, (step * 7 + i as u64) as f64 % 11.0 / 11.0))
            })
            .collect();
        let metrics = Columns::default()
            .str("stage", rows.iter().map(|r| r.0))
            .str("metric", rows.iter().map(|r| r.1))
            .f64("value", rows.iter().map(|r| r.2))
            .finish()
            .map_err(|e| StageError::Failed(e.to_string()))?;
        let evals = if step.is_multiple_of(10) { evals(step) } else { evals(0).map(|b| b.slice(0, 0)) };
        Ok(Tables::new()
            .with("step_metrics", metrics)
            .with("evals", evals.map_err(|e| StageError::Failed(e.to_string()))?))
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mut registry = Registry::new();
        registry.stage::<SyntheticLoop>();
        let spec = dir.path().join("sesa.yaml");
        std::fs::write(&spec, "name: sesa\nseed: 1\nsteps: 200\nstages:\n  loop: {kind: synthetic_loop}\n").unwrap();
        let pipeline = load_pipeline(&spec, &[], &registry).unwrap();
        let root = dir.path().join("runs");
        let store = ArtifactStore::open(root.to_str().unwrap()).unwrap();
        let mut run = Run::create(&store, pipeline, "bench").await.unwrap();
        let (_keep, stop) = tokio::sync::watch::channel(StopRequest::None);
        run.execute(&Progress::new(ProgressMode::Hidden), stop).await.unwrap();
        let runs = [(root.to_string_lossy().into_owned(), run.id().to_string())];
        let out = dir.path().join("report");
        let mut times = Vec::new();
        for _ in 0..3 {
            let clock = Instant::now();
            sesa_report::write_report(&runs, &out, None).await.unwrap();
            times.push(clock.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        println!(
            "sesa report, one 200-step run (6,000 step_metrics rows, 140,000 evals rows), 6 figures as PNG and SVG: \
             median {:.2} s of 3 (min {:.2} s)",
            times[1], times[0]
        );
    });
}
