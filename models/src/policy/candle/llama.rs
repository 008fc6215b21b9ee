//! A llama-family decoder's forward pass over a batch of sequences, on the CPU.
//!
//! The GGUF's quantized matrices are dequantized once at load (exactly: F32 holds every Q4_1
//! or Q8_0 value) and packed for [`PackedWeight::matmul`]; projections are F32 matrix
//! products over all rows of a batch: candle's quantized kernels compute one row at a time
//! (its Q8_0 `vec_dot` managed ~73 tokens/s here, prompt and decode alike), while a batch of
//! rows reuses each weight for every row.
//!
//! Every operation is row-local and sums in a fixed order: norms, RoPE and attention are
//! written here row by row, and the matrix kernel's sums do not depend on the number of rows. A token's
//! keys, values and logits are therefore bit-identical however the tokens before it were
//! chunked or batched with other sequences. That is what makes a KV cache reusable without
//! breaking "same seed, same trajectory", and what lets decoding put all live sequences
//! through one projection per layer.

use half::f16;

use crate::kernels::{
    Dense, KvCacheDtype, KvHead, KvValue, PackedWeight, Precision, add_assign, attend, exp_in_place, for_each_chunk_mut,
};
use crate::weights::{LlamaShape, LlamaWeights};

struct Block {
    attention_norm: Vec<f32>,
    /// Query, key and value projections stacked into one layer.
    qkv: Dense,
    attention_out: Dense,
    ffn_norm: Vec<f32>,
    /// Gate and up projections stacked into one layer.
    gate_up: Dense,
    down: Dense,
}

/// The weights of a loaded model.
pub(crate) struct LlamaModel {
    pub(crate) shape: LlamaShape,
    embedding: Vec<f32>,
    output_norm: Vec<f32>,
    /// The output projection to the vocabulary (a packed copy of the embedding when they are
    /// tied: lookups need rows, the projection needs panels).
    output: PackedWeight,
    /// How sequences' keys and values are cached.
    kv_cache_dtype: KvCacheDtype,
    /// The block whose input (the residual stream entering it) caches keep for every token
    /// fed, when a trainer asked for it ([`KvCache::block_inputs`]).
    pub(crate) keep_block_inputs: Option<usize>,
    threads: usize,
    blocks: Vec<Block>,
    /// cos and sin of every position's rotation angles, `context × head_dim/2`.
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// The keys and values of the tokens a sequence has been fed, per layer
/// (`len × kv_heads × head_dim`, after RoPE), in the model's [`KvCacheDtype`].
#[derive(Clone, Debug, Default)]
pub(crate) struct KvCache {
    len: usize,
    layers: Vec<KvLayer>,
    /// The residual stream entering block [`LlamaModel::keep_block_inputs`] at each token,
    /// `len × block_input_width`; kept only by caches begun after it was asked for (width 0:
    /// none kept).
    block_inputs: Vec<f32>,
    block_input_width: usize,
}

/// One layer's cached keys and values, in the model's [`KvCacheDtype`].
#[derive(Clone, Debug)]
enum KvLayer {
    F32(KvLayerOf<f32>),
    F16(KvLayerOf<f16>),
}

/// Tokens a cache copied as a prefix has room for before it grows: a turn's new tokens (a
/// search's results and the next thought) in most agent loops. A prefix is taken to be
/// continued, and one copied to its exact length would be copied again (and its pages faulted
/// in again) at the first token appended.
const PREFIX_ROOM: usize = 512;

/// The first `tokens` of `all` (`per_token` numbers each), with room for [`PREFIX_ROOM`] more.
fn prefix_copy<T: Copy>(all: &[T], tokens: usize, per_token: usize) -> Vec<T> {
    let mut copy = Vec::with_capacity((tokens + PREFIX_ROOM) * per_token);
    copy.extend_from_slice(&all[..tokens * per_token]);
    copy
}

/// One layer's cached keys and values as `T`.
#[derive(Clone, Debug, Default)]
struct KvLayerOf<T> {
    keys: Vec<T>,
    values: Vec<T>,
}

impl<T: KvValue> KvLayerOf<T> {
    /// Appends one token's keys and values (rounded to `T`).
    fn push(&mut self, keys: &[f32], values: &[f32]) {
        T::store(keys, &mut self.keys);
        T::store(values, &mut self.values);
    }

