//! Numeric kernels shared by the CPU forward passes (the BERT embedder, the llama policy).
//! Each output element is summed in an order fixed by the shapes of the weights alone, never by
//! the number of rows or threads: a row's result does not depend on how work was batched.
//!
//! Weight matrices are packed once at load, in the [`Precision`] a model asks for: F32 panels
//! (`f32_panels`), or int8 values with a scale per 32 inputs (`int8_panels`). Both are
//! multiplied tile by tile through one driver, [`tiles`], which owns the threading and the
//! order of the output writes.

mod f32_panels;
mod int8_panels;

use rayon::prelude::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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

/// The tile driver of the product kernels: calls `product(panel, row, tile, sums)` for every
/// panel of [`LANES`] output columns and every tile of `tile ≤ TILE_ROWS` rows from `row`, and
/// writes the tile's sums into `out` (`rows × outputs`), or adds them when `accumulate`. Panels
/// are split over up to `threads` threads, which write disjoint columns; a tile's sums never
/// depend on the tile.
fn tiles<F>(rows: usize, outputs: usize, out: &mut [f32], accumulate: bool, threads: usize, product: F)
where
    F: Fn(usize, usize, usize, &mut [[f32; LANES]; TILE_ROWS]) + Sync,
{
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
                    product(p, row, tile, &mut sums);
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
    scores.clear();
    scores.resize(heads * count, 0.0);
    for j in 0..count {
        let key = &keys[j * stride + offset..][..width];
        for (h, query) in queries.chunks_exact(width).enumerate() {
            scores[h * count + j] = dot(query, key) * scale;
        }
    }
    for weights in scores.chunks_exact_mut(count.max(1)) {
        let max = weights.iter().fold(f32::NEG_INFINITY, |max, score| max.max(*score));
        let mut total = 0.0;
        for weight in weights.iter_mut() {
            *weight = (*weight - max).exp();
            total += *weight;
        }
        weights.iter_mut().for_each(|weight| *weight /= total);
    }
    let mut first = 0;
    while first < heads {
        let group = (heads - first).min(4);
        let (weights, out) =
            (&scores[first * count..(first + group) * count], &mut out[first * width..(first + group) * width]);
        // The sums of a block of output columns for every head of the group fill the
        // registers: 4 × 32 floats for one or two heads, 6 or 8 × 16 for three or four.
        match group {
            4 => weigh_values::<4, 16>(weights, head, out),
            3 => weigh_values::<3, 16>(weights, head, out),
            2 => weigh_values::<2, 32>(weights, head, out),
            _ => weigh_values::<1, 32>(weights, head, out),
        }
        first += group;
    }
}

/// `out[g] = Σ_j weights[g][j] · value_j` for `G` heads, block by block of `B` output columns,
/// the block's sums held in registers over all keys (a whole row of sums would go through
/// memory at every key). Each sum adds the keys in order, whatever `G` and `B`. Full blocks go
/// through a fixed-size array, which is what lets the compiler keep them in registers; the
/// two loops compute the same thing.
fn weigh_values<const G: usize, const B: usize>(weights: &[f32], head: KvHead<'_>, out: &mut [f32]) {
    let KvHead { values, count, stride, offset, width, .. } = head;
    for start in (0..width).step_by(B) {
        let len = B.min(width - start);
        let mut sums = [[0.0f32; B]; G];
        if len == B {
            for j in 0..count {
                let value: &[f32; B] = values[j * stride + offset + start..][..B].try_into().expect("a block");
                for (g, sums) in sums.iter_mut().enumerate() {
                    let weight = weights[g * count + j];
                    sums.iter_mut().zip(value).for_each(|(s, v)| *s += weight * v);
                }
            }
        } else {
            for j in 0..count {
                let value = &values[j * stride + offset + start..][..len];
                for (g, sums) in sums.iter_mut().enumerate() {
                    let weight = weights[g * count + j];
                    sums.iter_mut().zip(value).for_each(|(s, v)| *s += weight * v);
                }
            }
        }
        for (g, sums) in sums.iter().enumerate() {
            out[g * width + start..][..len].copy_from_slice(&sums[..len]);
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
}
