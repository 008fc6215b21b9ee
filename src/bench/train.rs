//! `sesa bench-train`: one training step (forward, backward, AdamW), as `benches/train.sh`
//! runs it in PyTorch beside it; with `--group`, a GRPO group's rollouts of one prompt trained
//! with the prompt shared and apart, alternated.

use anyhow::Result;
use sesa_models::train::{
    LoraMethod, Method, OptimizerConfig, TrainModel, TrainSequence, Trainer, logprobs_with_reference,
};

/// What `sesa bench-train` measures.
pub struct TrainBench {
    /// A GGUF file, a Hugging Face directory or a known model's name.
    pub model: String,
    /// Tokens of each sequence.
    pub tokens: usize,
    /// `full` or `lora`.
    pub method: String,
    /// LoRA on the top this many blocks only.
    pub top_layers: Option<usize>,
    /// Optimizer steps to time.
    pub steps: usize,
    /// The fraction of positions scored (one sequence).
    pub scored: f64,
    /// Sequences of one group (1: a single sequence).
    pub group: usize,
    /// Tokens of the prompt a group's sequences share (scored from there on).
    pub prompt: usize,
}

/// `sesa bench-train`.
pub async fn bench_train(bench: TrainBench) -> Result<u8> {
    let TrainBench { model, tokens, method, top_layers, steps, scored, group, prompt } = bench;
    let method = match method.as_str() {
        "full" if top_layers.is_some() => anyhow::bail!("--top-layers needs --method lora"),
        "full" => Method::Full,
        "lora" => Method::Lora(LoraMethod { top_layers, ..LoraMethod::everywhere(16, 32.0) }),
        other => anyhow::bail!("--method must be `full` or `lora`, not `{other}`"),
    };
    if let Some((key, problem)) = method.problems().into_iter().next() {
        anyhow::bail!("--{}: {problem}", key.replace('_', "-"));
    }
    if group == 0 {
        anyhow::bail!("--group must be at least 1");
    }
    if group > 1 && !(1..tokens).contains(&prompt) {
        anyhow::bail!("--prompt must be between 1 and --tokens − 1 ({}) with --group, not {prompt}", tokens - 1);
    }
    let source = sesa_stages::sections::local_model(&model).await?;
    let files = tokio::task::spawn_blocking(move || sesa_models::policy::ModelFiles::read(&source))
        .await?
        .map_err(anyhow::Error::msg)?;
    tokio::task::spawn_blocking(move || {
        let vocabulary = files.weights.shape.vocabulary;
        let ids = sesa_models::policy::bench_token_ids(tokens, vocabulary);
        let sequences: Vec<TrainSequence> = if group == 1 {
            let first_scored = tokens - ((tokens - 1) as f64 * scored.clamp(0.0, 1.0)).round() as usize;
            let mask = (0..tokens).map(|i| u8::from(i >= first_scored.max(1))).collect();
            vec![TrainSequence::new(ids, mask)]
        } else {
            // Each rollout continues the shared prompt with tokens of its own.
            (0..group)
                .map(|r| {
                    let own = sesa_models::policy::bench_token_ids(tokens + r * 101, vocabulary);
                    let mut sequence = ids[..prompt].to_vec();
                    sequence.extend(&own[own.len() - (tokens - prompt)..]);
                    let mask = (0..tokens).map(|i| u8::from(i >= prompt)).collect();
                    TrainSequence::new(sequence, mask)
                })
                .collect()
        };
        let model = TrainModel::for_method(files.weights, &method);
        let trained: usize = model.trained().iter().map(|t| t.len()).sum();
        let all_tokens = group * tokens;
        let scored_total: usize = sequences.iter().map(|s| s.positions().len()).sum();
        println!("training {group} × {tokens} tokens, {scored_total} scored, {trained} trained parameters");
        // Shared: the whole group in one micro-batch. Apart: a micro-batch per sequence, which
        // cannot share (the same gradient, summed over micro-batches).
        let layouts: &[(&str, usize)] = if group == 1 { &[("", all_tokens)] } else { &[("shared", all_tokens), ("apart", tokens)] };
        let mut trainer = Trainer::new(model, all_tokens);
        let optimizer = OptimizerConfig::adamw(1e-5);
        let mut times = vec![Vec::new(); layouts.len()];
        for step in 0..steps.max(1) {
            for (layout, (name, budget)) in layouts.iter().enumerate() {
                trainer.micro_batch_tokens = *budget;
                let clock = std::time::Instant::now();
                let report = trainer.supervised_step(&sequences, &optimizer, 1)?;
                let seconds = clock.elapsed().as_secs_f64();
                let rows: usize = report.micro_batches.iter().map(|m| m.tokens).sum();
                let forward_backward: f64 = report.micro_batches.iter().map(|m| m.wall_ms).sum::<f64>() / 1e3;
                let loss = report.micro_batches.iter().map(|m| m.loss).sum::<f64>() / scored_total.max(1) as f64;
                // A forward pass alone, as the update's KL reference and old-policy passes run it.
                // With LoRA, the same pass also gives the KL reference as the update computes it:
                // from the lowest adapted block up (a separate pass would cost `forward alone`).
                let lora = trainer.model.adapters.is_some();
                let clock = std::time::Instant::now();
                let reference_s = if lora {
                    logprobs_with_reference(&trainer.model, &sequences, 1.0, *budget)?.reference_ms / 1e3
                } else {
                    trainer.logprobs(&sequences, 1.0)?;
                    0.0
                };
                let forward = clock.elapsed().as_secs_f64() - reference_s;
                let reference = if lora { format!(", its KL reference {reference_s:.2} s more") } else { String::new() };
                let label = if name.is_empty() { String::new() } else { format!(" {name}") };
                println!(
                    "step {}{label}: {seconds:.2} s ({:.1} tokens/s), {rows} rows, loss {loss:.5}, forward+backward {forward_backward:.2} s, optimizer {:.2} s, forward alone {forward:.2} s{reference}",
                    step + 1,
                    all_tokens as f64 / seconds,
                    report.optimizer_ms / 1e3,
                );
                times[layout].push(seconds);
            }
        }
        for ((name, _), times) in layouts.iter().zip(&times) {
            let steady: Vec<f64> = if times.len() > 1 { times[1..].to_vec() } else { times.clone() };
            let mean = steady.iter().sum::<f64>() / steady.len() as f64;
            let label = if name.is_empty() { String::new() } else { format!(" ({name})") };
            println!("steady state{label}: {mean:.2} s per step, {:.1} tokens/s", all_tokens as f64 / mean);
        }
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