    /// The first `tokens` of `cached`, with room to grow.
    fn prefix(&self, tokens: usize, cached: usize) -> KvLayerOf<T> {
        let per_token = self.keys.len().checked_div(cached).unwrap_or(0);
        KvLayerOf {
            keys: prefix_copy(&self.keys, tokens, per_token),
            values: prefix_copy(&self.values, tokens, per_token),
        }
    }

    /// Key-value head `kv_head` over the first `count` tokens.
    fn head(&self, kv_head: usize, count: usize, kv_width: usize, head_dim: usize) -> KvHead<'_, T> {
        KvHead {
            keys: &self.keys,
            values: &self.values,
            count,
            stride: kv_width,
            offset: kv_head * head_dim,
            width: head_dim,
        }
    }
}

impl KvLayer {
    fn new(dtype: KvCacheDtype) -> KvLayer {
        match dtype {
            KvCacheDtype::F32 => KvLayer::F32(KvLayerOf::default()),
            KvCacheDtype::F16 => KvLayer::F16(KvLayerOf::default()),
        }
    }

    fn push(&mut self, keys: &[f32], values: &[f32]) {
        match self {
            KvLayer::F32(layer) => layer.push(keys, values),
            KvLayer::F16(layer) => layer.push(keys, values),
        }
    }

    fn prefix(&self, tokens: usize, cached: usize) -> KvLayer {
        match self {
            KvLayer::F32(layer) => KvLayer::F32(layer.prefix(tokens, cached)),
            KvLayer::F16(layer) => KvLayer::F16(layer.prefix(tokens, cached)),
        }
    }
}

impl KvCache {
    /// Tokens cached.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// A copy holding only the first `len` tokens: by row-locality, exactly the cache of
    /// that prefix.
    pub(crate) fn prefix(&self, len: usize) -> KvCache {
        let len = len.min(self.len);
        let (block_inputs, block_input_width) = match self.block_inputs() {
            Some(all) => (prefix_copy(all, len, self.block_input_width), self.block_input_width),
            None => (Vec::new(), 0),
        };
        KvCache {
            len,
            layers: self.layers.iter().map(|layer| layer.prefix(len, self.len)).collect(),
            block_inputs,
            block_input_width,
        }
    }

    /// The kept block inputs of every cached token (`len × hidden`), when it keeps them.
    pub(crate) fn block_inputs(&self) -> Option<&[f32]> {
        let complete = self.block_input_width > 0 && self.block_inputs.len() == self.len * self.block_input_width;
        complete.then_some(&self.block_inputs[..])
    }
}

/// New tokens for one sequence.
pub(crate) struct Chunk<'a> {
    pub(crate) cache: &'a mut KvCache,
    pub(crate) tokens: &'a [u32],
}

/// Why the model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct ModelError(pub(crate) String);

impl From<candle_core::Error> for ModelError {
    fn from(e: candle_core::Error) -> Self {
        ModelError(e.to_string())
    }
}

impl LlamaModel {
    /// Packs `weights` in `precision` for the forward pass (query, key and value stacked into
    /// one projection, gate and up into another), to cache keys and values as `kv_cache_dtype`.
    pub(crate) fn new(weights: &LlamaWeights, precision: Precision, kv_cache_dtype: KvCacheDtype) -> LlamaModel {
        let shape = weights.shape.clone();
        let (hidden, ffn, kv_width) = (shape.hidden, shape.ffn, shape.kv_width());
        let blocks = weights
            .blocks
            .iter()
            .map(|b| Block {
                attention_norm: b.attention_norm.clone(),
                qkv: Dense::new(
                    &[&b.query[..], &b.key, &b.value].concat(),
                    None,
                    hidden,
                    hidden + 2 * kv_width,
                    precision,
                ),
                attention_out: Dense::new(&b.attention_out, None, hidden, hidden, precision),
                ffn_norm: b.ffn_norm.clone(),
                gate_up: Dense::new(&[&b.gate[..], &b.up].concat(), None, hidden, 2 * ffn, precision),
                down: Dense::new(&b.down, None, ffn, hidden, precision),
            })
            .collect();
        // Tied embeddings (no output matrix): the same matrix projects back to the vocabulary.
        let output = PackedWeight::new(weights.output_matrix(), hidden, shape.vocabulary, precision);
        let (cos, sin) = shape.rope_tables();
        LlamaModel {
            output_norm: weights.output_norm.clone(),
            embedding: weights.embedding.clone(),
            output,
            kv_cache_dtype,
            keep_block_inputs: None,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            blocks,
            cos,
            sin,
            shape,
        }
    }

