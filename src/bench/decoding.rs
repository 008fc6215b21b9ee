//! `sesa bench-decoding`: the `candle` backend's decoding steps alone, per batch size.

use anyhow::Result;
use sesa_models::policy::{KvCacheDtype, ModelFiles, Precision, bench_decoding as time_steps, dense_macs_per_token};

/// `sesa bench-decoding`.
pub async fn bench_decoding(
    model: &str,
    precision: Precision,
    kv_cache_dtype: KvCacheDtype,
    rows: &[usize],
    context: usize,
    steps: usize,
) -> Result<u8> {
    let source = sesa_stages::sections::local_model(model).await?;
    let files = tokio::task::spawn_blocking(move || ModelFiles::read(&source)).await?.map_err(anyhow::Error::msg)?;
    let (rows, model) = (rows.to_vec(), model.to_string());
    tokio::task::spawn_blocking(move || {
        let macs = dense_macs_per_token(&files.weights.shape) as f64;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let timings = time_steps(&files.weights, precision, kv_cache_dtype, &rows, context, steps)
            .map_err(anyhow::Error::msg)?;
        println!(
            "{model}: {} weights, {} KV cache, {context} cached tokens a sequence, {steps} steps a batch size, {threads} threads",
            precision.name(),
            kv_cache_dtype.name()
        );
        println!("(GMAC/s: the dense products' multiply-adds over the whole step's time, attention included)");
        println!("{:>5} {:>12} {:>12} {:>10} {:>10}", "rows", "fastest ms", "median ms", "tokens/s", "GMAC/s");
        for timing in timings {
            let fastest = timing.fastest.as_secs_f64();
            println!(
                "{:>5} {:>12.2} {:>12.2} {:>10.1} {:>10.1}",
                timing.rows,
                fastest * 1e3,
                timing.median.as_secs_f64() * 1e3,
                timing.rows as f64 / fastest,
                timing.rows as f64 * macs / fastest / 1e9
            );
        }
        Ok(0)
    })
    .await?
}
