//! F32 weights in panels: every output element is one chain of fused multiply-adds.

#[cfg(target_arch = "x86_64")]
use super::store_tile;
use super::{LANES, Tile, TileKernel, tiles, use_avx2, use_avx512};

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
    #[cfg(target_arch = "x86_64")]
    {
        if use_avx512() {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { product_avx512::<R>(x, panel, sums) };
        }
        if use_avx2() {
            // SAFETY: as above.
            return unsafe { product_avx2::<R>(x, panel, sums) };
        }
    }
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

/// [`product`] with the `R × 2` accumulators in AVX registers: per `k`, two weight loads, `R`
/// broadcasts and `2R` fused multiply-adds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn product_avx2<const R: usize>(x: &[f32], panel: &[f32], sums: &mut Tile) {
    use std::arch::x86_64::{__m256, _mm256_broadcast_ss, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_setzero_ps};
    let inputs = check_lengths::<R>(x, panel);
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
    store_tile(&acc, sums);
}

/// [`product_avx2`] with a row's panel in one AVX-512 register: per `k`, one weight load, `R`
/// broadcasts and `R` fused multiply-adds, each lane's the same as before.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn product_avx512<const R: usize>(x: &[f32], panel: &[f32], sums: &mut Tile) {
    use std::arch::x86_64::{
        __m512, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm512_storeu_ps,
    };
    let inputs = check_lengths::<R>(x, panel);
    let (x, panel) = (x.as_ptr(), panel.as_ptr());
    let mut acc: [__m512; R] = [_mm512_setzero_ps(); R];
    for k in 0..inputs {
        // SAFETY: as in `product_avx2`.
        unsafe {
            let weights = _mm512_loadu_ps(panel.add(k * LANES));
            for (r, acc) in acc.iter_mut().enumerate() {
                *acc = _mm512_fmadd_ps(_mm512_set1_ps(*x.add(r * inputs + k)), weights, *acc);
            }
        }
    }
    for (sums, acc) in sums.iter_mut().zip(&acc) {
        // SAFETY: each row of `sums` holds LANES = 16 floats.
        unsafe { _mm512_storeu_ps(sums.as_mut_ptr(), *acc) };
    }
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
    use crate::kernels::{Level, TILE_ROWS, vector_levels};

    #[test]
    fn the_vector_product_gives_the_bits_of_the_portable_one() {
        let inputs = 77;
        let x: Vec<f32> = (0..TILE_ROWS * inputs).map(|i| ((i * 7919) % 1009) as f32 / 1009.0 - 0.5).collect();
        let panel: Vec<f32> = (0..inputs * LANES).map(|i| ((i * 104_729) % 997) as f32 / 997.0 - 0.5).collect();
        fn both<const R: usize>(x: &[f32], panel: &[f32]) {
            let x = &x[..R * (x.len() / TILE_ROWS)];
            let mut plain = Tile::default();
            product_portable::<R>(x, panel, &mut plain);
            assert_ne!(plain[0], [0.0; LANES]);
            #[cfg(target_arch = "x86_64")]
            for level in vector_levels() {
                let mut fast = Tile::default();
                // SAFETY: the CPU has the level's features.
                match level {
                    Level::Avx2 => unsafe { product_avx2::<R>(x, panel, &mut fast) },
                    Level::Avx512 => unsafe { product_avx512::<R>(x, panel, &mut fast) },
                    Level::Portable => unreachable!(),
                }
                assert_eq!(fast, plain, "{level:?}, {R} rows");
            }
        }
        both::<1>(&x, &panel);
        both::<3>(&x, &panel);
        both::<6>(&x, &panel);
    }
}
