//! Numeric kernels shared by the CPU forward passes (the BERT embedder, the llama policy).
//! Each output element is summed in an order fixed by the shapes of the weights alone, never by
//! the number of rows or threads: a row's result does not depend on how work was batched.
//!
//! Weight matrices are packed once at load, in the [`Precision`] a model asks for: F32 panels
//! (`f32_panels`), or int8 values with a scale per 32 inputs (`int8_panels`). Both are
//! multiplied tile by tile through one driver, [`tiles`], which owns the threading and the
//! order of the output writes.

mod exp;
mod f32_panels;
mod int8_panels;

use rayon::prelude::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub(crate) use self::exp::{exp, exp_in_place};
use self::f32_panels::F32Panels;
use self::int8_panels::Int8Panels;

/// Output columns per panel of a [`PackedWeight`]: two 8-lane registers.
const LANES: usize = 16;
/// Rows per tile of the product kernels: with two accumulators per row and the two weight
/// registers, six rows fill the sixteen AVX registers.
const TILE_ROWS: usize = 6;
/// Rows whose inputs stay in cache while a thread sweeps its panels.
const ROW_BLOCK: usize = 96;
/// Panels per parallel part, at least: smaller parts cost more in scheduling than they gain.
const MIN_PANELS: usize = 8;

/// Whether the kernels run their AVX2 versions: where the CPU has AVX2 and FMA, unless
/// `SESA_KERNELS=portable` holds them to their portable twins (the same bits), to measure the
/// vector code or check end to end that results do not depend on it. Decided once per process.
fn use_avx2() -> bool {
    static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX2.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        let detected = std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
        #[cfg(not(target_arch = "x86_64"))]
        let detected = false;
        match std::env::var("SESA_KERNELS").unwrap_or_default().as_str() {
            "" => detected,
            "portable" => false,
            other => {
                tracing::warn!("SESA_KERNELS={other:?} is not `portable`: the kernels use what the CPU has");
                detected
            }
        }
    })
}

/// How a model's weight matrices are stored and multiplied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// F32, as trained: a GGUF's quantized values dequantized exactly.
    #[default]
    F32,
    /// Int8 with one scale per 32 inputs of each output (as GGUF's Q8_0), times activations
    /// rounded to 16 bits: a quarter of the bytes, faster decoding, log-probabilities a little
    /// off F32's (still bit-reproducible).
    Int8,
}

impl Precision {
    /// Its name in specs and tables.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Int8 => "int8",
        }
    }
}

/// A weight matrix `W [outputs, inputs]` (as checkpoints store dense layers), packed once at
/// load for `x · Wᵀ`.
pub(crate) enum PackedWeight {
    F32(F32Panels),
    Int8(Int8Panels),
}

impl PackedWeight {
    /// Packs `weight`, `outputs × inputs` row-major, in `precision`.
    pub(crate) fn new(weight: &[f32], inputs: usize, outputs: usize, precision: Precision) -> PackedWeight {
        assert_eq!(weight.len(), inputs * outputs, "PackedWeight: {} values for {outputs}×{inputs}", weight.len());
        match precision {
            Precision::F32 => PackedWeight::F32(F32Panels::new(weight, inputs, outputs)),
            Precision::Int8 => PackedWeight::Int8(Int8Panels::new(weight, inputs, outputs)),
        }
    }

    fn inputs(&self) -> usize {
        match self {
            PackedWeight::F32(w) => w.inputs(),
            PackedWeight::Int8(w) => w.inputs(),
        }
    }

    fn outputs(&self) -> usize {
        match self {
            PackedWeight::F32(w) => w.outputs(),
            PackedWeight::Int8(w) => w.outputs(),
        }
    }

    /// `out[rows × outputs] (+)= x[rows × inputs] · Wᵀ`; `accumulate` adds to `out` instead of
    /// overwriting it. Panels are split over up to `threads` threads.
    pub(crate) fn matmul(&self, x: &[f32], rows: usize, out: &mut [f32], accumulate: bool, threads: usize) {
        let (inputs, outputs) = (self.inputs(), self.outputs());
        assert!(
            x.len() >= rows * inputs && out.len() >= rows * outputs,
            "PackedWeight::matmul: buffers do not match {rows}×{inputs} · ({outputs}×{inputs})ᵀ"
        );
        match self {
            PackedWeight::F32(w) => w.matmul(x, rows, out, accumulate, threads),
            PackedWeight::Int8(w) => w.matmul(x, rows, out, accumulate, threads),
        }
    }
}

