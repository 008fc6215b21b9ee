//! Softmax attention over cached keys and values, held as F32 or F16.
//!
//! Decoding reads every cached key and value of every sequence at every layer and step (about
//! 220 MB a step for 32 SmolLM2 sequences of 150 tokens, in F32): far more than the CPU's caches
//! hold. An F16 cache halves those bytes and the cache's memory (on the machines measured,
//! attention did not get measurably faster: it waits on its arithmetic more than on reading).
//! Its values are rounded once, when stored, and widened exactly when read, so the arithmetic
//! is the F32 code's, on the rounded numbers, and just as independent of batching.

use half::f16;
use half::slice::HalfFloatSliceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[cfg(target_arch = "x86_64")]
use super::lanes::{Avx2, Avx512, Lanes};
use super::{Level, exp_in_place, level, use_avx2};

/// How a KV cache stores keys and values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum KvCacheDtype {
    /// As computed.
    #[default]
    F32,
    /// Rounded to F16 (to nearest): half the memory and the bytes read per step; the
    /// log-probabilities move slightly off F32's.
    F16,
}

impl KvCacheDtype {
    /// Its name in specs and tables.
    pub fn name(self) -> &'static str {
        match self {
            KvCacheDtype::F32 => "f32",
            KvCacheDtype::F16 => "f16",
        }
    }
}

impl std::str::FromStr for KvCacheDtype {
    type Err = String;

    fn from_str(name: &str) -> Result<KvCacheDtype, String> {
        super::from_name(name)
    }
}

/// A number a KV cache holds.
pub trait KvValue: Copy + Send + Sync {
    /// Appends `values`, rounded to this type.
    fn store(values: &[f32], into: &mut Vec<Self>);
    /// The value as F32 (exactly).
    fn to_f32(self) -> f32;
    /// The eight values from `values`, widened (for code compiled with AVX2 and F16C).
    ///
    /// # Safety
    /// Eight values must be readable from `values`, and the CPU must have AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(values: *const Self) -> std::arch::x86_64::__m256;
    /// The sixteen values from `values`, widened (for code compiled with AVX-512).
    ///
    /// # Safety
    /// Sixteen values must be readable from `values`, and the CPU must have AVX-512 F.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(values: *const Self) -> std::arch::x86_64::__m512;
}

impl KvValue for f32 {
    fn store(values: &[f32], into: &mut Vec<f32>) {
        into.extend_from_slice(values);
    }

    fn to_f32(self) -> f32 {
        self
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8(values: *const f32) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller guarantees eight readable values.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(values) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(values: *const f32) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller guarantees sixteen readable values.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(values) }
    }
}

impl KvValue for f16 {
    fn store(values: &[f32], into: &mut Vec<f16>) {
        let start = into.len();
        into.resize(start + values.len(), f16::ZERO);
        into[start..].convert_from_f32_slice(values);
    }

    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8(values: *const f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm256_cvtph_ps};
        // SAFETY: the caller guarantees eight readable values (16 bytes).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(values.cast::<__m128i>())) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(values: *const f16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm512_cvtph_ps};
        // SAFETY: the caller guarantees sixteen readable values (32 bytes).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(values.cast::<__m256i>())) }
    }
}

/// The keys and values of one key-value head over `count` tokens: token `j`'s key is
/// `keys[j * stride + offset..][..width]`, its value the same slice of `values`.
#[derive(Clone, Copy)]
pub struct KvHead<'a, T = f32> {
    /// Every token's keys, `stride` apart.
    pub keys: &'a [T],
    /// Every token's values, laid out as `keys`.
    pub values: &'a [T],
    /// Tokens attended to.
    pub count: usize,
    /// Numbers between one token's entries and the next's.
    pub stride: usize,
    /// Where this head's entries start within a token's.
    pub offset: usize,
    /// Numbers in one head's key (and value).
    pub width: usize,
}

