//! Seeded sampling from logits, shared by the in-process backends: the same logits, settings
//! and RNG state always pick the same token, and the pick comes with its natural-log
//! probability under the temperature-scaled distribution.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::Sampling;
use crate::kernels::{exp, exp_in_place};

/// Tokens this far below the most likely one in scaled logits (probability ratio e⁻³⁰ ≈ 1e-13)
/// cannot change an f32 nucleus: they are left out before sorting, which keeps sorting cheap.
const NEGLIGIBLE: f32 = 30.0;

/// Picks the next token from `logits` and returns it with its log-probability.
pub(crate) fn sample(logits: &[f32], sampling: Sampling, rng: &mut ChaCha8Rng) -> (u32, f32) {
    let temperature = if sampling.temperature > 0.0 { sampling.temperature } else { 1.0 };
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let scaled = |i: usize| (logits[i] - max) / temperature;
    // The normaliser over the whole vocabulary: the exponentials of a row at once, added in
    // order as the trainer adds them (summed in lanes instead, the two log-probabilities of a
    // token drifted apart tenfold, to 1.2e-4).
    let mut weights: Vec<f32> = (0..logits.len()).map(scaled).collect();
    exp_in_place(&mut weights);
    let log_sum = weights.iter().sum::<f32>().ln();
    if sampling.temperature <= 0.0 {
        let best = (0..logits.len()).max_by(|a, b| logits[*a].total_cmp(&logits[*b])).unwrap_or(0);
        return (best as u32, scaled(best) - log_sum);
    }
    let mut order: Vec<usize> = (0..logits.len()).filter(|&i| scaled(i) > -NEGLIGIBLE).collect();
    order.sort_unstable_by(|a, b| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b)));
    let mut kept = 0;
    let mut mass = 0.0f32;
    for &index in &order {
        kept += 1;
        mass += exp(scaled(index) - log_sum);
        if mass >= sampling.top_p {
            break;
        }
    }
    let mut draw = rng.random::<f32>() * mass;
    let mut chosen = order[kept - 1];
    for &index in &order[..kept] {
        draw -= exp(scaled(index) - log_sum);
        if draw <= 0.0 {
            chosen = index;
            break;
        }
    }
    (chosen as u32, scaled(chosen) - log_sum)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn greedy_takes_the_largest_logit_with_its_log_probability() {
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let (id, logprob) = sample(&[0.0, 2.0, 1.0], Sampling::GREEDY, &mut rng);
        assert_eq!(id, 1);
        let expected = 2.0 - (1.0f32 + 2.0f32.exp() + 1.0f32.exp()).ln();
        assert!((logprob - expected).abs() < 1e-6);
    }

    #[test]
    fn a_small_nucleus_keeps_only_the_most_likely_tokens() {
        let sampling = Sampling { temperature: 1.0, top_p: 0.5 };
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for _ in 0..100 {
            assert_eq!(sample(&[5.0, 0.0, 0.0, 4.0], sampling, &mut rng).0, 0);
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_tokens() {
        let sampling = Sampling { temperature: 0.8, top_p: 0.95 };
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let draw = |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            (0..20).map(|_| sample(&logits, sampling, &mut rng).0).collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
    }
}
