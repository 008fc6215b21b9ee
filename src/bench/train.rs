//! `sesa bench-train`: one training step (forward, backward, AdamW), as `benches/train.sh`
//! runs it in PyTorch beside it.

use anyhow::Result;

/// `sesa bench-train`.
pub async fn bench_train(model: &str, tokens: usize, method: &str, steps: usize, scored: f64) -> Result<u8> {
    use sesa_stages::train::{LoraMethod, Method, OptimizerConfig, TrainModel, TrainSequence, Trainer, new_adapters};
    let method = match method {
        "full" => Method::Full,
        "lora" => Method::Lora(LoraMethod {
            rank: 16,
            alpha: 32.0,
            targets: sesa_stages::train::MODULES.iter().map(|m| m.to_string()).collect(),
        }),
        other => anyhow::bail!("--method must be `full` or `lora`, not `{other}`"),
    };
    let source = sesa_stages::sections::local_model(model).await?;
    let files = tokio::task::spawn_blocking(move || sesa_stages::policy::ModelFiles::read(&source))
        .await?
        .map_err(anyhow::Error::msg)?;
    tokio::task::spawn_blocking(move || {
        let ids = sesa_stages::policy::bench_token_ids(tokens, files.weights.shape.vocabulary);
        let first_scored = tokens - ((tokens - 1) as f64 * scored.clamp(0.0, 1.0)).round() as usize;
        let mask = (0..tokens).map(|i| u8::from(i >= first_scored.max(1))).collect();
        let sequence = TrainSequence { tokens: ids, mask };
        let mut model = TrainModel::new(files.weights);
        if let Method::Lora(LoraMethod { rank, alpha, targets }) = &method {
            model.adapters = Some(new_adapters(&model.weights, *rank, *alpha, targets, 0));
        }
        let trained: usize = model.trained().iter().map(|t| t.len()).sum();
        let mut trainer = Trainer::new(model, tokens);
        let optimizer = OptimizerConfig::adamw(1e-5);
        println!("training {tokens} tokens, {} scored, {trained} trained parameters", sequence.positions().len());
        let mut times = Vec::new();
        for step in 0..steps.max(1) {
            let clock = std::time::Instant::now();
            let report = trainer.supervised_step(std::slice::from_ref(&sequence), &optimizer, 1e-5)?;
            let seconds = clock.elapsed().as_secs_f64();
            let loss = report.micro_batches[0].loss / report.micro_batches[0].scored as f64;
            println!(
                "step {}: {seconds:.2} s ({:.1} tokens/s), loss {loss:.5}, forward+backward {:.2} s, optimizer {:.2} s",
                step + 1,
                tokens as f64 / seconds,
                report.micro_batches[0].wall_ms / 1e3,
                report.optimizer_ms / 1e3,
            );
            times.push(seconds);
        }
        let steady: Vec<f64> = if times.len() > 1 { times[1..].to_vec() } else { times.clone() };
        let mean = steady.iter().sum::<f64>() / steady.len() as f64;
        println!("steady state: {mean:.2} s per step, {:.1} tokens/s", tokens as f64 / mean);
        if let Some(peak) = peak_rss() {
            println!("peak resident memory: {:.2} GB", peak as f64 / 1e9);
        }
        Ok(0)
    })
    .await?
}

/// The process's peak resident memory in bytes (Linux).
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}