/// Softmax attention of the query heads that share one key-value head (`queries`: one or more
/// heads of `width`, side by side): writes each head's `Σ softmax(q·k · scale) v` into its
/// part of `out`. `scores` is scratch space.
///
/// The heads are computed together so that each key and value is read once for all of them
/// (grouped-query attention: three query heads per key-value head in SmolLM2), but each head's
/// arithmetic is its own, in the order it would have alone: a head's output does not depend
/// on the others.
pub fn attend<T: KvValue>(queries: &[f32], head: KvHead<'_, T>, scale: f32, scores: &mut Vec<f32>, out: &mut [f32]) {
    let KvHead { count, width, .. } = head;
    assert!(
        width > 0 && queries.len() >= width && queries.len().is_multiple_of(width),
        "attend: {} query numbers for heads of width {width}",
        queries.len()
    );
    let heads = queries.len() / width;
    // Head-major (`heads × count`): a head's scores are contiguous.
    scores.clear();
    scores.resize(heads * count, 0.0);
    score_keys(queries, head, scale, scores);
    if count == 0 {
        out.iter_mut().for_each(|o| *o = 0.0);
        return;
    }
    // The heads side by side in one pass over the keys: each head's running maximum and sum
    // goes on in key order, as it would alone, while the others' fill the wait for its last add.
    let mut maxima = vec![f32::NEG_INFINITY; heads];
    for j in 0..count {
        for (h, max) in maxima.iter_mut().enumerate() {
            *max = max.max(scores[h * count + j]);
        }
    }
    for (scores, max) in scores.chunks_exact_mut(count).zip(&maxima) {
        scores.iter_mut().for_each(|score| *score -= max);
    }
    exp_in_place(scores);
    let mut totals = vec![-0.0f32; heads];
    for j in 0..count {
        for (h, total) in totals.iter_mut().enumerate() {
            *total += scores[h * count + j];
        }
    }
    for (weights, total) in scores.chunks_exact_mut(count).zip(&totals) {
        weights.iter_mut().for_each(|weight| *weight /= total);
    }
    weigh_values(scores, heads, head, out);
}

/// `scores[h * count + j] = dot(query h, key j) · scale` for every key of `head`, with AVX2
/// where the CPU has it (which reads F16 keys without widening them first).
fn score_keys<T: KvValue>(queries: &[f32], head: KvHead<'_, T>, scale: f32, scores: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: the CPU has AVX2 and F16C.
        unsafe { score_keys_avx2(queries, head, scale, scores) };
        return;
    }
    score_keys_with(queries, head, scale, scores, 0, dot_portable);
}

/// Keys scored together by [`score_eight_keys`]: a head's dot products with eight keys, one
/// per lane after a transpose.
#[cfg(target_arch = "x86_64")]
const KEYS_AT_ONCE: usize = 8;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn score_keys_avx2<T: KvValue>(queries: &[f32], head: KvHead<'_, T>, scale: f32, scores: &mut [f32]) {
    let (count, width) = (head.count, head.width);
    let heads = queries.len() / width;
    assert!(
        scores.len() >= heads * count
            && (count == 0 || head.keys.len() >= (count - 1) * head.stride + head.offset + width),
        "score_keys: {heads} heads, {count} keys"
    );
    let mut first = 0;
    while first + KEYS_AT_ONCE <= count {
        // SAFETY: the keys first..first + 8 lie inside the asserted `keys`, their scores inside
        // the asserted `scores`; the CPU has AVX2 and F16C.
        unsafe {
            match width {
                32 => score_eight_keys::<T, 4>(queries, head, scale, first, scores),
                64 => score_eight_keys::<T, 8>(queries, head, scale, first, scores),
                128 => score_eight_keys::<T, 16>(queries, head, scale, first, scores),
                _ => break,
            }
        }
        first += KEYS_AT_ONCE;
    }
    // The keys past the last eight (or every key, for heads of other widths) one by one; the
    // closure inherits this function's target features.
    score_keys_with(queries, head, scale, scores, first, |a, b| dot_avx2(a, b));
}

