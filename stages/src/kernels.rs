//! Numeric kernels shared by the CPU forward passes (the BERT embedder, the llama policy).
//! Each output element is summed in an order fixed by the shapes of the weights alone, never by
//! the number of rows or threads: a row's result does not depend on how work was batched.

use rayon::prelude::*;

/// Output columns per parallel part, at least: smaller parts cost more in scheduling than
/// they gain.
const MIN_PART: usize = 128;

/// `out[rows × outputs] (+)= x[rows × inputs] · Wᵀ` with `W` stored `[outputs, inputs]`
/// row-major (as checkpoints store dense layers); `accumulate` adds to `out` instead of
/// overwriting it. The output columns are split over up to `threads` threads.
///
/// matrixmultiply's sgemm sums each element over k in the same blocks whatever the number of
/// rows, and splitting columns does not touch the sums: the result is row-invariant. (It also
/// runs at 85–107 GFLOP/s on one core here, against 56 for the `gemm` crate candle uses.)
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_t(
    x: &[f32],
    rows: usize,
    weight: &[f32],
    inputs: usize,
    outputs: usize,
    out: &mut [f32],
    accumulate: bool,
    threads: usize,
) {
    assert!(
        x.len() >= rows * inputs && weight.len() == outputs * inputs && out.len() >= rows * outputs,
        "matmul_t: buffers do not match {rows}×{inputs} · ({outputs}×{inputs})ᵀ"
    );
    let parts = threads.clamp(1, (outputs / MIN_PART).max(1));
    let width = outputs.div_ceil(parts);
    let out = SharedOut(out.as_mut_ptr());
    let part = |p: usize| {
        let (start, end) = (p * width, ((p + 1) * width).min(outputs));
        if start >= end {
            return;
        }
        // SAFETY: the assertion above keeps every access in bounds; `x` is `rows × inputs`
        // row-major, the weight rows `start..end` are read as a transposed `inputs × (end -
        // start)` matrix, and each part writes only its own columns `start..end` of `out`.
        unsafe {
            matrixmultiply::sgemm(
                rows,
                inputs,
                end - start,
                1.0,
                x.as_ptr(),
                inputs as isize,
                1,
                weight.as_ptr().add(start * inputs),
                1,
                inputs as isize,
                if accumulate { 1.0 } else { 0.0 },
                out.at(start),
                outputs as isize,
                1,
            );
        }
    };
    if parts == 1 {
        part(0);
    } else {
        (0..parts).into_par_iter().for_each(part);
    }
}

/// The output buffer shared by the column parts of [`matmul_t`], which write disjoint columns.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);

// SAFETY: see `matmul_t`: parts write disjoint elements.
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

impl SharedOut {
    fn at(self, offset: usize) -> *mut f32 {
        // SAFETY: `offset` is a column index below the row width, inside the buffer.
        unsafe { self.0.add(offset) }
    }
}

/// A dense layer `y = x Wᵀ + b`, with `W` stored `[outputs, inputs]` as in checkpoints.
pub(crate) struct Dense {
    pub(crate) weight: Vec<f32>,
    pub(crate) bias: Option<Vec<f32>>,
    pub(crate) inputs: usize,
    pub(crate) outputs: usize,
}

impl Dense {
    /// Writes `x Wᵀ + b` for `rows` rows of `x` into `out`, on up to `threads` threads.
    pub(crate) fn forward(&self, x: &[f32], rows: usize, out: &mut [f32], threads: usize) {
        let out = &mut out[..rows * self.outputs];
        if let Some(bias) = &self.bias {
            out.chunks_exact_mut(self.outputs).for_each(|row| row.copy_from_slice(bias));
        }
        matmul_t(x, rows, &self.weight, self.inputs, self.outputs, out, self.bias.is_some(), threads);
    }

    /// [`Self::forward`] into a new buffer.
    pub(crate) fn apply(&self, x: &[f32], rows: usize, threads: usize) -> Vec<f32> {
        let mut out = vec![0.0; rows * self.outputs];
        self.forward(x, rows, &mut out, threads);
        out
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
    out.fill(0.0);
    for (j, score) in scores.iter().enumerate() {
        let weight = score / total;
        let value = &values[j * stride + offset..][..width];
        out.iter_mut().zip(value).for_each(|(o, v)| *o += weight * v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_rows_do_not_depend_on_the_batch_or_the_threads() {
        let (inputs, outputs) = (300, 700);
        let weight: Vec<f32> = (0..inputs * outputs).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        let layer = Dense { weight, bias: Some((0..outputs).map(|i| i as f32 * 0.01).collect()), inputs, outputs };
        let x: Vec<f32> = (0..37 * inputs).map(|i| ((i * 104_729) % 997) as f32 / 997.0 - 0.5).collect();
        let batch = layer.apply(&x, 37, 4);
        let row = 23;
        let alone = layer.apply(&x[row * inputs..(row + 1) * inputs], 1, 1);
        assert_eq!(&batch[row * outputs..(row + 1) * outputs], alone.as_slice());
        let plain: f32 = (0..inputs).map(|k| x[row * inputs + k] * layer.weight[5 * inputs + k]).sum::<f32>() + 0.05;
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
        attend(&query, &keys, &values, 2, 2, 0, 1.0, &mut Vec::new(), &mut out);
        let p = 1.0 / (1.0 + 1.0f32.exp());
        assert!((out[0] - 10.0 * p).abs() < 1e-5 && (out[1] - 10.0 * (1.0 - p)).abs() < 1e-5, "{out:?}");
    }
}
