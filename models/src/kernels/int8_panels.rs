//! Int8 weights with one scale per [`BLOCK`] inputs of each output column (symmetric, as
//! GGUF's Q8_0), times activations quantized to 16 bits with one scale per block of each row.
//!
//! Within a block the dot product is an exact integer sum: pairs of 16-bit products
//! (`vpmaddwd`) added in 32-bit lanes, which cannot overflow (32 × 32767 × 127 < 2³¹). Blocks
//! are then added in order in F32, each as one fused multiply-add of its integer sum
//! (converted, rounding to nearest) by the product of the two scales. An integer sum does not
//! depend on its order, and the float steps are the same in the vector and the portable code:
//! results are row-invariant and the same bits on every machine, as with F32 weights.
//!
//! A quarter of the F32 weights' bytes is what makes decoding faster (each step streams every
//! weight once for all its rows); 16-bit activations keep nearly all of their precision, so
//! the gap to F32 is the weights' rounding.

#[cfg(target_arch = "x86_64")]
use super::lanes::{Avx2, Avx512, Lanes, store_rows};
use super::{LANES, Level, SharedOut, Tile, TileKernel, for_each_chunk_mut, level, tiles};

/// Inputs per scale.
pub(crate) const BLOCK: usize = 32;
/// Pairs of inputs per block: one `vpmaddwd` each.
const PAIRS: usize = BLOCK / 2;
/// Weights in −127..=127: as Q8_0.
const WEIGHT_LEVELS: f32 = 127.0;
/// Activations in −32767..=32767.
const ACTIVATION_LEVELS: f32 = 32767.0;

/// A weight matrix `W [outputs, inputs]` quantized and laid out once at load for `x · Wᵀ`.
pub(crate) struct Int8Panels {
    /// Per panel of [`LANES`] columns, per block, per pair of inputs `(2j, 2j+1)`: each
    /// column's two values side by side, so that sign-extended to 16 bits a column is one
    /// 32-bit lane. Inputs past the end and columns past the last are zeros.
    values: Vec<i8>,
    /// Per panel, per block: the [`LANES`] columns' scales.
    scales: Vec<f32>,
    inputs: usize,
    outputs: usize,
    blocks: usize,
}

impl Int8Panels {
    /// Quantizes and packs `weight`, `outputs × inputs` row-major: each column's block is
    /// scaled so that its largest magnitude is 127, and rounded.
    pub(super) fn new(weight: &[f32], inputs: usize, outputs: usize) -> Int8Panels {
        let blocks = inputs.div_ceil(BLOCK);
        let panels = outputs.div_ceil(LANES);
        let mut values = vec![0i8; panels * blocks * BLOCK * LANES];
        let mut scales = vec![0.0f32; panels * blocks * LANES];
        for column in 0..outputs {
            let (p, lane) = (column / LANES, column % LANES);
            for (b, block) in weight[column * inputs..][..inputs].chunks(BLOCK).enumerate() {
                let (scale, inverse) = scale(block, WEIGHT_LEVELS);
                scales[(p * blocks + b) * LANES + lane] = scale;
                let start = (p * blocks + b) * BLOCK * LANES;
                for (k, w) in block.iter().enumerate() {
                    // `as` saturates: a value rounded past the levels stays at the edge.
                    values[start + (k / 2) * 2 * LANES + lane * 2 + k % 2] = (w * inverse).round() as i8;
                }
            }
        }
        Int8Panels { values, scales, inputs, outputs, blocks }
    }

    pub(super) fn inputs(&self) -> usize {
        self.inputs
    }

    pub(super) fn outputs(&self) -> usize {
        self.outputs
    }

    /// `out (+)= x · Wᵀ`, see [`super::PackedWeight::matmul`]. The rows of `x` are quantized
    /// first, each on its own, so a row's result does not depend on the others.
    pub(super) fn matmul(&self, x: &[f32], rows: usize, out: &mut [f32], accumulate: bool, threads: usize) {
        let x = QuantizedRows::new(&x[..rows * self.inputs], self.inputs, self.blocks, threads);
        tiles(&Int8Rows { weights: self, x: &x }, rows, self.outputs, out, accumulate, threads);
    }

