//! A BERT sentence encoder's forward pass, written for the CPU.
//!
//! The tokens of many texts are packed into one matrix without padding: every dense layer is a
//! single matrix product over all of them, and only attention runs text by text. candle-transformers'
//! BERT pads each batch to its longest text, copies tensors between layouts for attention and
//! evaluates GELU through libm's scalar `erf`; on two cores it embedded 0.4× as many texts per
//! second as sentence-transformers (docs/benchmarks.md). The arithmetic is the same (post-norm
//! BERT, exact-erf GELU to 1e-7), so the vectors agree with candle's to rounding (tested).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use sesa_models::kernels::{Dense, KvHead, Precision, add_assign, attend};

/// The embedder keeps F32 weights: it embeds each text once (its speed hardly shows in a run),
/// and its cosine scores decide which skills a solver is shown, so they stay as the published
/// model computes them.
const EMBEDDER_PRECISION: Precision = Precision::F32;

/// The parts of a Hugging Face BERT `config.json` the forward pass needs.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct BertConfig {
    /// Width of every token vector.
    pub hidden_size: usize,
    /// Attention heads per layer.
    pub num_attention_heads: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// Layer-norm epsilon.
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f32,
    /// Activation of the feed-forward layer; only `gelu` (exact) is supported.
    #[serde(default = "default_act")]
    pub hidden_act: String,
}

fn default_eps() -> f32 {
    1e-12
}

fn default_act() -> String {
    "gelu".into()
}

struct LayerNorm {
    weight: Vec<f32>,
    bias: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    fn apply(&self, x: &mut [f32]) {
        let width = self.weight.len() as f32;
        for row in x.chunks_exact_mut(self.weight.len()) {
            let mean = row.iter().sum::<f32>() / width;
            let variance = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / width;
            let scale = 1.0 / (variance + self.eps).sqrt();
            for ((v, w), b) in row.iter_mut().zip(&self.weight).zip(&self.bias) {
                *v = (*v - mean) * scale * w + b;
            }
        }
    }
}

struct Layer {
    /// Query, key and value projections stacked into one `[3·hidden, hidden]` layer.
    qkv: Dense,
    attention_out: Dense,
    attention_norm: LayerNorm,
    intermediate: Dense,
    output: Dense,
    output_norm: LayerNorm,
}

/// A loaded BERT encoder.
pub struct BertEncoder {
    config: BertConfig,
    word: Vec<f32>,
    position: Vec<f32>,
    token_type: Vec<f32>,
    embedding_norm: LayerNorm,
    layers: Vec<Layer>,
}

/// Scratch matrices for one pass, reused between passes of a worker.
#[derive(Default)]
pub struct Scratch {
    x: Vec<f32>,
    qkv: Vec<f32>,
    context: Vec<f32>,
    sum: Vec<f32>,
    wide: Vec<f32>,
    scores: Vec<f32>,
}

/// Why a checkpoint could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum BertError {
    /// The weights file could not be read.
    #[error("{path}: {message}")]
    Read {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// A tensor is missing or has the wrong shape.
    #[error("{path}: tensor `{name}` {problem}")]
    Tensor {
        /// The file.
        path: String,
        /// The tensor (without a `bert.` prefix).
        name: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The configuration asks for something this forward pass does not implement.
    #[error("config.json: {0}")]
    Unsupported(String),
}

struct Checkpoint<'a> {
    path: &'a Path,
    tensors: HashMap<String, Tensor>,
}

