//! `sesa index bench`: query latency, throughput and recall of an index on a question set.

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use sesa_stages::data::datasets::load_questions;
use sesa_stages::search::{Bm25Index, supporting_title_recall};

/// Runs every question as a query, one at a time (latency) and as one batch on every core
/// (throughput), and reports recall of the supporting titles when the set has them.
pub fn bench_index(index: &Path, questions: &Path, k: usize) -> Result<u8> {
    let index = Bm25Index::open(index)?;
    let questions = load_questions(questions)?;
    let queries: Vec<String> = questions.iter().map(|q| q.question.clone()).collect();
    let mut latencies = Vec::with_capacity(queries.len());
    for query in &queries {
        let clock = Instant::now();
        index.search_one(query, k)?;
        latencies.push(clock.elapsed().as_secs_f64() * 1e3);
    }
    latencies.sort_by(f64::total_cmp);
    let percentile = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    let clock = Instant::now();
    let results = index.search_batch(&queries, k)?;
    let batch_seconds = clock.elapsed().as_secs_f64();
    println!("passages          {}", index.len());
    println!("queries           {}", queries.len());
    println!("p50 latency       {:.3} ms (one query at a time, k={k})", percentile(0.50));
    println!("p99 latency       {:.3} ms", percentile(0.99));
    println!("batch throughput  {:.0} queries/s (one batch, every core)", queries.len() as f64 / batch_seconds);
    if questions.iter().any(|q| !q.supporting_titles.is_empty()) {
        for cut in [3, 10].into_iter().filter(|&c| c <= k) {
            let recall = supporting_title_recall(&questions, &results, cut);
            println!("recall@{cut:<2}         {recall:.4} (supporting titles)");
        }
    }
    Ok(0)
}