    /// The threads its parallel loops run on.
    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    /// The vocabulary size.
    pub(crate) fn vocabulary(&self) -> usize {
        self.embedding.len() / self.shape.hidden
    }

    /// Feeds each chunk's tokens after its cache, appends them to the cache, and returns the
    /// logits that follow each chunk's last token.
    pub(crate) fn forward(&self, chunks: &mut [Chunk<'_>]) -> Result<Vec<Vec<f32>>, ModelError> {
        let LlamaShape { hidden, heads, kv_heads, head_dim, layers, context, eps, .. } = self.shape;
        let vocabulary = self.vocabulary();
        // Row r of the batch: its chunk and its position.
        let mut rows: Vec<(usize, usize)> = Vec::new();
        for (c, chunk) in chunks.iter_mut().enumerate() {
            if chunk.tokens.is_empty() {
                return Err(ModelError("a chunk with no tokens".into()));
            }
            if chunk.cache.len + chunk.tokens.len() > context {
                return Err(ModelError(format!(
                    "context of {} tokens exceeds the model's {context}",
                    chunk.cache.len + chunk.tokens.len()
                )));
            }
            if chunk.cache.layers.is_empty() {
                chunk.cache.layers = vec![KvLayer::new(self.kv_cache_dtype); layers];
            }
            rows.extend((0..chunk.tokens.len()).map(|i| (c, chunk.cache.len + i)));
        }
        let n = rows.len();
        let mut x = Vec::with_capacity(n * hidden);
        for chunk in chunks.iter() {
            for &id in chunk.tokens {
                if id as usize >= vocabulary {
                    return Err(ModelError(format!("token id {id} outside the vocabulary of {vocabulary}")));
                }
                x.extend_from_slice(&self.embedding[id as usize * hidden..][..hidden]);
            }
        }
        let kv_width = kv_heads * head_dim;
        // Buffers for every layer, allocated once per call: a long prompt's would otherwise be
        // mapped, zeroed by the kernel and unmapped at every layer.
        let mut normed = vec![0.0f32; n * hidden];
        let mut attended = vec![0.0f32; n * hidden];
        let mut residual = vec![0.0f32; n * hidden];
        let (mut qkv, mut gate_up, mut activated) = (Vec::new(), Vec::new(), Vec::new());
        let threads = self.threads;
        let qkv_width = hidden + 2 * kv_width;
        for (l, block) in self.blocks.iter().enumerate() {
            if self.keep_block_inputs == Some(l) {
                let mut start = 0;
                for chunk in chunks.iter_mut() {
                    let rows = chunk.tokens.len() * hidden;
                    let cache = &mut *chunk.cache;
                    if cache.len == 0 {
                        cache.block_input_width = hidden;
                    }
                    if cache.block_input_width == hidden {
                        cache.block_inputs.extend_from_slice(&x[start..start + rows]);
                    }
                    start += rows;
                }
            }
            rms_norm(&x, &block.attention_norm, eps, &mut normed);
            qkv.resize(n * qkv_width, 0.0);
            block.qkv.forward(&normed, n, &mut qkv, threads);
            self.rotate(&mut qkv, &rows, 0, heads, qkv_width);
            self.rotate(&mut qkv, &rows, hidden, kv_heads, qkv_width);
            let mut start = 0;
            for chunk in chunks.iter_mut() {
                let layer = &mut chunk.cache.layers[l];
                for row in qkv[start * qkv_width..].chunks_exact(qkv_width).take(chunk.tokens.len()) {
                    layer.push(&row[hidden..hidden + kv_width], &row[hidden + kv_width..]);
                }
                start += chunk.tokens.len();
            }
            let caches: Vec<&KvLayer> = chunks.iter().map(|c| &c.cache.layers[l]).collect();
            let group = heads / kv_heads;
            let scale = 1.0 / (head_dim as f32).sqrt();
            for_each_chunk_mut(&mut attended, hidden, threads, |r, out| {
                let scores = &mut Vec::new();
                let (c, position) = rows[r];
                let queries = &qkv[r * qkv_width..][..hidden];
                for (kv_head, (queries, out)) in
                    queries.chunks_exact(group * head_dim).zip(out.chunks_exact_mut(group * head_dim)).enumerate()
                {
                    let count = position + 1;
                    match caches[c] {
                        KvLayer::F32(layer) => {
                            attend(queries, layer.head(kv_head, count, kv_width, head_dim), scale, scores, out)
                        }
                        KvLayer::F16(layer) => {
                            attend(queries, layer.head(kv_head, count, kv_width, head_dim), scale, scores, out)
                        }
                    }
                }
            });
            block.attention_out.forward(&attended, n, &mut residual, threads);
            add_assign(&mut x, &residual);
            rms_norm(&x, &block.ffn_norm, eps, &mut normed);
            let ffn = block.down.inputs();
            gate_up.resize(n * 2 * ffn, 0.0);
            block.gate_up.forward(&normed, n, &mut gate_up, threads);
            activated.resize(n * ffn, 0.0);
            // SiLU(gate) · up, rows in parallel (one exp per element, a row's at once).
            for_each_chunk_mut(&mut activated, ffn, threads, |r, out| {
                let (gate, up) = gate_up[r * 2 * ffn..][..2 * ffn].split_at(ffn);
                out.iter_mut().zip(gate).for_each(|(o, g)| *o = -g);
                exp_in_place(out);
                for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
                    *o = g / (1.0 + *o) * u;
                }
            });
            block.down.forward(&activated, n, &mut residual, threads);
            add_assign(&mut x, &residual);
        }
        let mut last = Vec::with_capacity(chunks.len() * hidden);
        let mut end = 0;
        for chunk in chunks.iter_mut() {
            chunk.cache.len += chunk.tokens.len();
            end += chunk.tokens.len();
            last.extend_from_slice(&x[(end - 1) * hidden..end * hidden]);
        }
        let mut logits = vec![0.0f32; chunks.len() * vocabulary];
        let mut normed = vec![0.0f32; last.len()];
        rms_norm(&last, &self.output_norm, eps, &mut normed);
        self.output.matmul(&normed, chunks.len(), &mut logits, false, self.threads);
        Ok(logits.chunks_exact(vocabulary).map(<[f32]>::to_vec).collect())
    }