/// The scores of keys `first..first + 8` for every query head, in heads of `BLOCKS` × 8: the
/// bits of [`dot_avx2`] for each (its eight lanes summed in the same order, then scaled), but
/// each key widened once for all heads, and the lanes of eight keys summed by one transpose and
/// seven vector additions instead of eight scalar additions per key.
///
/// # Safety
/// `first + 8 ≤ count`, keys `first..first + 8` of `head` must be readable, `scores` must hold `heads × count`
/// numbers, the head's width must be `BLOCKS × 8`, and the CPU must have AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn score_eight_keys<T: KvValue, const BLOCKS: usize>(
    queries: &[f32],
    head: KvHead<'_, T>,
    scale: f32,
    first: usize,
    scores: &mut [f32],
) {
    use std::arch::x86_64::{
        __m256, _mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_permute2f128_ps, _mm256_set1_ps,
        _mm256_setzero_ps, _mm256_shuffle_ps, _mm256_storeu_ps, _mm256_unpackhi_ps, _mm256_unpacklo_ps,
    };
    let KvHead { keys, count, stride, offset, .. } = head;
    let mut widened = [[_mm256_setzero_ps(); BLOCKS]; KEYS_AT_ONCE];
    for (key, widened) in widened.iter_mut().enumerate() {
        for (block, widened) in widened.iter_mut().enumerate() {
            // SAFETY: inside key first + key's entries, readable as the caller guarantees.
            *widened = unsafe { T::load8(keys.as_ptr().add((first + key) * stride + offset + block * 8)) };
        }
    }
    for (h, query) in queries.chunks_exact(BLOCKS * 8).enumerate() {
        // Lane i of row `key`: the sum of the products at positions i, i + 8, … (dot_avx2's).
        let mut rows = [_mm256_setzero_ps(); KEYS_AT_ONCE];
        for block in 0..BLOCKS {
            // SAFETY: block * 8 + 8 ≤ the query's length.
            let q = unsafe { _mm256_loadu_ps(query.as_ptr().add(block * 8)) };
            for (row, widened) in rows.iter_mut().zip(&widened) {
                *row = _mm256_add_ps(*row, _mm256_mul_ps(q, widened[block]));
            }
        }
        // Transpose: lane `key` of columns[i] is lane i of rows[key].
        let [r0, r1, r2, r3, r4, r5, r6, r7] = rows;
        let (t0, t1) = (_mm256_unpacklo_ps(r0, r1), _mm256_unpackhi_ps(r0, r1));
        let (t2, t3) = (_mm256_unpacklo_ps(r2, r3), _mm256_unpackhi_ps(r2, r3));
        let (t4, t5) = (_mm256_unpacklo_ps(r4, r5), _mm256_unpackhi_ps(r4, r5));
        let (t6, t7) = (_mm256_unpacklo_ps(r6, r7), _mm256_unpackhi_ps(r6, r7));
        let (u0, u1) = (_mm256_shuffle_ps::<0x44>(t0, t2), _mm256_shuffle_ps::<0xEE>(t0, t2));
        let (u2, u3) = (_mm256_shuffle_ps::<0x44>(t1, t3), _mm256_shuffle_ps::<0xEE>(t1, t3));
        let (u4, u5) = (_mm256_shuffle_ps::<0x44>(t4, t6), _mm256_shuffle_ps::<0xEE>(t4, t6));
        let (u6, u7) = (_mm256_shuffle_ps::<0x44>(t5, t7), _mm256_shuffle_ps::<0xEE>(t5, t7));
        let columns: [__m256; 8] = [
            _mm256_permute2f128_ps::<0x20>(u0, u4),
            _mm256_permute2f128_ps::<0x20>(u1, u5),
            _mm256_permute2f128_ps::<0x20>(u2, u6),
            _mm256_permute2f128_ps::<0x20>(u3, u7),
            _mm256_permute2f128_ps::<0x31>(u0, u4),
            _mm256_permute2f128_ps::<0x31>(u1, u5),
            _mm256_permute2f128_ps::<0x31>(u2, u6),
            _mm256_permute2f128_ps::<0x31>(u3, u7),
        ];
        // dot_avx2 sums its lanes in order from -0.0, the neutral element: lane 0 plus lane 1
        // first. Its tail is empty (whole blocks), and adding an empty sum changes no bit.
        let sums = columns[1..].iter().fold(columns[0], |sum, column| _mm256_add_ps(sum, *column));
        let scaled = _mm256_mul_ps(sums, _mm256_set1_ps(scale));
        // SAFETY: h * count + first + 8 ≤ heads × count, as the caller guarantees.
        unsafe { _mm256_storeu_ps(scores.as_mut_ptr().add(h * count + first), scaled) };
    }
}

