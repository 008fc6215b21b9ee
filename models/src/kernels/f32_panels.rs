//! F32 weights in panels: every output element is one chain of fused multiply-adds.

#[cfg(target_arch = "x86_64")]
use super::lanes::{Avx2, Avx512, Lanes, store_rows};
use super::{LANES, Level, Tile, TileKernel, level, tiles};

/// A weight matrix `W [outputs, inputs]` (as checkpoints store dense layers), laid out once at
/// load for `x · Wᵀ`: panels of [`LANES`] output columns, each `inputs × LANES` with the
/// columns side by side (the last panel padded with zeros).
///
/// Packing once is the point: a general sgemm (matrixmultiply, which this replaced) repacks
/// the weights on every call, which took 27 % of decoding time when each call has a few rows.
pub(crate) struct F32Panels {
    panels: Vec<f32>,
    inputs: usize,
    outputs: usize,
}

impl F32Panels {
    /// Packs `weight`, `outputs × inputs` row-major.
    pub(super) fn new(weight: &[f32], inputs: usize, outputs: usize) -> F32Panels {
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
        F32Panels { panels, inputs, outputs }
    }

    pub(super) fn inputs(&self) -> usize {
        self.inputs
    }

    pub(super) fn outputs(&self) -> usize {
        self.outputs
    }

    /// `out (+)= x · Wᵀ`, see [`super::PackedWeight::matmul`]. Every output element is one
    /// chain of fused multiply-adds over `k = 0, 1, …, inputs-1` from zero (then added to `out`
    /// when accumulating), whatever the tile, the number of rows or threads: the result is
    /// row-invariant, and the same on every machine (fused multiply-add rounds once, in
    /// hardware or not).
    pub(super) fn matmul(&self, x: &[f32], rows: usize, out: &mut [f32], accumulate: bool, threads: usize) {
        tiles(&F32Rows { weights: self, x }, rows, self.outputs, out, accumulate, threads);
    }
}

/// The rows of one call with the weights they multiply.
struct F32Rows<'a> {
    weights: &'a F32Panels,
    x: &'a [f32],
}

impl TileKernel for F32Rows<'_> {
    fn product<const R: usize>(&self, panel: usize, row: usize, sums: &mut Tile) {
        let inputs = self.weights.inputs;
        let panel = &self.weights.panels[panel * inputs * LANES..][..inputs * LANES];
        product::<R>(&self.x[row * inputs..(row + R) * inputs], panel, sums);
    }
}

/// The product of `R` rows of `x` (each `inputs` long) with one panel, into `sums`: one fused
/// multiply-add chain per element, `k` ascending, with AVX-512 or AVX2 where the CPU has it.
#[inline(always)]
fn product<const R: usize>(x: &[f32], panel: &[f32], sums: &mut Tile) {
    product_at::<R>(level(), x, panel, sums);
}

/// [`product`] with the vector code of `level` (which the CPU must have).
#[inline(always)]
fn product_at<const R: usize>(level: Level, x: &[f32], panel: &[f32], sums: &mut Tile) {
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

/// [`product`] element by element; fused multiply-add rounds once, so this gives the very
/// bits of the vector version.
fn product_portable<const R: usize>(x: &[f32], panel: &[f32], sums: &mut Tile) {
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

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn product_avx2<const R: usize>(x: &[f32], panel: &[f32], sums: &mut Tile) {
    // SAFETY: compiled for AVX2 and FMA.
    unsafe { product_vector::<Avx2, R>(x, panel, sums) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn product_avx512<const R: usize>(x: &[f32], panel: &[f32], sums: &mut Tile) {
    // SAFETY: compiled for AVX-512 F.
    unsafe { product_vector::<Avx512, R>(x, panel, sums) }
}

/// [`product`] with a row's sums in one set of [`Lanes`]: per `k`, one load of the panel's
/// weights, and per row a broadcast and a fused multiply-add.
///
/// # Safety
/// The CPU must have `L`'s features.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn product_vector<L: Lanes, const R: usize>(x: &[f32], panel: &[f32], sums: &mut Tile) {
    let inputs = check_lengths::<R>(x, panel);
    let (x, panel) = (x.as_ptr(), panel.as_ptr());
    // SAFETY (every block below): k < inputs and r < R keep every read inside `x` (R × inputs)
    // and `panel` (inputs × LANES), as checked; the caller's features.
    let mut acc = [unsafe { L::zero() }; R];
    for k in 0..inputs {
        unsafe {
            let weights = L::load(panel.add(k * LANES));
            for (r, acc) in acc.iter_mut().enumerate() {
                *acc = L::splat(*x.add(r * inputs + k)).mul_add(weights, *acc);
            }
        }
    }
    // SAFETY: the caller's features.
    unsafe { store_rows(&acc, sums) };
}

/// The vector products read `R` rows of `x` and the panel unchecked: their lengths, checked
/// once per call. Returns the inputs per row.
fn check_lengths<const R: usize>(x: &[f32], panel: &[f32]) -> usize {
    let inputs = x.len() / R;
    assert!(
        x.len() == R * inputs && panel.len() >= inputs * LANES,
        "product: {R} rows of {inputs} and a panel of {}",
        panel.len()
    );
    inputs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{TILE_ROWS, assert_every_level_agrees};

    #[test]
    fn the_vector_product_gives_the_bits_of_the_portable_one() {
        let inputs = 77;
        let x: Vec<f32> = (0..TILE_ROWS * inputs).map(|i| ((i * 7919) % 1009) as f32 / 1009.0 - 0.5).collect();
        let panel: Vec<f32> = (0..inputs * LANES).map(|i| ((i * 104_729) % 997) as f32 / 997.0 - 0.5).collect();
        fn both<const R: usize>(x: &[f32], panel: &[f32]) {
            let x = &x[..R * (x.len() / TILE_ROWS)];
            assert_every_level_agrees(&format!("{R} rows"), |level, sums| product_at::<R>(level, x, panel, sums));
        }
        both::<1>(&x, &panel);
        both::<3>(&x, &panel);
        both::<6>(&x, &panel);
    }
}