    /// Rotates the pairs `(2i, 2i+1)` of `heads` heads starting at column `offset` of each
    /// `width`-wide row by the row's position (GGUF's interleaved RoPE).
    fn rotate(&self, x: &mut [f32], rows: &[(usize, usize)], offset: usize, heads: usize, width: usize) {
        let head_dim = self.shape.head_dim;
        let half = head_dim / 2;
        for (row, &(_, position)) in x.chunks_exact_mut(width).zip(rows) {
            let (cos, sin) = (&self.cos[position * half..][..half], &self.sin[position * half..][..half]);
            for head in row[offset..offset + heads * head_dim].chunks_exact_mut(head_dim) {
                for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                    let (a, b) = (pair[0], pair[1]);
                    pair[0] = a * cos[i] - b * sin[i];
                    pair[1] = a * sin[i] + b * cos[i];
                }
            }
        }
    }
}

/// Each row of `x` scaled to unit root mean square, times `weight`, into `out`.
fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    for (row, out) in x.chunks_exact(weight.len()).zip(out.chunks_exact_mut(weight.len())) {
        let mean_square = row.iter().map(|v| v * v).sum::<f32>() / weight.len() as f32;
        let scale = 1.0 / (mean_square + eps).sqrt();
        out.iter_mut().zip(row.iter().zip(weight)).for_each(|(o, (v, w))| *o = v * scale * w);
    }
}