/// The scores' loop from key `first` on, with `dot` inlined into each caller's instruction set.
#[inline(always)]
fn score_keys_with<T: KvValue>(
    queries: &[f32],
    head: KvHead<'_, T>,
    scale: f32,
    scores: &mut [f32],
    first: usize,
    dot: impl Fn(&[f32], &[T]) -> f32,
) {
    let KvHead { keys, count, stride, offset, width, .. } = head;
    for j in first..count {
        let key = &keys[j * stride + offset..][..width];
        for (h, query) in queries.chunks_exact(width).enumerate() {
            scores[h * count + j] = dot(query, key) * scale;
        }
    }
}

/// A dot product in eight independent lanes (a plain `sum` must add in order), the lanes then
/// added in order, then the products past the last eight: the order is fixed by the length
/// alone.
fn dot_portable<T: KvValue>(a: &[f32], b: &[T]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (a_chunks, b_chunks) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail = dot_tail(a_chunks.remainder(), b_chunks.remainder());
    for (x, y) in a_chunks.zip(b_chunks) {
        for lane in 0..8 {
            lanes[lane] += x[lane] * y[lane].to_f32();
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// The products past the last whole eight, added in order.
fn dot_tail<T: KvValue>(a: &[f32], b: &[T]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y.to_f32()).sum()
}

/// [`dot_portable`] with the eight lanes in one register (a product, then a sum: not fused).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn dot_avx2<T: KvValue>(a: &[f32], b: &[T]) -> f32 {
    use std::arch::x86_64::{_mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_setzero_ps, _mm256_storeu_ps};
    let (a_chunks, b_chunks) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail = dot_tail(a_chunks.remainder(), b_chunks.remainder());
    let mut sums = _mm256_setzero_ps();
    for (x, y) in a_chunks.zip(b_chunks) {
        // SAFETY: both chunks hold eight values; the CPU has AVX2 and F16C.
        unsafe { sums = _mm256_add_ps(sums, _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr()), T::load8(y.as_ptr()))) };
    }
    let mut lanes = [0.0f32; 8];
    // SAFETY: `lanes` holds eight values.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sums) };
    lanes.iter().sum::<f32>() + tail
}

/// `out[h] = Σ_j weights[h][j] · value_j` for every head `h` (`weights`: `heads × count`): each
/// sum adds the keys in order, a product and then a sum per key (not fused), with AVX-512 or
/// AVX2 where the CPU has it and the width is whole blocks of 16.
fn weigh_values<T: KvValue>(weights: &[f32], heads: usize, head: KvHead<'_, T>, out: &mut [f32]) {
    weigh_values_at(level(), weights, heads, head, out);
}

/// [`weigh_values`] with the vector code of `level` (which the CPU must have).
fn weigh_values_at<T: KvValue>(level: Level, weights: &[f32], heads: usize, head: KvHead<'_, T>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if head.width.is_multiple_of(16) {
        // SAFETY: the CPU has the level's features.
        match level {
            Level::Avx512 => return unsafe { weigh_values_avx512(weights, heads, head, out) },
            Level::Avx2 => return unsafe { weigh_values_avx2(weights, heads, head, out) },
            Level::Portable => {}
        }
    }
    let _ = level;
    weigh_values_portable(weights, heads, head, out);
}

