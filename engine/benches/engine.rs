//! Engine overhead and Parquet throughput. Run with `cargo bench -p sesa-engine`.
//!
//! 1. Scheduling + commit cost per step: 1,000 steps of 8 no-op stages (a chain and a fan-out),
//!    on the in-memory store and on a local directory.
//! 2. Parquet write throughput for rollout-like rows (text, token ids, log-probs, rewards).

use std::sync::Arc;
use std::time::Instant;

use arrow_array::builder::{Float32Builder, ListBuilder, StringBuilder, UInt32Builder};
use arrow_array::{Float32Array, RecordBatch, UInt64Array};
use arrow_schema::{DataType, Field, Schema};
use bytes::Bytes;
use sesa_engine::table::encode_parquet;
use sesa_engine::*;

struct Noop;

#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct NoConfig {}

impl Stage for Noop {
    const KIND: &'static str = "noop";
    const ABOUT: &'static str = "does nothing";
    type Config = NoConfig;
    fn new(_: NoConfig) -> Result<Self, Vec<ConfigProblem>> {
        Ok(Noop)
    }
    fn outputs(&self) -> Vec<TableSpec> {
        Vec::new()
    }
    async fn run(&self, _cx: &StageContext, _inputs: Tables) -> Result<Tables, StageError> {
        Ok(Tables::new())
    }
}

fn noop_spec(steps: u64) -> String {
    let mut text = format!("name: bench\nseed: 1\nsteps: {steps}\nstages:\n  s0: {{kind: noop}}\n");
    for i in 1..8 {
        // Half a chain, half a fan-out from s0: both shapes of scheduling.
        let parent = if i < 4 { format!("s{}", i - 1) } else { "s0".to_string() };
        text.push_str(&format!("  s{i}: {{kind: noop, after: [{parent}]}}\n"));
    }
    text
}

async fn engine_overhead(store: &ArtifactStore, label: &str, steps: u64) {
    let mut registry = Registry::new();
    registry.stage::<Noop>();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.yaml");
    std::fs::write(&path, noop_spec(steps)).unwrap();
    let pipeline = load_pipeline(&path, &[], &registry).unwrap();
    let mut run = Run::create(store, pipeline, "bench").await.unwrap();
    let (_keep, stop) = tokio::sync::watch::channel(StopRequest::None);
    let clock = Instant::now();
    run.execute(&Progress::new(ProgressMode::Hidden), stop).await.unwrap();
    let elapsed = clock.elapsed();
    let per_step = elapsed.as_secs_f64() / steps as f64;
    println!(
        "engine overhead [{label}]: {steps} steps x 8 no-op stages in {:.2}s = {:.3} ms/step ({:.1} us/stage); \
         share of a 60 s step: {:.4}%",
        elapsed.as_secs_f64(),
        per_step * 1e3,
        per_step * 1e6 / 8.0,
        per_step / 60.0 * 100.0
    );
}

fn rollout_batch(rows: usize) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("question", DataType::Utf8, false),
        Field::new("text", DataType::Utf8, false),
        Field::new("token_ids", DataType::List(Arc::new(Field::new("item", DataType::UInt32, true))), false),
        Field::new("logprobs", DataType::List(Arc::new(Field::new("item", DataType::Float32, true))), false),
        Field::new("reward", DataType::Float32, false),
        Field::new("rollout", DataType::UInt64, false),
    ]));
    let mut question = StringBuilder::new();
    let mut text = StringBuilder::new();
    let mut ids = ListBuilder::new(UInt32Builder::new());
    let mut logprobs = ListBuilder::new(Float32Builder::new());
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let words = ["search", "the", "capital", "of", "Veltria", "born", "in", "river", "<search>", "</answer>"];
    for _ in 0..rows {
        question.append_value("Who founded the company that employs the mayor of the town where Ada Brisk was born?");
        let trajectory: Vec<&str> = (0..400).map(|_| words[(next() % words.len() as u64) as usize]).collect();
        text.append_value(trajectory.join(" "));
        for _ in 0..500 {
            ids.values().append_value((next() % 49_152) as u32);
            logprobs.values().append_value(-((next() % 1000) as f32) / 250.0);
        }
        ids.append(true);
        logprobs.append(true);
    }
    let rewards = Float32Array::from_iter_values((0..rows).map(|i| (i % 2) as f32));
    let rollout = UInt64Array::from_iter_values(0..rows as u64);
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(question.finish()),
            Arc::new(text.finish()),
            Arc::new(ids.finish()),
            Arc::new(logprobs.finish()),
            Arc::new(rewards),
            Arc::new(rollout),
        ],
    )
    .unwrap()
}

async fn parquet_throughput(store: &ArtifactStore) {
    let rows = 5_000;
    let batch = rollout_batch(rows);
    let in_memory = batch.get_array_memory_size() as f64;
    let clock = Instant::now();
    let rounds = 3;
    let mut written = 0usize;
    for round in 0..rounds {
        let encoded: Bytes = encode_parquet(&batch).unwrap();
        written = encoded.len();
        store.put(&format!("bench/part-{round}.parquet"), encoded).await.unwrap();
    }
    let seconds = clock.elapsed().as_secs_f64() / rounds as f64;
    println!(
        "parquet write [rollout-like rows, zstd, local disk]: {:.0} rows/s, {:.1} MB/s of Arrow data in, {:.1} MB/s of Parquet out ({} rows: {:.1} MB Arrow -> {:.1} MB Parquet)",
        rows as f64 / seconds,
        in_memory / seconds / 1e6,
        written as f64 / seconds / 1e6,
        rows,
        in_memory / 1e6,
        written as f64 / 1e6
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test` runs benches with no such flag: keep that fast.
    let steps = if std::env::args().any(|a| a == "--bench") { 1000 } else { 20 };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        engine_overhead(&ArtifactStore::in_memory(), "memory store", steps).await;
        let dir = tempfile::tempdir().unwrap();
        let local = ArtifactStore::open(dir.path().to_str().unwrap()).unwrap();
        engine_overhead(&local, "local directory", steps).await;
        parquet_throughput(&local).await;
    });
}