    /// Panel `p`'s values and scales.
    fn panel(&self, p: usize) -> Panel<'_> {
        let blocks = self.blocks;
        Panel {
            values: &self.values[p * blocks * BLOCK * LANES..][..blocks * BLOCK * LANES],
            scales: &self.scales[p * blocks * LANES..][..blocks * LANES],
        }
    }
}

/// The quantized rows of one call with the weights they multiply.
struct Int8Rows<'a> {
    weights: &'a Int8Panels,
    x: &'a QuantizedRows,
}

impl TileKernel for Int8Rows<'_> {
    fn product<const R: usize>(&self, panel: usize, row: usize, sums: &mut Tile) {
        product::<R>(self.x.rows(row, R), self.weights.panel(panel), sums);
    }
}

/// The scale that maps the largest magnitude of `values` to `levels`, and its inverse (both 0
/// for a block of zeros).
fn scale(values: &[f32], levels: f32) -> (f32, f32) {
    let max = values.iter().fold(0.0f32, |max, v| max.max(v.abs()));
    if max > 0.0 { (max / levels, levels / max) } else { (0.0, 0.0) }
}

/// Rows of activations as 16-bit integers with one scale per block, each row padded with
/// zeros to whole blocks.
struct QuantizedRows {
    values: Vec<i16>,
    scales: Vec<f32>,
    blocks: usize,
}

/// A run of consecutive quantized rows.
#[derive(Clone, Copy)]
struct Rows<'a> {
    /// `rows × blocks × BLOCK`.
    values: &'a [i16],
    /// `rows × blocks`.
    scales: &'a [f32],
    blocks: usize,
}

/// One panel's values and scales.
#[derive(Clone, Copy)]
struct Panel<'a> {
    values: &'a [i8],
    scales: &'a [f32],
}

impl QuantizedRows {
    /// Rows in parallel: the product's threads would otherwise wait on this one.
    fn new(x: &[f32], inputs: usize, blocks: usize, threads: usize) -> QuantizedRows {
        let rows = x.len() / inputs;
        let mut values = vec![0i16; rows * blocks * BLOCK];
        let mut scales = vec![0.0f32; rows * blocks];
        let row_scales = SharedOut::new(&mut scales);
        for_each_chunk_mut(&mut values, blocks * BLOCK, threads, |r, quantized| {
            // SAFETY: row r's scales, inside the buffer; each part writes its own row's.
            let row_scales = unsafe { std::slice::from_raw_parts_mut(row_scales.at(r * blocks), blocks) };
            let row = &x[r * inputs..][..inputs];
            for ((block, quantized), row_scale) in
                row.chunks(BLOCK).zip(quantized.chunks_exact_mut(BLOCK)).zip(row_scales)
            {
                let (scale, inverse) = scale(block, ACTIVATION_LEVELS);
                *row_scale = scale;
                quantized.iter_mut().zip(block).for_each(|(q, v)| *q = (v * inverse).round() as i16);
            }
        });
        QuantizedRows { values, scales, blocks }
    }

    fn rows(&self, first: usize, count: usize) -> Rows<'_> {
        let width = self.blocks * BLOCK;
        Rows {
            values: &self.values[first * width..][..count * width],
            scales: &self.scales[first * self.blocks..][..count * self.blocks],
            blocks: self.blocks,
        }
    }
}

/// The product of `R` quantized rows with one panel, into `sums`, with AVX-512 or AVX2 where
/// the CPU has it.
#[inline(always)]
fn product<const R: usize>(x: Rows<'_>, panel: Panel<'_>, sums: &mut Tile) {
    product_at::<R>(level(), x, panel, sums);
}

/// [`product`] with the vector code of `level` (which the CPU must have).
#[inline(always)]
fn product_at<const R: usize>(level: Level, x: Rows<'_>, panel: Panel<'_>, sums: &mut Tile) {
    // SAFETY: the CPU has the level's features.
    #[cfg(target_arch = "x86_64")]
    match level {
        Level::Avx512 => return unsafe { product_avx512::<R>(x, panel, sums) },
        Level::Avx2 => return unsafe { product_avx2::<R>(x, panel, sums) },
        Level::Portable => {}
    }
    let _ = level;
    product_portable::<R>(x, panel, sums)
}