/// [`weigh_values`] element by element: the very bits of the vector version.
fn weigh_values_portable<T: KvValue>(weights: &[f32], heads: usize, head: KvHead<'_, T>, out: &mut [f32]) {
    let KvHead { values, count, stride, offset, width, .. } = head;
    for (h, out) in out.chunks_exact_mut(width).take(heads).enumerate() {
        let weights = &weights[h * count..][..count];
        for (i, out) in out.iter_mut().enumerate() {
            *out = weights
                .iter()
                .enumerate()
                .fold(0.0, |sum, (j, weight)| sum + weight * values[j * stride + offset + i].to_f32());
        }
    }
}

/// [`weigh_values`] in AVX2's sixteen registers: up to three heads take 32 columns a pass, four
/// heads 16, so that a pass's sums stay in registers (three heads' twelve, with a key's values,
/// spill a little; still faster than twice the passes).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn weigh_values_avx2<T: KvValue>(weights: &[f32], heads: usize, head: KvHead<'_, T>, out: &mut [f32]) {
    let wide = head.width.is_multiple_of(32);
    // SAFETY: compiled for AVX2 and F16C; the width is a multiple of 16.
    unsafe { weigh_value_groups::<Avx2, T>(weights, heads, head, out, |group| if wide && group < 4 { 2 } else { 1 }) }
}

/// [`weigh_values`] in AVX-512's 32 registers: four heads' sums of 64 columns and a key's values
/// fit them, so a pass takes as many columns as the width allows, up to 64.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn weigh_values_avx512<T: KvValue>(weights: &[f32], heads: usize, head: KvHead<'_, T>, out: &mut [f32]) {
    let units = if head.width.is_multiple_of(64) {
        4
    } else if head.width.is_multiple_of(32) {
        2
    } else {
        1
    };
    // SAFETY: compiled for AVX-512 F; the width is a multiple of 16.
    unsafe { weigh_value_groups::<Avx512, T>(weights, heads, head, out, |_| units) }
}

/// [`weigh_values`] by groups of up to four heads, each group's columns `units(group) × 16` a
/// pass ([`weigh_group_values`]).
///
/// # Safety
/// The CPU must have `L`'s features; `head.width` must be a multiple of 16 × every unit count.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn weigh_value_groups<L: Lanes, T: KvValue>(
    weights: &[f32],
    heads: usize,
    head: KvHead<'_, T>,
    out: &mut [f32],
    units: impl Fn(usize) -> usize,
) {
    let mut first = 0;
    while first < heads {
        let group = (heads - first).min(4);
        let out = &mut out[first * head.width..(first + group) * head.width];
        // SAFETY: the caller's.
        unsafe {
            match (group, units(group)) {
                (4, 4) => weigh_group_values::<L, T, 4, 4>(weights, heads, first, head, out),
                (4, 2) => weigh_group_values::<L, T, 4, 2>(weights, heads, first, head, out),
                (4, _) => weigh_group_values::<L, T, 4, 1>(weights, heads, first, head, out),
                (3, 4) => weigh_group_values::<L, T, 3, 4>(weights, heads, first, head, out),
                (3, 2) => weigh_group_values::<L, T, 3, 2>(weights, heads, first, head, out),
                (3, _) => weigh_group_values::<L, T, 3, 1>(weights, heads, first, head, out),
                (2, 4) => weigh_group_values::<L, T, 2, 4>(weights, heads, first, head, out),
                (2, 2) => weigh_group_values::<L, T, 2, 2>(weights, heads, first, head, out),
                (2, _) => weigh_group_values::<L, T, 2, 1>(weights, heads, first, head, out),
                (_, 4) => weigh_group_values::<L, T, 1, 4>(weights, heads, first, head, out),
                (_, 2) => weigh_group_values::<L, T, 1, 2>(weights, heads, first, head, out),
                (_, _) => weigh_group_values::<L, T, 1, 1>(weights, heads, first, head, out),
            }
        }
        first += group;
    }
}

