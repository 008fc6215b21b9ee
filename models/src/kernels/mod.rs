//! Numeric kernels shared by the CPU forward passes (the BERT embedder, the llama policy).
//! Each output element is summed in an order fixed by the shapes of the weights alone, never by
//! the number of rows or threads: a row's result does not depend on how work was batched.
//!
//! Weight matrices are packed once at load, in the [`Precision`] a model asks for: F32 panels
//! (`f32_panels`), or int8 values with a scale per 32 inputs (`int8_panels`). Both are
//! multiplied tile by tile through one driver, [`tiles`], which owns the threading and the
//! order of the output writes. Its parts, and the forward pass's other parallel loops, run
//! through `parallel`'s fork-join, whose helpers spin between loops. Their vector code is
//! written once over `lanes`' sixteen lanes and compiled for AVX2 and AVX-512; `level`
//! picks one per process.

mod attention;
mod exp;
mod f32_panels;
mod int8_panels;
#[cfg(target_arch = "x86_64")]
mod lanes;
mod parallel;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use self::attention::KvCacheDtype;
pub use self::attention::{KvHead, KvValue, attend};
pub(crate) use self::exp::{exp, exp_in_place};
use self::f32_panels::F32Panels;
use self::int8_panels::Int8Panels;
use self::parallel::SharedOut;
pub(crate) use self::parallel::for_each_chunk_mut;

/// Output columns per panel of a [`PackedWeight`]: two 8-lane registers.
const LANES: usize = 16;
/// Rows per tile of the product kernels: with two accumulators per row and the two weight
/// registers, six rows fill the sixteen AVX registers.
const TILE_ROWS: usize = 6;
/// Rows whose inputs stay in cache while a thread sweeps its panels.
const ROW_BLOCK: usize = 96;
/// Panels per parallel part, at least: smaller parts cost more in scheduling than they gain.
const MIN_PANELS: usize = 8;

/// The vector code the kernels run, from the least to the most the CPU must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    /// Element by element, on any CPU.
    Portable,
    /// AVX2 with FMA and F16C (every x86 CPU with AVX2 has the other two, though a hypervisor
    /// may hide them).
    Avx2,
    /// Besides, AVX-512 (F, BW) with VNNI: the products' registers hold a whole panel of
    /// [`LANES`] columns, and one instruction multiplies and adds a pair of 16-bit inputs.
    Avx512,
}

/// The most the CPU has.
fn detected() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if !(has!("avx2") && has!("fma") && has!("f16c")) {
            return Level::Portable;
        }
        if has!("avx512f") && has!("avx512bw") && has!("avx512vnni") {
            return Level::Avx512;
        }
        Level::Avx2
    }
    #[cfg(not(target_arch = "x86_64"))]
    Level::Portable
}

/// The vector code the kernels run: the most the CPU has, unless `SESA_KERNELS` holds them
/// lower (`portable` or `avx2`), to measure one level against another or check end to end that
/// results do not depend on it. Every level gives the same bits. Decided once per process.
/// (The F16 cache's rounding and widening go through `half`, which picks F16C itself; both of
/// its paths round to nearest and widen exactly.)
fn level() -> Level {
    static LEVEL: std::sync::OnceLock<Level> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| {
        let cpu = detected();
        let asked = match std::env::var("SESA_KERNELS").unwrap_or_default().as_str() {
            "" => cpu,
            "portable" => Level::Portable,
            "avx2" => Level::Avx2,
            other => {
                tracing::warn!(
                    "SESA_KERNELS={other:?} is neither `portable` nor `avx2`: the kernels use what the CPU has"
                );
                cpu
            }
        };
        asked.min(cpu)
    })
}

/// The vector levels this CPU can run, for tests to compare each with the portable code.
#[cfg(test)]
fn vector_levels() -> Vec<Level> {
    [Level::Avx2, Level::Avx512].into_iter().filter(|level| *level <= detected()).collect()
}

/// Runs a product kernel at the portable level and at every vector level this CPU has, and
/// asserts that they give the same bits (and not only zeros).
#[cfg(test)]
fn assert_every_level_agrees(what: &str, product: impl Fn(Level, &mut Tile)) {
    let mut plain = Tile::default();
    product(Level::Portable, &mut plain);
    assert_ne!(plain[0], [0.0; LANES], "{what}");
    for level in vector_levels() {
        let mut fast = Tile::default();
        product(level, &mut fast);
        assert_eq!(fast, plain, "{level:?}, {what}");
    }
}

/// Whether the kernels run at least their AVX2 versions.
fn use_avx2() -> bool {
    level() >= Level::Avx2
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

impl std::str::FromStr for Precision {
    type Err = String;

    fn from_str(name: &str) -> Result<Precision, String> {
        from_name(name)
    }
}

/// A setting's value from its name in specs (`int8`), with the spec's message when unknown
/// (`unknown variant `x`, expected `f32` or `int8``), for command-line flags that mirror it.
fn from_name<T: serde::de::DeserializeOwned>(name: &str) -> Result<T, String> {
    serde_json::from_value(serde_json::Value::String(name.to_string())).map_err(|e| e.to_string())
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
    let shared = SharedOut::new(out);
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
    parallel::for_each_part(parts, threads, &part);
}

/// A dense layer `y = x Wᵀ + b`.
pub struct Dense {
    pub(crate) weight: PackedWeight,
    pub(crate) bias: Option<Vec<f32>>,
}

impl Dense {
    /// A layer of `weight` (`outputs × inputs` row-major, as in checkpoints) and `bias`, in
    /// `precision`.
    pub fn new(weight: &[f32], bias: Option<Vec<f32>>, inputs: usize, outputs: usize, precision: Precision) -> Dense {
        Dense { weight: PackedWeight::new(weight, inputs, outputs, precision), bias }
    }

    /// The width of the layer's input.
    pub fn inputs(&self) -> usize {
        self.weight.inputs()
    }

    /// Writes `x Wᵀ + b` for `rows` rows of `x` into `out`, on up to `threads` threads.
    pub fn forward(&self, x: &[f32], rows: usize, out: &mut [f32], threads: usize) {
        let outputs = self.weight.outputs();
        let out = &mut out[..rows * outputs];
        if let Some(bias) = &self.bias {
            out.chunks_exact_mut(outputs).for_each(|row| row.copy_from_slice(bias));
        }
        self.weight.matmul(x, rows, out, self.bias.is_some(), threads);
    }
}

/// `target += other`, element by element.
pub fn add_assign(target: &mut [f32], other: &[f32]) {
    target.iter_mut().zip(other).for_each(|(t, o)| *t += o);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_read_from_their_names_in_specs() {
        assert_eq!("int8".parse::<Precision>(), Ok(Precision::Int8));
        assert_eq!("f16".parse::<KvCacheDtype>(), Ok(KvCacheDtype::F16));
        assert_eq!("f8".parse::<KvCacheDtype>(), Err("unknown variant `f8`, expected `f32` or `f16`".to_string()));
    }

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
}
