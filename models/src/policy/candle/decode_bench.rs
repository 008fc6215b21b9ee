//! Decoding steps of the forward pass alone, timed: no scheduler, no sampler, no tokenizer.
//! What `sesa bench-decoding` prints, to see what the kernels do at each batch size (the
//! rollouts benchmark sees them through the whole serving path, on a machine whose speed
//! drifts; the fastest of many short steps does not).

use std::time::{Duration, Instant};

use super::llama::{Chunk, KvCache, LlamaModel};
use crate::kernels::{KvCacheDtype, Precision};
use crate::weights::{LlamaShape, LlamaWeights};

/// The timings of one batch size.
#[derive(Debug, Clone)]
pub struct DecodingTiming {
    /// Sequences decoding together, one token each a step.
    pub rows: usize,
    /// The fastest step.
    pub fastest: Duration,
    /// The median step.
    pub median: Duration,
}

/// Multiply-adds of the dense products (the projections and the output head) for one token.
pub fn dense_macs_per_token(shape: &LlamaShape) -> u64 {
    // A block's matrices (norms are single rows: no product).
    let block: usize =
        shape.block_dims().iter().filter(|(rows, _)| *rows > 1).map(|(rows, columns)| rows * columns).sum();
    (shape.layers * block + shape.hidden * shape.vocabulary) as u64
}

/// The token ids sesa's benchmarks feed: a fixed sequence that is not all alike (so that
/// attention weighs keys that differ), which `benches/train_torch.py` computes too.
pub fn bench_token_ids(count: usize, vocabulary: usize) -> Vec<u32> {
    (0..count as u64).map(|i| ((i * 7919 + 13) % vocabulary as u64) as u32).collect()
}

/// Times `steps` decoding steps for each batch size in `rows`: that many sequences, each with
/// `context` tokens already cached, feed one token each. Every step starts from the same
/// caches (copied outside the timing), so each times the same work.
pub fn bench_decoding(
    weights: &LlamaWeights,
    precision: Precision,
    kv_cache_dtype: KvCacheDtype,
    rows: &[usize],
    context: usize,
    steps: usize,
) -> Result<Vec<DecodingTiming>, String> {
    if context == 0 || context >= weights.shape.context {
        return Err(format!("the context must be 1 to {} tokens, not {context}", weights.shape.context - 1));
    }
    if rows.contains(&0) {
        return Err("batch sizes start at 1".into());
    }
    let model = LlamaModel::new(weights, precision, kv_cache_dtype);
    let tokens = bench_token_ids(context + 1, model.vocabulary());
    let mut prefilled = KvCache::default();
    model.forward(&mut [Chunk { cache: &mut prefilled, tokens: &tokens[..context] }]).map_err(|e| e.0)?;
    let next = [tokens[context]];
    let mut timings = Vec::new();
    for &count in rows {
        let mut times = Vec::with_capacity(steps);
        for _ in 0..steps.max(1) {
            let mut caches: Vec<KvCache> = (0..count).map(|_| prefilled.prefix(context)).collect();
            let mut chunks: Vec<Chunk<'_>> = caches.iter_mut().map(|cache| Chunk { cache, tokens: &next }).collect();
            let clock = Instant::now();
            model.forward(&mut chunks).map_err(|e| e.0)?;
            times.push(clock.elapsed());
        }
        times.sort();
        timings.push(DecodingTiming { rows: count, fastest: times[0], median: times[times.len() / 2] });
    }
    Ok(timings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::testing::{random, tiny_shape};

    #[test]
    fn the_dense_products_of_smollm2_are_134_million_multiply_adds_a_token() {
        let smollm2 = LlamaShape {
            hidden: 576,
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            layers: 30,
            ffn: 1536,
            vocabulary: 49152,
            ..tiny_shape()
        };
        // 30 × (576 × 960 + 576 × 576 + 576 × 3072 + 1536 × 576) + 576 × 49152.
        assert_eq!(dense_macs_per_token(&smollm2), 134_479_872);
        // 2 × (8 × 16 + 8 × 8 + 8 × 24 + 12 × 8) + 8 × 16.
        assert_eq!(dense_macs_per_token(&tiny_shape()), 1_088);
    }

    #[test]
    fn every_batch_size_is_timed_in_order_and_bad_contexts_or_sizes_are_refused() {
        let weights = random(tiny_shape(), true, 3);
        let timings = bench_decoding(&weights, Precision::Int8, KvCacheDtype::F16, &[3, 1], 10, 5).unwrap();
        assert_eq!(timings.iter().map(|t| t.rows).collect::<Vec<_>>(), [3, 1]);
        assert!(timings.iter().all(|t| t.fastest > Duration::ZERO && t.fastest <= t.median), "{timings:?}");
        for context in [0, 64] {
            let error = bench_decoding(&weights, Precision::F32, KvCacheDtype::F32, &[1], context, 1).unwrap_err();
            assert_eq!(error, format!("the context must be 1 to 63 tokens, not {context}"));
        }
        let error = bench_decoding(&weights, Precision::F32, KvCacheDtype::F32, &[2, 0], 10, 1).unwrap_err();
        assert_eq!(error, "batch sizes start at 1");
    }
}