/// [`weigh_values`] for the `G ≤ 4` heads from `first`, `16 × U` output columns a pass: the
/// `G × U` sums in registers over all keys, each key's values loaded once for the group, and
/// each column's sum the portable code's chain of products and adds.
///
/// # Safety
/// The CPU must have `L`'s features.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn weigh_group_values<L: Lanes, T: KvValue, const G: usize, const U: usize>(
    weights: &[f32],
    heads: usize,
    first: usize,
    head: KvHead<'_, T>,
    out: &mut [f32],
) {
    let KvHead { values, count, stride, offset, width, .. } = head;
    assert!(
        first + G <= heads
            && weights.len() >= count * heads
            && out.len() >= G * width
            && width.is_multiple_of(16 * U)
            && (count == 0 || values.len() >= (count - 1) * stride + offset + width),
        "weigh_values: {G} heads from {first} of {heads}, {count} keys"
    );
    // SAFETY (every block below): j < count, start + 16U ≤ width and g < G keep every read and
    // write inside the asserted lengths; the caller's features.
    for start in (0..width).step_by(16 * U) {
        let mut sums = [[unsafe { L::zero() }; U]; G];
        for j in 0..count {
            unsafe {
                let value = values.as_ptr().add(j * stride + offset + start);
                let block: [L; U] = std::array::from_fn(|u| L::load_values(value.add(16 * u)));
                for (g, sums) in sums.iter_mut().enumerate() {
                    let weight = L::splat(*weights.get_unchecked((first + g) * count + j));
                    for (sum, value) in sums.iter_mut().zip(&block) {
                        *sum = sum.add(weight.mul(*value));
                    }
                }
            }
        }
        for (g, sums) in sums.iter().enumerate() {
            for (u, sum) in sums.iter().enumerate() {
                unsafe { sum.store(out.as_mut_ptr().add(g * width + start + 16 * u)) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::vector_levels;

    #[test]
    fn dots_handle_every_length_and_the_vector_code_gives_the_portable_bits() {
        for len in [0, 1, 7, 8, 9, 32, 33, 44] {
            // Numbers whose products and sums round (and round again to F16), so that another
            // order of additions or a fused multiply-add would change the bits.
            let a: Vec<f32> = (0..len).map(|i| ((i * 7919) % 1009) as f32 / 1009.0 - 0.5).collect();
            let b: Vec<f32> = (0..len).map(|i| ((i * 104_729) % 997) as f32 / 99.7 - 5.0).collect();
            let plain: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert!((dot_portable(&a, &b) - plain).abs() < 1e-3, "length {len}");
            let mut halves = Vec::new();
            f16::store(&b, &mut halves);
            assert!(len < 2 || halves.iter().zip(&b).any(|(h, b)| h.to_f32() != *b), "nothing was rounded");
            #[cfg(target_arch = "x86_64")]
            if use_avx2() {
                // SAFETY: the CPU has AVX2 and F16C.
                let (fast, fast_halves) = unsafe { (dot_avx2(&a, &b), dot_avx2(&a, &halves)) };
                assert_eq!(fast, dot_portable(&a, &b), "the vector code's bits, length {len}");
                assert_eq!(fast_halves, dot_portable(&a, &halves), "F16, length {len}");
            }
        }
    }

    /// Keys scored eight at a time give the bits of the one-at-a-time portable loop, for every
    /// head width the fast path takes and one it does not, with and without keys past the last
    /// eight, from F32 and F16 keys.
    #[test]
    fn keys_scored_eight_at_once_give_the_bits_of_one_at_a_time() {
        for width in [32, 64, 128, 40] {
            for count in [0, 1, 7, 8, 9, 16, 23] {
                let (heads, stride) = (3, 2 * width + 5);
                let keys: Vec<f32> = (0..count * stride).map(|i| ((i * 7919) % 1009) as f32 / 400.0 - 1.2).collect();
                let queries: Vec<f32> = (0..heads * width).map(|i| ((i * 31) % 101) as f32 / 50.0 - 1.0).collect();
                let mut halves = Vec::new();
                f16::store(&keys, &mut halves);
                let scored = |head: KvHead<'_, f32>, halves: KvHead<'_, f16>| {
                    let mut out = [vec![0.0; heads * count], vec![0.0; heads * count]];
                    score_keys(&queries, head, 0.3, &mut out[0]);
                    score_keys(&queries, halves, 0.3, &mut out[1]);
                    out.map(|scores| scores.iter().map(|s| s.to_bits()).collect::<Vec<u32>>())
                };
                let plain = |head: KvHead<'_, f32>, halves: KvHead<'_, f16>| {
                    let mut out = [vec![0.0; heads * count], vec![0.0; heads * count]];
                    score_keys_with(&queries, head, 0.3, &mut out[0], 0, dot_portable);
                    score_keys_with(&queries, halves, 0.3, &mut out[1], 0, dot_portable);
                    out.map(|scores| scores.iter().map(|s| s.to_bits()).collect::<Vec<u32>>())
                };
                let head = KvHead { keys: &keys, values: &keys, count, stride, offset: width, width };
                let half_head = KvHead { keys: &halves, values: &halves, count, stride, offset: width, width };
                assert_eq!(scored(head, half_head), plain(head, half_head), "width {width}, {count} keys");
            }
        }
    }

    #[test]
    fn attention_weights_values_by_softmax_of_scores() {
        // Two keys: the query matches the second one twice as strongly.
        let query = [1.0, 0.0];
        let keys = [1.0, 0.0, 2.0, 0.0];
        let values = [10.0, 0.0, 0.0, 10.0];
        let mut out = [0.0; 2];
        let head = KvHead { keys: &keys, values: &values, count: 2, stride: 2, offset: 0, width: 2 };
        attend(&query, head, 1.0, &mut Vec::new(), &mut out);
        let p = 1.0 / (1.0 + 1.0f32.exp());
        assert!((out[0] - 10.0 * p).abs() < 1e-5 && (out[1] - 10.0 * (1.0 - p)).abs() < 1e-5, "{out:?}");
    }

    #[test]
    fn heads_attended_together_give_the_bits_of_each_head_alone() {
        // Seven tokens of two key-value heads of width 40 (a partial value block), and five
        // query heads on the second: a group of four, then one.
        let (count, width, stride) = (7, 40, 2 * 40 + 3);
        let keys: Vec<f32> = (0..count * stride).map(|i| ((i * 7919) % 1009) as f32 / 1009.0 - 0.5).collect();
        let values: Vec<f32> = (0..count * stride).map(|i| ((i * 104_729) % 997) as f32 / 997.0 - 0.5).collect();
        let queries: Vec<f32> = (0..5 * width).map(|i| ((i * 31) % 101) as f32 / 50.0 - 1.0).collect();
        let head = KvHead { keys: &keys, values: &values, count, stride, offset: width, width };
        let mut together = vec![0.0; 5 * width];
        attend(&queries, head, 0.3, &mut Vec::new(), &mut together);
        for (query, together) in queries.chunks_exact(width).zip(together.chunks_exact(width)) {
            let mut alone = vec![0.0; width];
            attend(query, head, 0.3, &mut Vec::new(), &mut alone);
            assert_eq!(alone, together);
        }
        let distinct: std::collections::BTreeSet<u32> = together.iter().map(|v| v.to_bits()).collect();
        assert!(distinct.len() > 4 * width, "the heads attended differently");
    }

    #[test]
    fn the_vector_value_sums_give_the_bits_of_the_portable_ones() {
        // Every group size and pass width: four heads 16 columns a pass, fewer 32, or 16 where
        // the width is not a multiple of 32; five heads: a group of four, then one.
        for (heads, width) in [(3, 32), (3, 48), (4, 64), (2, 64), (2, 48), (1, 16), (5, 32), (3, 128)] {
            let (count, stride) = (9, 2 * width + 6);
            let values: Vec<f32> = (0..count * stride).map(|i| ((i * 104_729) % 997) as f32 / 997.0 - 0.5).collect();
            let weights: Vec<f32> = (0..count * heads).map(|i| ((i * 7919) % 101) as f32 / 101.0).collect();
            let head = KvHead { keys: &values, values: &values, count, stride, offset: 5, width };
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            let mut plain = vec![0.0; heads * width];
            weigh_values_portable(&weights, heads, head, &mut plain);
            assert!(plain.iter().all(|v| *v != 0.0));
            let mut halves = Vec::new();
            f16::store(&values, &mut halves);
            let half_head = KvHead { keys: &halves, values: &halves, count, stride, offset: 5, width };
            let mut half_plain = vec![0.0; heads * width];
            weigh_values_portable(&weights, heads, half_head, &mut half_plain);
            for level in vector_levels() {
                let mut fast = vec![0.0; heads * width];
                weigh_values_at(level, &weights, heads, head, &mut fast);
                assert_eq!(bits(&fast), bits(&plain), "{level:?}, {heads} heads of width {width}");
                weigh_values_at(level, &weights, heads, half_head, &mut fast);
                assert_eq!(bits(&fast), bits(&half_plain), "{level:?}, F16 values, {heads} heads of width {width}");
            }
        }
    }

    /// An F16 cache's only difference is the rounding when stored: attention over it gives the
    /// bits of F32 attention over the rounded numbers, and stays close to the unrounded.
    #[test]
    fn an_f16_cache_attends_as_f32_over_its_rounded_numbers() {
        // Width 64 (whole vector blocks) and 44 (a dot product's tail of four; the values
        // summed by the portable code, as for any width not a multiple of sixteen), three
        // query heads.
        for width in [64, 44] {
            let (count, stride) = (11, 2 * width);
            let keys: Vec<f32> = (0..count * stride).map(|i| ((i * 7919) % 1009) as f32 / 400.0 - 1.2).collect();
            let values: Vec<f32> = (0..count * stride).map(|i| ((i * 104_729) % 997) as f32 / 300.0 - 1.6).collect();
            let queries: Vec<f32> = (0..3 * width).map(|i| ((i * 31) % 101) as f32 / 50.0 - 1.0).collect();
            let (mut half_keys, mut half_values) = (Vec::new(), Vec::new());
            f16::store(&keys, &mut half_keys);
            f16::store(&values, &mut half_values);
            assert!(half_keys.iter().zip(&keys).any(|(h, k)| h.to_f32() != *k), "nothing was rounded");
            let rounded_keys: Vec<f32> = half_keys.iter().map(|h| h.to_f32()).collect();
            let rounded_values: Vec<f32> = half_values.iter().map(|h| h.to_f32()).collect();
            let attention = |head: KvHead<'_, f32>| {
                let mut out = vec![0.0; 3 * width];
                attend(&queries, head, 0.125, &mut Vec::new(), &mut out);
                out
            };
            let mut f16_out = vec![0.0; 3 * width];
            let f16_head = KvHead { keys: &half_keys, values: &half_values, count, stride, offset: width, width };
            attend(&queries, f16_head, 0.125, &mut Vec::new(), &mut f16_out);
            let rounded = KvHead { keys: &rounded_keys, values: &rounded_values, count, stride, offset: width, width };
            assert_eq!(f16_out, attention(rounded), "width {width}");
            let exact = attention(KvHead { keys: &keys, values: &values, count, stride, offset: width, width });
            let gap = f16_out.iter().zip(&exact).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(gap > 0.0 && gap < 2e-3, "F16 against F32 attention: {gap} (width {width})");
        }
    }
}