impl Checkpoint<'_> {
    /// The tensor `name`, or `bert.name` as some checkpoints prefix them.
    fn tensor(&self, name: &str) -> Result<&Tensor, BertError> {
        self.tensors
            .get(name)
            .or_else(|| self.tensors.get(&format!("bert.{name}")))
            .ok_or_else(|| self.problem(name, "is missing".into()))
    }

    fn problem(&self, name: &str, problem: String) -> BertError {
        BertError::Tensor { path: self.path.display().to_string(), name: name.to_string(), problem }
    }

    fn flatten(&self, name: &str, tensor: &Tensor) -> Result<Vec<f32>, BertError> {
        tensor
            .to_dtype(candle_core::DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| self.problem(name, e.to_string()))
    }

    /// The tensor `name` of exactly `shape`, flattened.
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, BertError> {
        let tensor = self.tensor(name)?;
        if tensor.dims() != shape {
            return Err(self.problem(name, format!("has shape {:?}, expected {shape:?}", tensor.dims())));
        }
        self.flatten(name, tensor)
    }

    /// An embedding table: any number of rows of `width`, flattened.
    fn table(&self, name: &str, width: usize) -> Result<Vec<f32>, BertError> {
        let tensor = self.tensor(name)?;
        match tensor.dims() {
            [rows, w] if *w == width && *rows > 0 => self.flatten(name, tensor),
            dims => Err(self.problem(name, format!("has shape {dims:?}, expected [rows, {width}]"))),
        }
    }

    /// The weight (`outputs × inputs`) and bias of a dense layer.
    fn dense_parts(&self, prefix: &str, inputs: usize, outputs: usize) -> Result<(Vec<f32>, Vec<f32>), BertError> {
        Ok((
            self.get(&format!("{prefix}.weight"), &[outputs, inputs])?,
            self.get(&format!("{prefix}.bias"), &[outputs])?,
        ))
    }

    fn dense(&self, prefix: &str, inputs: usize, outputs: usize) -> Result<Dense, BertError> {
        let (weight, bias) = self.dense_parts(prefix, inputs, outputs)?;
        Ok(Dense::new(&weight, Some(bias), inputs, outputs, EMBEDDER_PRECISION))
    }

    fn norm(&self, prefix: &str, width: usize, eps: f32) -> Result<LayerNorm, BertError> {
        Ok(LayerNorm {
            weight: self.get(&format!("{prefix}.weight"), &[width])?,
            bias: self.get(&format!("{prefix}.bias"), &[width])?,
            eps,
        })
    }
}

impl BertEncoder {
    /// Loads the encoder from a safetensors checkpoint with Hugging Face BERT tensor names.
    pub fn load(weights: &Path, config: BertConfig) -> Result<BertEncoder, BertError> {
        if config.hidden_act != "gelu" {
            return Err(BertError::Unsupported(format!(
                "hidden_act `{}` is not supported (only `gelu`)",
                config.hidden_act
            )));
        }
        if config.num_attention_heads == 0 || !config.hidden_size.is_multiple_of(config.num_attention_heads) {
            return Err(BertError::Unsupported(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                config.hidden_size, config.num_attention_heads
            )));
        }
        let tensors = candle_core::safetensors::load(weights, &Device::Cpu)
            .map_err(|e| BertError::Read { path: weights.display().to_string(), message: e.to_string() })?;
        let checkpoint = Checkpoint { path: weights, tensors };
        let hidden = config.hidden_size;
        let eps = config.layer_norm_eps;
        let mut layers = Vec::new();
        for index in 0..config.num_hidden_layers {
            let prefix = format!("encoder.layer.{index}");
            let attention =
                |part: &str| checkpoint.dense_parts(&format!("{prefix}.attention.self.{part}"), hidden, hidden);
            let (query, key, value) = (attention("query")?, attention("key")?, attention("value")?);
            layers.push(Layer {
                qkv: Dense::new(
                    &[query.0, key.0, value.0].concat(),
                    Some([query.1, key.1, value.1].concat()),
                    hidden,
                    3 * hidden,
                    EMBEDDER_PRECISION,
                ),
                attention_out: checkpoint.dense(&format!("{prefix}.attention.output.dense"), hidden, hidden)?,
                attention_norm: checkpoint.norm(&format!("{prefix}.attention.output.LayerNorm"), hidden, eps)?,
                intermediate: checkpoint.dense(
                    &format!("{prefix}.intermediate.dense"),
                    hidden,
                    config.intermediate_size,
                )?,
                output: checkpoint.dense(&format!("{prefix}.output.dense"), config.intermediate_size, hidden)?,
                output_norm: checkpoint.norm(&format!("{prefix}.output.LayerNorm"), hidden, eps)?,
            });
        }
        Ok(BertEncoder {
            word: checkpoint.table("embeddings.word_embeddings.weight", hidden)?,
            position: checkpoint.table("embeddings.position_embeddings.weight", hidden)?,
            token_type: checkpoint.table("embeddings.token_type_embeddings.weight", hidden)?,
            embedding_norm: checkpoint.norm("embeddings.LayerNorm", hidden, eps)?,
            layers,
            config,
        })
    }

    /// Positions the model can embed: longer texts must be truncated by the caller.
    pub fn max_tokens(&self) -> usize {
        self.position.len() / self.config.hidden_size
    }

    /// The mean of each text's final token vectors, L2-normalised. `texts` are token ids
    /// (with the tokenizer's special tokens); each must hold 1..=[`Self::max_tokens`] ids known
    /// to the vocabulary. The dense layers use up to `threads` threads.
    pub fn embed(&self, texts: &[&[u32]], scratch: &mut Scratch, threads: usize) -> Vec<Vec<f32>> {
        let hidden = self.config.hidden_size;
        let vocabulary = self.word.len() / hidden;
        let mut spans = Vec::with_capacity(texts.len());
        let mut tokens = 0;
        for ids in texts {
            assert!(!ids.is_empty() && ids.len() <= self.max_tokens(), "text of {} tokens", ids.len());
            spans.push((tokens, ids.len()));
            tokens += ids.len();
        }
        let Scratch { x, qkv, context, sum, wide, scores } = scratch;
        x.clear();
        for ids in texts {
            for (position, &id) in ids.iter().enumerate() {
                let id = id as usize;
                assert!(id < vocabulary, "token id {id} outside the vocabulary of {vocabulary}");
                let word = &self.word[id * hidden..][..hidden];
                let place = &self.position[position * hidden..][..hidden];
                x.extend(word.iter().zip(place).zip(&self.token_type[..hidden]).map(|((w, p), t)| w + p + t));
            }
        }
        self.embedding_norm.apply(x);
        qkv.resize(tokens * 3 * hidden, 0.0);
        context.resize(tokens * hidden, 0.0);
        sum.resize(tokens * hidden, 0.0);
        wide.resize(tokens * self.config.intermediate_size, 0.0);
        for layer in &self.layers {
            layer.qkv.forward(x, tokens, qkv, threads);
            attention(qkv, &spans, hidden, self.config.num_attention_heads, context, scores);
            layer.attention_out.forward(context, tokens, sum, threads);
            add_assign(sum, x);
            layer.attention_norm.apply(sum);
            std::mem::swap(x, sum);
            layer.intermediate.forward(x, tokens, wide, threads);
            wide.iter_mut().for_each(|v| *v = gelu(*v));
            layer.output.forward(wide, tokens, sum, threads);
            add_assign(sum, x);
            layer.output_norm.apply(sum);
            std::mem::swap(x, sum);
        }
        spans
            .iter()
            .map(|&(start, len)| {
                let mut mean = vec![0.0f32; hidden];
                for row in x[start * hidden..(start + len) * hidden].chunks_exact(hidden) {
                    add_assign(&mut mean, row);
                }
                let norm = mean.iter().map(|v| v * v).sum::<f32>().sqrt();
                if norm > 0.0 {
                    mean.iter_mut().for_each(|v| *v /= norm);
                }
                mean
            })
            .collect()
    }
}

