//! Numeric kernels shared by the CPU forward passes (the BERT embedder, the llama policy).
//! Each output element is summed in an order fixed by the shapes of the weights alone, never by
//! the number of rows or threads: a row's result does not depend on how work was batched.

use rayon::prelude::*;

/// Output columns per panel of a [`PackedWeight`]: two 8-lane registers.
const LANES: usize = 16;
/// Rows per tile of the product kernel: with two accumulators per row and the two weight
/// registers, six rows fill the sixteen AVX registers.
const TILE_ROWS: usize = 6;
/// Rows whose inputs stay in cache while a thread sweeps its panels.
const ROW_BLOCK: usize = 96;
/// Panels per parallel part, at least: smaller parts cost more in scheduling than they gain.
const MIN_PANELS: usize = 8;

/// A weight matrix `W [outputs, inputs]` (as checkpoints store dense layers), laid out once at
/// load for `x · Wᵀ`: panels of [`LANES`] output columns, each `inputs × LANES` with the
/// columns side by side (the last panel padded with zeros).
///
/// Packing once is the point: a general sgemm (matrixmultiply, which this replaced) repacks
/// the weights on every call, which took 27 % of decoding time when each call has a few rows.
pub(crate) struct PackedWeight {
    panels: Vec<f32>,
    inputs: usize,
    outputs: usize,
}

impl PackedWeight {
    /// Packs `weight`, `outputs × inputs` row-major.
    pub(crate) fn new(weight: &[f32], inputs: usize, outputs: usize) -> PackedWeight {
        assert_eq!(weight.len(), inputs * outputs, "PackedWeight: {} values for {outputs}×{inputs}", weight.len());
        let count = outputs.div_ceil(LANES);
        let mut panels = vec![0.0f32; count * inputs * LANES];
        for (p, panel) in panels.chunks_exact_mut((inputs * LANES).max(1)).enumerate() {
            for lane in 0..LANES.min(outputs - p * LANES) {
                let row = &weight[(p * LANES + lane) * inputs..][..inputs];
                for (k, &w) in row.iter().enumerate() {
                    panel[k * LANES + lane] = w;
                }
            }
        }
        PackedWeight { panels, inputs, outputs }
    }