/// [`product`] element by element: the same integer sums, and the same float operations in
/// the same order, so the very bits of the vector version.
fn product_portable<const R: usize>(x: Rows<'_>, panel: Panel<'_>, sums: &mut Tile) {
    let width = x.blocks * BLOCK;
    for (r, sums) in sums.iter_mut().take(R).enumerate() {
        let mut acc = [0.0f32; LANES];
        for b in 0..x.blocks {
            let inputs = &x.values[r * width + b * BLOCK..][..BLOCK];
            let values = &panel.values[b * BLOCK * LANES..][..BLOCK * LANES];
            let mut block = [0i32; LANES];
            for (pair, values) in inputs.chunks_exact(2).zip(values.chunks_exact(2 * LANES)) {
                for (lane, sum) in block.iter_mut().enumerate() {
                    *sum += i32::from(values[2 * lane]) * i32::from(pair[0])
                        + i32::from(values[2 * lane + 1]) * i32::from(pair[1]);
                }
            }
            let row_scale = x.scales[r * x.blocks + b];
            for (lane, acc) in acc.iter_mut().enumerate() {
                *acc = (block[lane] as f32).mul_add(row_scale * panel.scales[b * LANES + lane], *acc);
            }
        }
        *sums = acc;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn product_avx2<const R: usize>(x: Rows<'_>, panel: Panel<'_>, sums: &mut Tile) {
    // SAFETY: compiled for AVX2 and FMA.
    unsafe { product_vector::<Avx2, R>(x, panel, sums) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn product_avx512<const R: usize>(x: Rows<'_>, panel: Panel<'_>, sums: &mut Tile) {
    // SAFETY: compiled for AVX-512 F, BW and VNNI.
    unsafe { product_vector::<Avx512, R>(x, panel, sums) }
}

/// [`product`] with each row's block sums in one set of [`Lanes`]: per pair of inputs, one
/// load of the panel's 32 weights sign-extended, and per row a broadcast of the pair and its
/// exact integer products added (`vpmaddwd` and an add, or AVX-512 VNNI's `vpdpwssd`); per
/// block, each row's sums scaled and added in F32, lane by lane as the portable code does.
///
/// # Safety
/// The CPU must have `L`'s features.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn product_vector<L: Lanes, const R: usize>(x: Rows<'_>, panel: Panel<'_>, sums: &mut Tile) {
    let (blocks, width) = (x.blocks, x.blocks * BLOCK);
    check_lengths::<R>(x, panel);
    let (inputs, values) = (x.values.as_ptr(), panel.values.as_ptr());
    // SAFETY (every block below): b < blocks, j < PAIRS and r < R keep every read inside the
    // checked lengths (32 bytes of weights per pair, two i16 of each row per pair, LANES
    // scales per block); the caller's features.
    let mut acc = [unsafe { L::zero() }; R];
    for b in 0..blocks {
        let mut block = [unsafe { L::zero_int() }; R];
        for j in 0..PAIRS {
            unsafe {
                let weights = L::widen_pairs(values.add((b * PAIRS + j) * 2 * LANES));
                for (r, block) in block.iter_mut().enumerate() {
                    let pair = inputs.add(r * width + b * BLOCK + 2 * j).cast::<i32>().read_unaligned();
                    *block = L::dot_pairs(*block, pair, weights);
                }
            }
        }
        unsafe {
            let scales = L::load(panel.scales.as_ptr().add(b * LANES));
            for (r, (acc, block)) in acc.iter_mut().zip(&block).enumerate() {
                let row_scale = L::splat(x.scales[r * blocks + b]);
                *acc = L::to_float(*block).mul_add(row_scale.mul(scales), *acc);
            }
        }
    }
    // SAFETY: the caller's features.
    unsafe { store_rows(&acc, sums) };
}

/// The vector products read `R` rows of `x` and the whole panel unchecked: their lengths,
/// checked once per call.
fn check_lengths<const R: usize>(x: Rows<'_>, panel: Panel<'_>) {
    let (blocks, width) = (x.blocks, x.blocks * BLOCK);
    assert!(
        x.values.len() >= R * width
            && x.scales.len() >= R * blocks
            && panel.values.len() >= blocks * BLOCK * LANES
            && panel.scales.len() >= blocks * LANES,
        "product: {R} rows of {blocks} blocks and a panel of {} values",
        panel.values.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{TILE_ROWS, assert_every_level_agrees};

    fn values(count: usize, seed: usize) -> Vec<f32> {
        (0..count).map(|i| ((i * seed) % 1009) as f32 / 1009.0 - 0.5).collect()
    }

    #[test]
    fn the_vector_product_gives_the_bits_of_the_portable_one() {
        // 77 inputs: two whole blocks and a padded one; 20 outputs: a padded second panel.
        let (inputs, outputs) = (77, 20);
        let weights = Int8Panels::new(&values(inputs * outputs, 104_729), inputs, outputs);
        let x = QuantizedRows::new(&values(TILE_ROWS * inputs, 7919), inputs, weights.blocks, 2);
        for p in 0..2 {
            let panel = weights.panel(p);
            fn both<const R: usize>(x: Rows<'_>, panel: Panel<'_>) {
                assert_every_level_agrees(&format!("{R} rows"), |level, sums| product_at::<R>(level, x, panel, sums));
            }
            both::<1>(x.rows(0, 1), panel);
            both::<4>(x.rows(2, 4), panel);
            both::<6>(x.rows(0, 6), panel);
        }
    }

    #[test]
    fn products_are_close_to_f32_and_rows_do_not_depend_on_the_batch() {
        let (inputs, outputs, rows) = (576, 100, 13);
        let weight = values(inputs * outputs, 104_729);
        let x = values(rows * inputs, 7919);
        let packed = Int8Panels::new(&weight, inputs, outputs);
        let mut batch = vec![0.0; rows * outputs];
        packed.matmul(&x, rows, &mut batch, false, 3);
        let mut alone = vec![0.0; outputs];
        packed.matmul(&x[7 * inputs..8 * inputs], 1, &mut alone, false, 1);
        assert_eq!(&batch[7 * outputs..8 * outputs], alone.as_slice());
        for (r, row) in batch.chunks_exact(outputs).enumerate() {
            let x = &x[r * inputs..][..inputs];
            for (c, y) in row.iter().enumerate() {
                let w = &weight[c * inputs..][..inputs];
                let exact: f32 = x.iter().zip(w).map(|(x, w)| x * w).sum();
                // Each weight is off by half its block's step at most (the largest magnitude
                // over 127); 16-bit activations and float sums add far less than the margin.
                let bound: f32 = x
                    .chunks(BLOCK)
                    .zip(w.chunks(BLOCK))
                    .map(|(x, w)| {
                        let step = w.iter().fold(0.0f32, |m, v| m.max(v.abs())) / WEIGHT_LEVELS;
                        x.iter().map(|v| v.abs() * step / 2.0).sum::<f32>()
                    })
                    .sum();
                assert!((y - exact).abs() <= bound + 1e-3, "row {r}, column {c}: {y} vs {exact}, bound {bound}");
            }
        }
    }

    #[test]
    fn zero_blocks_and_extreme_values_stay_finite() {
        let (inputs, outputs) = (64, 16);
        let mut weight = vec![0.0; inputs * outputs];
        weight[0] = 1e30;
        weight[inputs + 40] = -3.0;
        let packed = Int8Panels::new(&weight, inputs, outputs);
        let mut x = vec![0.0; inputs];
        x[0] = 2.0;
        x[40] = 1e-30;
        let mut out = vec![f32::NAN; outputs];
        packed.matmul(&x, 1, &mut out, false, 1);
        assert!((out[0] / 2e30 - 1.0).abs() < 1e-5, "{}", out[0]);
        assert!(out[1].abs() < 1e-28 && out[2..].iter().all(|v| *v == 0.0), "{out:?}");
    }
}
