//! `eˣ` in F32, eight lanes at a time where the CPU has AVX2, with a portable twin of the same
//! bits: decoding takes millions of exponentials a step (the SiLU of every FFN row, the
//! attention weights, and the sampler's normaliser over the whole vocabulary for every row),
//! and the C library's `expf` computes them one at a time.
//!
//! The method is Cephes' `expf`: `x = n·ln 2 + r` with `n` rounded to nearest (ties to even)
//! and `|r| ≤ ln 2 / 2` (ln 2 in two parts, so `r` is exact), `eʳ` by a degree-7 polynomial
//! (within 2 ulp of the true value), and `2ⁿ` written straight into the exponent bits. Every
//! step is one correctly rounded F32 operation (fused multiply-adds included), in the same
//! order in both versions: the vector code gives the portable code's bits on every machine.

#[cfg(target_arch = "x86_64")]
use super::use_avx2;

/// Below this, `eˣ` is under the smallest normal F32: the result is 0.
const LOW: f32 = -87.336_55;
/// Above this, `2ⁿ` would pass the largest exponent: the result is +∞ (the true value is
/// finite up to 88.72, a range no caller comes near: logits and scores enter as `x − max`).
const HIGH: f32 = 88.0;
const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split so that `n · LN2_HIGH` is exact for every `n` in range.
const LN2_HIGH: f32 = 0.693_359_4;
const LN2_LOW: f32 = -2.121_944_4e-4;
/// Cephes' coefficients of `(eʳ − 1 − r) / r²`, highest degree first.
const POLYNOMIAL: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5];

/// `eˣ`: 0 below −87.34, +∞ above 88, a NaN for a NaN.
pub(crate) fn exp(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x < LOW {
        return 0.0;
    }
    if x > HIGH {
        return f32::INFINITY;
    }
    let n = (x * LOG2_E).round_ties_even();
    let r = (-n).mul_add(LN2_HIGH, x);
    let r = (-n).mul_add(LN2_LOW, r);
    let mut y = POLYNOMIAL[0];
    for c in &POLYNOMIAL[1..] {
        y = y.mul_add(r, *c);
    }
    let y = y.mul_add(r * r, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// Replaces every value by its [`exp`].
pub(crate) fn exp_in_place(values: &mut [f32]) {
    // What the vector code leaves: the last `len % 8` values, or all of them.
    let mut rest = values;
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        let (vector, tail) = rest.split_at_mut(rest.len() / 8 * 8);
        // SAFETY: the CPU has AVX2 and FMA.
        unsafe { exp_avx2(vector) };
        rest = tail;
    }
    rest.iter_mut().for_each(|v| *v = exp(*v));
}

/// [`exp`] of each block of eight values (the length is a multiple of 8).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn exp_avx2(values: &mut [f32]) {
    use std::arch::x86_64::{
        _CMP_GT_OQ, _CMP_LT_OQ, _MM_FROUND_NO_EXC, _MM_FROUND_TO_NEAREST_INT, _mm256_add_epi32, _mm256_add_ps,
        _mm256_andnot_ps, _mm256_blendv_ps, _mm256_castsi256_ps, _mm256_cmp_ps, _mm256_cvtps_epi32, _mm256_fmadd_ps,
        _mm256_fnmadd_ps, _mm256_loadu_ps, _mm256_max_ps, _mm256_min_ps, _mm256_mul_ps, _mm256_round_ps,
        _mm256_set1_epi32, _mm256_set1_ps, _mm256_slli_epi32, _mm256_storeu_ps,
    };
    for block in values.chunks_exact_mut(8) {
        // SAFETY: a chunk holds 8 floats.
        let x = unsafe { _mm256_loadu_ps(block.as_ptr()) };
        let (low, high) = (_mm256_set1_ps(LOW), _mm256_set1_ps(HIGH));
        // In this operand order a NaN passes both (each returns its second operand when one is
        // NaN) and stays NaN to the end.
        let clamped = _mm256_max_ps(low, _mm256_min_ps(high, x));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
            clamped,
            _mm256_set1_ps(LOG2_E),
        ));
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HIGH), clamped);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LOW), r);
        let mut y = _mm256_set1_ps(POLYNOMIAL[0]);
        for c in &POLYNOMIAL[1..] {
            y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(*c));
        }
        let y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0));
        let scale = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        )));
        let result = _mm256_mul_ps(y, scale);
        let result = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(x, low), result);
        let result = _mm256_blendv_ps(result, _mm256_set1_ps(f32::INFINITY), _mm256_cmp_ps::<_CMP_GT_OQ>(x, high));
        // SAFETY: as the load.
        unsafe { _mm256_storeu_ps(block.as_mut_ptr(), result) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs across the whole range, the edges and the special values.
    fn inputs() -> Vec<f32> {
        let mut inputs: Vec<f32> = (0..20_000).map(|i| -100.0 + i as f32 * 0.0095).collect();
        inputs.extend([0.0, -0.0, LOW, HIGH, LOW - 1e-3, HIGH + 1e-3, f32::NEG_INFINITY, f32::INFINITY, f32::NAN]);
        inputs.extend((0..1000).map(|i| (i as f32 * 0.618_034).fract() * 2.0 - 1.0));
        inputs
    }

    #[test]
    fn exp_is_within_two_ulp_of_the_true_value() {
        for x in inputs() {
            let (ours, exact) = (exp(x), f64::from(x).exp());
            if x.is_nan() {
                assert!(ours.is_nan());
            } else if x < LOW {
                assert_eq!(ours, 0.0, "{x}");
            } else if x > HIGH {
                assert_eq!(ours, f32::INFINITY, "{x}");
            } else {
                let ulp = f64::from(f32::from_bits(ours.to_bits() + 1) - ours);
                assert!((f64::from(ours) - exact).abs() <= 2.0 * ulp, "exp({x}) = {ours}, true {exact}");
            }
        }
    }

    #[test]
    fn the_vector_exp_gives_the_bits_of_the_portable_one() {
        let inputs = inputs();
        let mut fast = inputs.clone();
        exp_in_place(&mut fast);
        for (x, fast) in inputs.iter().zip(&fast) {
            if x.is_nan() {
                assert!(fast.is_nan());
            } else {
                assert_eq!(fast.to_bits(), exp(*x).to_bits(), "exp({x})");
            }
        }
    }
}