    /// `out[rows × outputs] (+)= x[rows × inputs] · Wᵀ`; `accumulate` adds to `out` instead of
    /// overwriting it. Panels are split over up to `threads` threads.
    ///
    /// Every output element is one chain of fused multiply-adds over `k = 0, 1, …, inputs-1`
    /// from zero (then added to `out` when accumulating), whatever the tile, the number of rows
    /// or threads: the result is row-invariant, and the same on every machine (fused
    /// multiply-add rounds once, in hardware or not).
    pub(crate) fn matmul(&self, x: &[f32], rows: usize, out: &mut [f32], accumulate: bool, threads: usize) {
        let (inputs, outputs) = (self.inputs, self.outputs);
        assert!(
            x.len() >= rows * inputs && out.len() >= rows * outputs,
            "PackedWeight::matmul: buffers do not match {rows}×{inputs} · ({outputs}×{inputs})ᵀ"
        );
        let panels = outputs.div_ceil(LANES);
        let parts = threads.clamp(1, (panels / MIN_PANELS).max(1));
        let per_part = panels.div_ceil(parts);
        let shared = SharedOut(out.as_mut_ptr());
        let part = |part: usize| {
            let panel_range = part * per_part..((part + 1) * per_part).min(panels);
            for block in (0..rows).step_by(ROW_BLOCK) {
                let block_end = (block + ROW_BLOCK).min(rows);
                for p in panel_range.clone() {
                    let panel = &self.panels[p * inputs * LANES..][..inputs * LANES];
                    let columns = LANES.min(outputs - p * LANES);
                    let mut row = block;
                    while row < block_end {
                        let tile = (block_end - row).min(TILE_ROWS);
                        let x = &x[row * inputs..(row + tile) * inputs];
                        let mut sums = [[0.0f32; LANES]; TILE_ROWS];
                        match tile {
                            6 => product::<6>(x, panel, &mut sums),
                            5 => product::<5>(x, panel, &mut sums),
                            4 => product::<4>(x, panel, &mut sums),
                            3 => product::<3>(x, panel, &mut sums),
                            2 => product::<2>(x, panel, &mut sums),
                            _ => product::<1>(x, panel, &mut sums),
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
}

/// The product of `R` rows of `x` (each `inputs` long) with one panel, into `sums`: one fused
/// multiply-add chain per element, `k` ascending, with AVX2 where the CPU has it.
#[inline(always)]
fn product<const R: usize>(x: &[f32], panel: &[f32], sums: &mut [[f32; LANES]; TILE_ROWS]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has the features the function is compiled for.
        return unsafe { product_avx2::<R>(x, panel, sums) };
    }
    product_portable::<R>(x, panel, sums)
}

/// [`product`] element by element; fused multiply-add rounds once, so this gives the very
/// bits of the vector version.
fn product_portable<const R: usize>(x: &[f32], panel: &[f32], sums: &mut [[f32; LANES]; TILE_ROWS]) {
    let inputs = x.len() / R;
    for (r, sums) in sums.iter_mut().take(R).enumerate() {
        let row = &x[r * inputs..][..inputs];
        let mut acc = [0.0f32; LANES];
        for (value, weights) in row.iter().zip(panel.chunks_exact(LANES)) {
            acc.iter_mut().zip(weights).for_each(|(a, w)| *a = value.mul_add(*w, *a));
        }
        *sums = acc;
    }
}

/// [`product`] with the `R × 2` accumulators in AVX registers: per `k`, two weight loads, `R`
/// broadcasts and `2R` fused multiply-adds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn product_avx2<const R: usize>(x: &[f32], panel: &[f32], sums: &mut [[f32; LANES]; TILE_ROWS]) {
    use std::arch::x86_64::{
        __m256, _mm256_broadcast_ss, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };
    let inputs = x.len() / R;
    assert!(
        x.len() == R * inputs && panel.len() >= inputs * LANES,
        "product: {R} rows of {inputs} and a panel of {}",
        panel.len()
    );
    let (x, panel) = (x.as_ptr(), panel.as_ptr());
    let mut acc: [[__m256; 2]; R] = [[_mm256_setzero_ps(); 2]; R];
    for k in 0..inputs {
        // SAFETY: k < inputs and r < R keep every read inside `x` (R × inputs) and `panel`
        // (inputs × LANES), as asserted above.
        unsafe {
            let low = _mm256_loadu_ps(panel.add(k * LANES));
            let high = _mm256_loadu_ps(panel.add(k * LANES + 8));
            for (r, acc) in acc.iter_mut().enumerate() {
                let value = _mm256_broadcast_ss(&*x.add(r * inputs + k));
                acc[0] = _mm256_fmadd_ps(value, low, acc[0]);
                acc[1] = _mm256_fmadd_ps(value, high, acc[1]);
            }
        }
    }
    for (sums, acc) in sums.iter_mut().zip(&acc) {
        // SAFETY: each row of `sums` holds LANES = 16 floats.
        unsafe {
            _mm256_storeu_ps(sums.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(sums.as_mut_ptr().add(8), acc[1]);
        }
    }
}

/// The output buffer shared by the parts of [`PackedWeight::matmul`], which write disjoint
/// columns.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);

// SAFETY: see `PackedWeight::matmul`: parts write disjoint elements.
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
    /// A layer of `weight` (`outputs × inputs` row-major, as in checkpoints) and `bias`.
    pub(crate) fn new(weight: &[f32], bias: Option<Vec<f32>>, inputs: usize, outputs: usize) -> Dense {
        Dense { weight: PackedWeight::new(weight, inputs, outputs), bias }
    }

    pub(crate) fn inputs(&self) -> usize {
        self.weight.inputs
    }

    /// Writes `x Wᵀ + b` for `rows` rows of `x` into `out`, on up to `threads` threads.
    pub(crate) fn forward(&self, x: &[f32], rows: usize, out: &mut [f32], threads: usize) {
        let outputs = self.weight.outputs;
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

/// Softmax attention of one query over `count` keys and values stored `stride` floats apart,
/// starting at `offset` in each row: writes `Σ softmax(q·k · scale) v` into `out`. `scores`
/// is scratch space.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    query: &[f32],
    keys: &[f32],
    values: &[f32],
    count: usize,
    stride: usize,
    offset: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let width = query.len();
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for j in 0..count {
        let score = dot(query, &keys[j * stride + offset..][..width]) * scale;
        max = max.max(score);
        scores.push(score);
    }
    let mut total = 0.0;
    for score in scores.iter_mut() {
        *score = (*score - max).exp();
        total += *score;
    }
    scores.iter_mut().for_each(|score| *score /= total);
    // Block by block of output columns, the block's sums held in registers over all keys (a
    // whole row of sums would go through memory at every key). Each sum adds the keys in order.
    // Full blocks go through a fixed-size array, which is what lets the compiler keep them in
    // registers; the two loops compute the same thing.
    const BLOCK: usize = 32;
    for (b, out) in out.chunks_mut(BLOCK).enumerate() {
        let start = offset + b * BLOCK;
        let mut sums = [0.0f32; BLOCK];
        if out.len() == BLOCK {
            for (j, weight) in scores.iter().enumerate() {
                let value: &[f32; BLOCK] = values[j * stride + start..][..BLOCK].try_into().expect("a block");
                sums.iter_mut().zip(value).for_each(|(s, v)| *s += weight * v);
            }
        } else {
            for (j, weight) in scores.iter().enumerate() {
                let value = &values[j * stride + start..][..out.len()];
                sums.iter_mut().zip(value).for_each(|(s, v)| *s += weight * v);
            }
        }
        out.copy_from_slice(&sums[..out.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_rows_do_not_depend_on_the_batch_or_the_threads() {
        let (inputs, outputs) = (300, 700);
        let weight: Vec<f32> = (0..inputs * outputs).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        let layer = Dense::new(&weight, Some((0..outputs).map(|i| i as f32 * 0.01).collect()), inputs, outputs);
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
    fn the_vector_product_gives_the_bits_of_the_portable_one() {
        let inputs = 77;
        let x: Vec<f32> = (0..TILE_ROWS * inputs).map(|i| ((i * 7919) % 1009) as f32 / 1009.0 - 0.5).collect();
        let panel: Vec<f32> = (0..inputs * LANES).map(|i| ((i * 104_729) % 997) as f32 / 997.0 - 0.5).collect();
        fn both<const R: usize>(x: &[f32], panel: &[f32]) {
            let (mut fast, mut plain) = ([[0.0; LANES]; TILE_ROWS], [[0.0; LANES]; TILE_ROWS]);
            product::<R>(&x[..R * (x.len() / TILE_ROWS)], panel, &mut fast);
            product_portable::<R>(&x[..R * (x.len() / TILE_ROWS)], panel, &mut plain);
            assert_eq!(fast, plain, "{R} rows");
            assert_ne!(fast[0], [0.0; LANES]);
        }
        both::<1>(&x, &panel);
        both::<3>(&x, &panel);
        both::<6>(&x, &panel);
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
        attend(&query, &keys, &values, 2, 2, 0, 1.0, &mut Vec::new(), &mut out);
        let p = 1.0 / (1.0 + 1.0f32.exp());
        assert!((out[0] - 10.0 * p).abs() < 1e-5 && (out[1] - 10.0 * (1.0 - p)).abs() < 1e-5, "{out:?}");
    }
}