/// The sums of one tile: up to [`TILE_ROWS`] rows of one panel's [`LANES`] columns.
type Tile = [[f32; LANES]; TILE_ROWS];

/// A product kernel over packed weights and the rows of one call: `product::<R>(panel, row,
/// sums)` writes the products of rows `row..row + R` with panel `panel` into `sums`.
trait TileKernel: Sync {
    fn product<const R: usize>(&self, panel: usize, row: usize, sums: &mut Tile);
}

/// The tile driver of the product kernels: runs `kernel` on every panel of [`LANES`] output
/// columns and every tile of up to [`TILE_ROWS`] rows, and writes the tile's sums into `out`
/// (`rows × outputs`), or adds them when `accumulate`. Panels are split over up to `threads`
/// threads, which write disjoint columns; a tile's sums never depend on the tile.
fn tiles<K: TileKernel>(kernel: &K, rows: usize, outputs: usize, out: &mut [f32], accumulate: bool, threads: usize) {
    assert!(out.len() >= rows * outputs, "tiles: an output of {} for {rows}×{outputs}", out.len());
    let panels = outputs.div_ceil(LANES);
    let parts = threads.clamp(1, (panels / MIN_PANELS).max(1));
    let per_part = panels.div_ceil(parts);
    let shared = SharedOut(out.as_mut_ptr());
    let part = |part: usize| {
        let panel_range = part * per_part..((part + 1) * per_part).min(panels);
        for block in (0..rows).step_by(ROW_BLOCK) {
            let block_end = (block + ROW_BLOCK).min(rows);
            for p in panel_range.clone() {
                let columns = LANES.min(outputs - p * LANES);
                let mut row = block;
                while row < block_end {
                    let tile = (block_end - row).min(TILE_ROWS);
                    let mut sums = [[0.0f32; LANES]; TILE_ROWS];
                    match tile {
                        6 => kernel.product::<6>(p, row, &mut sums),
                        5 => kernel.product::<5>(p, row, &mut sums),
                        4 => kernel.product::<4>(p, row, &mut sums),
                        3 => kernel.product::<3>(p, row, &mut sums),
                        2 => kernel.product::<2>(p, row, &mut sums),
                        _ => kernel.product::<1>(p, row, &mut sums),
                    }
                    for (r, sums) in sums.iter().take(tile).enumerate() {
                        // SAFETY: the assertion above bounds `row + r < rows` and the
                        // columns `p * LANES + c < outputs`; parts write disjoint panels.
                        let target = unsafe {
                            std::slice::from_raw_parts_mut(shared.at((row + r) * outputs + p * LANES), columns)
                        };
                        if accumulate {
                            target.iter_mut().zip(sums).for_each(|(t, s)| *t += s);
                        } else {
                            target.copy_from_slice(&sums[..columns]);
                        }
                    }
                    row += tile;
                }
            }
        }
    };
    if parts == 1 {
        part(0);
    } else {
        (0..parts).into_par_iter().for_each(part);
    }
}