/// Self-attention of each text on itself (no mask: the texts are packed, not padded). `qkv`
/// holds each token's query, key and value side by side; the heads' outputs go to `context`.
fn attention(
    qkv: &[f32],
    spans: &[(usize, usize)],
    hidden: usize,
    heads: usize,
    context: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let width = hidden / heads;
    let scale = 1.0 / (width as f32).sqrt();
    let stride = 3 * hidden;
    for &(start, len) in spans {
        let keys = &qkv[start * stride..(start + len) * stride];
        for i in 0..len {
            for head in 0..heads {
                let column = head * width;
                let query = &keys[i * stride + column..][..width];
                let out = &mut context[(start + i) * hidden + column..][..width];
                let head = KvHead {
                    keys: &keys[hidden..],
                    values: &keys[2 * hidden..],
                    count: len,
                    stride,
                    offset: column,
                    width,
                };
                attend(query, head, scale, scores, out);
            }
        }
    }
}

/// GELU with the exact error function, `x · Φ(x)`.
fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// The error function as an odd rational function of degree 13/8 on [-4, 4] (outside, erf is
/// ±1 in f32). Absolute error below 1e-6 (tested against libm), and, unlike libm's `erff`,
/// free of branches and table lookups, so a loop over a matrix vectorises.
fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = -2.726_142_3e-10f32;
    for alpha in [2.770_681_4e-8, -2.101_024e-6, -5.692_506_4e-5, -7.349_906_3e-4, -2.954_6e-3, -1.609_603_3e-2] {
        p = p * x2 + alpha;
    }
    let mut q = -1.456_607_2e-5f32;
    for beta in [-2.133_740_6e-4, -1.682_827e-3, -7.373_329e-3, -1.426_474e-2] {
        q = q * x2 + beta;
    }
    x * p / q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_libm() {
        let worst =
            (-6000..=6000).map(|i| i as f32 / 1000.0).map(|x| (erf(x) - libm_erf(x)).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-6, "largest error {worst}");
    }

    fn libm_erf(x: f32) -> f32 {
        unsafe extern "C" {
            fn erf(x: f64) -> f64;
        }
        // SAFETY: the C math library's `erf` (linked by std) is a pure function.
        unsafe { erf(x as f64) as f32 }
    }
}