/// Stores a vector kernel's two accumulators per row into the rows of `sums`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
fn store_tile(acc: &[[std::arch::x86_64::__m256; 2]], sums: &mut Tile) {
    use std::arch::x86_64::_mm256_storeu_ps;
    for (sums, acc) in sums.iter_mut().zip(acc) {
        // SAFETY: each row of `sums` holds LANES = 16 floats.
        unsafe {
            _mm256_storeu_ps(sums.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(sums.as_mut_ptr().add(8), acc[1]);
        }
    }
}

/// The output buffer shared by the parts of [`tiles`], which write disjoint columns.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);

// SAFETY: see `tiles`: parts write disjoint elements.
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

impl SharedOut {
    fn at(self, offset: usize) -> *mut f32 {
        // SAFETY: callers pass an offset inside the buffer.
        unsafe { self.0.add(offset) }
    }
}

/// A dense layer `y = x Wᵀ + b`.
pub(crate) struct Dense {
    pub(crate) weight: PackedWeight,
    pub(crate) bias: Option<Vec<f32>>,
}

impl Dense {
    /// A layer of `weight` (`outputs × inputs` row-major, as in checkpoints) and `bias`, in
    /// `precision`.
    pub(crate) fn new(
        weight: &[f32],
        bias: Option<Vec<f32>>,
        inputs: usize,
        outputs: usize,
        precision: Precision,
    ) -> Dense {
        Dense { weight: PackedWeight::new(weight, inputs, outputs, precision), bias }
    }

    pub(crate) fn inputs(&self) -> usize {
        self.weight.inputs()
    }

    /// Writes `x Wᵀ + b` for `rows` rows of `x` into `out`, on up to `threads` threads.
    pub(crate) fn forward(&self, x: &[f32], rows: usize, out: &mut [f32], threads: usize) {
        let outputs = self.weight.outputs();
        let out = &mut out[..rows * outputs];
        if let Some(bias) = &self.bias {
            out.chunks_exact_mut(outputs).for_each(|row| row.copy_from_slice(bias));
        }
        self.weight.matmul(x, rows, out, self.bias.is_some(), threads);
    }
}

/// A dot product in eight independent lanes, so the compiler can keep it in SIMD registers
/// (a plain `sum` must add in order); the order is fixed by the length alone.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (a_chunks, b_chunks) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a_chunks.remainder().iter().zip(b_chunks.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in a_chunks.zip(b_chunks) {
        for lane in 0..8 {
            lanes[lane] += x[lane] * y[lane];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// `target += other`, element by element.
pub(crate) fn add_assign(target: &mut [f32], other: &[f32]) {
    target.iter_mut().zip(other).for_each(|(t, o)| *t += o);
}

/// The keys and values of one key-value head over `count` tokens: token `j`'s key is
/// `keys[j * stride + offset..][..width]`, its value the same slice of `values`.
#[derive(Clone, Copy)]
pub(crate) struct KvHead<'a> {
    pub(crate) keys: &'a [f32],
    pub(crate) values: &'a [f32],
    pub(crate) count: usize,
    pub(crate) stride: usize,
    pub(crate) offset: usize,
    pub(crate) width: usize,
}

/// Softmax attention of the query heads that share one key-value head (`queries`: one or more
/// heads of `width`, side by side): writes each head's `Σ softmax(q·k · scale) v` into its
/// part of `out`. `scores` is scratch space.
///
/// The heads are computed together so that each key and value is read once for all of them
/// (grouped-query attention: three query heads per key-value head in SmolLM2), but each head's
/// arithmetic is its own, in the order it would have alone: a head's output does not depend
/// on the others.
pub(crate) fn attend(queries: &[f32], head: KvHead<'_>, scale: f32, scores: &mut Vec<f32>, out: &mut [f32]) {
    let KvHead { keys, count, stride, offset, width, .. } = head;
    let heads = queries.len() / width;
    // Key-major (`count × heads`): the weights of one key for a group of heads are contiguous.
    scores.clear();
    for j in 0..count {
        let key = &keys[j * stride + offset..][..width];
        scores.extend(queries.chunks_exact(width).map(|query| dot(query, key) * scale));
    }
    for h in 0..heads {
        let max = scores.iter().skip(h).step_by(heads).fold(f32::NEG_INFINITY, |max, score| max.max(*score));
        scores.iter_mut().skip(h).step_by(heads).for_each(|score| *score -= max);
    }
    exp_in_place(scores);
    for h in 0..heads {
        let total: f32 = scores.iter().skip(h).step_by(heads).sum();
        scores.iter_mut().skip(h).step_by(heads).for_each(|weight| *weight /= total);
    }
    weigh_values(scores, heads, head, out);
}

/// `out[h] = Σ_j weights[j][h] · value_j` for every head `h` (`weights`: `count × heads`): each
/// sum adds the keys in order, a product and then a sum per key (not fused), with AVX2 where the
/// CPU has it and the width is whole blocks of 16.
fn weigh_values(weights: &[f32], heads: usize, head: KvHead<'_>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if head.width.is_multiple_of(16) && use_avx2() {
        let mut first = 0;
        while first < heads {
            let group = (heads - first).min(4);
            let out = &mut out[first * head.width..(first + group) * head.width];
            // SAFETY: the CPU has AVX2.
            unsafe {
                match group {
                    4 => weigh_values_avx2::<4>(weights, heads, first, head, out),
                    3 => weigh_values_avx2::<3>(weights, heads, first, head, out),
                    2 => weigh_values_avx2::<2>(weights, heads, first, head, out),
                    _ => weigh_values_avx2::<1>(weights, heads, first, head, out),
                }
            }
            first += group;
        }
        return;
    }
    weigh_values_portable(weights, heads, head, out);
}

/// [`weigh_values`] element by element: the very bits of the vector version.
fn weigh_values_portable(weights: &[f32], heads: usize, head: KvHead<'_>, out: &mut [f32]) {
    let KvHead { values, stride, offset, width, .. } = head;
    for (h, out) in out.chunks_exact_mut(width).enumerate() {
        for (i, out) in out.iter_mut().enumerate() {
            *out = weights
                .chunks_exact(heads)
                .enumerate()
                .fold(0.0, |sum, (j, weights)| sum + weights[h] * values[j * stride + offset + i]);
        }
    }
}

/// [`weigh_values`] for the `G ≤ 4` heads from `first`, 16 output columns at a time: the
/// `2G` sums in registers over all keys, each key's value block loaded once for the group.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn weigh_values_avx2<const G: usize>(weights: &[f32], heads: usize, first: usize, head: KvHead<'_>, out: &mut [f32]) {
    use std::arch::x86_64::{
        __m256, _mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_set1_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };
    let KvHead { values, count, stride, offset, width, .. } = head;
    assert!(
        first + G <= heads
            && weights.len() >= count * heads
            && out.len() >= G * width
            && (count == 0 || values.len() >= (count - 1) * stride + offset + width),
        "weigh_values: {G} heads from {first} of {heads}, {count} keys"
    );
    for start in (0..width).step_by(16) {
        let mut sums: [[__m256; 2]; G] = [[_mm256_setzero_ps(); 2]; G];
        for j in 0..count {
            // SAFETY: j < count, start + 16 ≤ width and g < G keep every read inside the
            // asserted lengths.
            unsafe {
                let value = values.as_ptr().add(j * stride + offset + start);
                let (low, high) = (_mm256_loadu_ps(value), _mm256_loadu_ps(value.add(8)));
                for (g, sums) in sums.iter_mut().enumerate() {
                    let weight = _mm256_set1_ps(*weights.get_unchecked(j * heads + first + g));
                    sums[0] = _mm256_add_ps(sums[0], _mm256_mul_ps(weight, low));
                    sums[1] = _mm256_add_ps(sums[1], _mm256_mul_ps(weight, high));
                }
            }
        }
        for (g, sums) in sums.iter().enumerate() {
            // SAFETY: g < G and start + 16 ≤ width: inside the asserted `out`.
            unsafe {
                let out = out.as_mut_ptr().add(g * width + start);
                _mm256_storeu_ps(out, sums[0]);
                _mm256_storeu_ps(out.add(8), sums[1]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_rows_do_not_depend_on_the_batch_or_the_threads() {
        let (inputs, outputs) = (300, 700);
        let weight: Vec<f32> = (0..inputs * outputs).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        let layer =
            Dense::new(&weight, Some((0..outputs).map(|i| i as f32 * 0.01).collect()), inputs, outputs, Precision::F32);
        let x: Vec<f32> = (0..37 * inputs).map(|i| ((i * 104_729) % 997) as f32 / 997.0 - 0.5).collect();
        let apply = |x: &[f32], rows: usize, threads: usize| {
            let mut out = vec![0.0; rows * outputs];
            layer.forward(x, rows, &mut out, threads);
            out
        };
        let batch = apply(&x, 37, 4);
        let row = 23;
        let alone = apply(&x[row * inputs..(row + 1) * inputs], 1, 1);
        assert_eq!(&batch[row * outputs..(row + 1) * outputs], alone.as_slice());
        let plain: f32 = (0..inputs).map(|k| x[row * inputs + k] * weight[5 * inputs + k]).sum::<f32>() + 0.05;
        assert!((alone[5] - plain).abs() < 1e-3, "{} vs {plain}", alone[5]);
    }

    #[test]
    fn dot_handles_every_length() {
        for len in [0, 1, 7, 8, 9, 32, 33] {
            let a: Vec<f32> = (0..len).map(|i| i as f32).collect();
            let b: Vec<f32> = (0..len).map(|i| 2.0 - i as f32 * 0.5).collect();
            let plain: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert!((dot(&a, &b) - plain).abs() < 1e-3, "length {len}");
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
        let (count, heads, width, stride) = (9, 3, 32, 70);
        let values: Vec<f32> = (0..count * stride).map(|i| ((i * 104_729) % 997) as f32 / 997.0 - 0.5).collect();
        let weights: Vec<f32> = (0..count * heads).map(|i| ((i * 7919) % 101) as f32 / 101.0).collect();
        let head = KvHead { keys: &values, values: &values, count, stride, offset: 5, width };
        let (mut fast, mut plain) = (vec![0.0; heads * width], vec![0.0; heads * width]);
        weigh_values(&weights, heads, head, &mut fast);
        weigh_values_portable(&weights, heads, head, &mut plain);
        assert_eq!(fast, plain);
        assert!(plain.iter().all(|v| *v != 0.0));
    }
}
