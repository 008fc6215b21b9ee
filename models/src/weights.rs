//! The weights of a llama-family decoder as plain F32 matrices: what the serving forward pass
//! packs and what the trainer updates.
//!
//! One layout inside sesa, the GGUF's: query and key rows are permuted so that RoPE rotates
//! adjacent pairs `(2i, 2i+1)` ("interleaved" RoPE), as llama.cpp's converter writes them.
//! Hugging Face checkpoints rotate halves `(i, i + d/2)` instead, so their query and key rows
//! are permuted on the way in and back on the way out ([`LlamaWeights::load_safetensors`],
//! [`LlamaWeights::save_hf`]); the two layouts compute the same function.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, Tensor};

/// Why weights could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct WeightsError(pub String);

impl From<candle_core::Error> for WeightsError {
    fn from(e: candle_core::Error) -> Self {
        WeightsError(e.to_string())
    }
}

/// The shapes of a llama-family model.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaShape {
    /// Width of the residual stream.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key and value heads (grouped-query attention).
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Blocks.
    pub layers: usize,
    /// Width of the feed-forward layer.
    pub ffn: usize,
    /// Tokens in the vocabulary.
    pub vocabulary: usize,
    /// Positions the model was trained for.
    pub context: usize,
    /// RMSNorm's epsilon.
    pub eps: f32,
    /// RoPE's base frequency.
    pub rope_base: f32,
}

impl LlamaShape {
    /// Checks that the attention shape is one the forward passes support.
    fn check(&self) -> Result<(), WeightsError> {
        let LlamaShape { hidden, heads, kv_heads, head_dim, .. } = *self;
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 || head_dim % 2 != 0 || heads * head_dim != hidden {
            return Err(WeightsError(format!(
                "unsupported attention shape: {heads} heads, {kv_heads} key/value heads, hidden width {hidden}"
            )));
        }
        Ok(())
    }

    /// Columns of the key (and of the value) projection.
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// cos and sin of every position's rotation angles, `context × head_dim/2` each.
    pub fn rope_tables(&self) -> (Vec<f32>, Vec<f32>) {
        let half = self.head_dim / 2;
        let (mut cos, mut sin) = (Vec::with_capacity(self.context * half), Vec::with_capacity(self.context * half));
        for position in 0..self.context {
            for i in 0..half {
                let angle = position as f32 / self.rope_base.powf((2 * i) as f32 / self.head_dim as f32);
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        (cos, sin)
    }
}

/// One block's weights; matrices are `outputs × inputs`, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockWeights {
    /// RMSNorm before attention.
    pub attention_norm: Vec<f32>,
    /// Query projection (`hidden × hidden`, rows in interleaved-RoPE order).
    pub query: Vec<f32>,
    /// Key projection (`kv_width × hidden`, rows in interleaved-RoPE order).
    pub key: Vec<f32>,
    /// Value projection (`kv_width × hidden`).
    pub value: Vec<f32>,
    /// Attention output projection (`hidden × hidden`).
    pub attention_out: Vec<f32>,
    /// RMSNorm before the feed-forward layer.
    pub ffn_norm: Vec<f32>,
    /// SwiGLU gate (`ffn × hidden`).
    pub gate: Vec<f32>,
    /// SwiGLU up projection (`ffn × hidden`).
    pub up: Vec<f32>,
    /// Down projection (`hidden × ffn`).
    pub down: Vec<f32>,
}

/// A block's tensors in [`BlockWeights::tensors`] order: (sesa's name, the GGUF's, Hugging
/// Face's).
pub const BLOCK_TENSORS: [(&str, &str, &str); 9] = [
    ("attention norm", "attn_norm", "input_layernorm"),
    ("query", "attn_q", "self_attn.q_proj"),
    ("key", "attn_k", "self_attn.k_proj"),
    ("value", "attn_v", "self_attn.v_proj"),
    ("attention output", "attn_output", "self_attn.o_proj"),
    ("ffn norm", "ffn_norm", "post_attention_layernorm"),
    ("gate", "ffn_gate", "mlp.gate_proj"),
    ("up", "ffn_up", "mlp.up_proj"),
    ("down", "ffn_down", "mlp.down_proj"),
];

impl BlockWeights {
    /// A block whose tensor `i` (in [`BLOCK_TENSORS`] order) is `tensor(i)`.
    pub fn try_from_fn<E>(mut tensor: impl FnMut(usize) -> Result<Vec<f32>, E>) -> Result<BlockWeights, E> {
        Ok(BlockWeights {
            attention_norm: tensor(0)?,
            query: tensor(1)?,
            key: tensor(2)?,
            value: tensor(3)?,
            attention_out: tensor(4)?,
            ffn_norm: tensor(5)?,
            gate: tensor(6)?,
            up: tensor(7)?,
            down: tensor(8)?,
        })
    }

    /// The tensors, in [`BLOCK_TENSORS`] order.
    pub fn tensors(&self) -> [&Vec<f32>; 9] {
        [
            &self.attention_norm,
            &self.query,
            &self.key,
            &self.value,
            &self.attention_out,
            &self.ffn_norm,
            &self.gate,
            &self.up,
            &self.down,
        ]
    }

    /// The tensors, mutable, in [`BLOCK_TENSORS`] order.
    pub fn tensors_mut(&mut self) -> [&mut Vec<f32>; 9] {
        [
            &mut self.attention_norm,
            &mut self.query,
            &mut self.key,
            &mut self.value,
            &mut self.attention_out,
            &mut self.ffn_norm,
            &mut self.gate,
            &mut self.up,
            &mut self.down,
        ]
    }
}

impl LlamaShape {
    /// (rows, columns) of each block tensor in [`BLOCK_TENSORS`] order (norms are one row).
    pub fn block_dims(&self) -> [(usize, usize); 9] {
        let (h, kv, f) = (self.hidden, self.kv_width(), self.ffn);
        [(1, h), (h, h), (kv, h), (kv, h), (h, h), (1, h), (f, h), (f, h), (h, f)]
    }
}

/// All weights of a model.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaWeights {
    /// The shapes.
    pub shape: LlamaShape,
    /// Token embeddings (`vocabulary × hidden`).
    pub embedding: Vec<f32>,
    /// The blocks, first to last.
    pub blocks: Vec<BlockWeights>,
    /// RMSNorm before the output projection.
    pub output_norm: Vec<f32>,
    /// The output projection (`vocabulary × hidden`), `None` when tied to the embedding.
    pub output: Option<Vec<f32>>,
}

fn metadata<'a>(content: &'a gguf_file::Content, key: &str) -> Result<&'a gguf_file::Value, WeightsError> {
    content.metadata.get(key).ok_or_else(|| WeightsError(format!("GGUF metadata `{key}` is missing")))
}

impl LlamaWeights {
    /// Reads a llama-architecture GGUF whose header is `content`, dequantizing every matrix to
    /// F32 (exact for Q4_1 and Q8_0).
    pub fn from_gguf(content: &gguf_file::Content, file: &mut File) -> Result<LlamaWeights, WeightsError> {
        let architecture = metadata(content, "general.architecture")?.to_string()?.clone();
        if architecture != "llama" {
            return Err(WeightsError(format!("architecture `{architecture}` is not supported (only llama)")));
        }
        let number = |key: &str| -> Result<usize, WeightsError> { Ok(metadata(content, key)?.to_u32()? as usize) };
        let hidden = number("llama.embedding_length")?;
        let heads = number("llama.attention.head_count")?.max(1);
        let mut tensor = |name: &str| -> Result<Vec<f32>, WeightsError> {
            let t = content.tensor(file, name, &Device::Cpu)?;
            Ok(t.dequantize(&Device::Cpu)?.flatten_all()?.to_vec1::<f32>()?)
        };
        let embedding = tensor("token_embd.weight")?;
        let shape = LlamaShape {
            hidden,
            heads,
            kv_heads: number("llama.attention.head_count_kv")?,
            head_dim: hidden / heads,
            layers: number("llama.block_count")?,
            ffn: number("llama.feed_forward_length")?,
            vocabulary: embedding.len() / hidden.max(1),
            context: number("llama.context_length")?,
            eps: metadata(content, "llama.attention.layer_norm_rms_epsilon")?.to_f32()?,
            rope_base: content.metadata.get("llama.rope.freq_base").and_then(|v| v.to_f32().ok()).unwrap_or(10_000.0),
        };
        shape.check()?;
        let blocks = (0..shape.layers)
            .map(|i| BlockWeights::try_from_fn(|t| tensor(&format!("blk.{i}.{}.weight", BLOCK_TENSORS[t].1))))
            .collect::<Result<Vec<_>, WeightsError>>()?;
        let weights = LlamaWeights {
            output_norm: tensor("output_norm.weight")?,
            output: tensor("output.weight").ok(),
            embedding,
            blocks,
            shape,
        };
        weights.check_sizes()?;
        Ok(weights)
    }

    /// Every matrix and vector with its expected length: a file whose tensors disagree with its
    /// own metadata is refused at load, not at the first forward pass.
    fn check_sizes(&self) -> Result<(), WeightsError> {
        let LlamaShape { hidden, vocabulary, .. } = self.shape;
        let mut expected: Vec<(String, usize, usize)> = vec![
            ("embedding".into(), self.embedding.len(), vocabulary * hidden),
            ("output norm".into(), self.output_norm.len(), hidden),
        ];
        if let Some(output) = &self.output {
            expected.push(("output".into(), output.len(), vocabulary * hidden));
        }
        let dims = self.shape.block_dims();
        for (i, b) in self.blocks.iter().enumerate() {
            for (t, tensor) in b.tensors().into_iter().enumerate() {
                expected.push((format!("block {i} {}", BLOCK_TENSORS[t].0), tensor.len(), dims[t].0 * dims[t].1));
            }
        }
        match expected.into_iter().find(|(_, len, want)| len != want) {
            Some((name, len, want)) => Err(WeightsError(format!("{name}: {len} values, expected {want}"))),
            None => Ok(()),
        }
    }

    /// Reads a Hugging Face llama directory's `config.json` and `model.safetensors` (any float
    /// type; query and key rows are permuted to sesa's layout).
    pub fn load_hf(dir: &Path) -> Result<LlamaWeights, WeightsError> {
        let config_path = dir.join("config.json");
        let text = std::fs::read_to_string(&config_path)
            .map_err(|e| WeightsError(format!("{}: {e}", config_path.display())))?;
        let config: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| WeightsError(format!("{}: {e}", config_path.display())))?;
        let number = |key: &str| -> Result<usize, WeightsError> {
            config[key]
                .as_u64()
                .map(|v| v as usize)
                .ok_or_else(|| WeightsError(format!("{}: `{key}` is missing or not a number", config_path.display())))
        };
        let hidden = number("hidden_size")?;
        let heads = number("num_attention_heads")?.max(1);
        let shape = LlamaShape {
            hidden,
            heads,
            kv_heads: number("num_key_value_heads").unwrap_or(heads),
            head_dim: hidden / heads,
            layers: number("num_hidden_layers")?,
            ffn: number("intermediate_size")?,
            vocabulary: number("vocab_size")?,
            context: number("max_position_embeddings")?,
            eps: config["rms_norm_eps"].as_f64().unwrap_or(1e-5) as f32,
            rope_base: rope_theta(&config).unwrap_or(10_000.0) as f32,
        };
        shape.check()?;
        let path = dir.join("model.safetensors");
        let mut tensors = candle_core::safetensors::load(&path, &Device::Cpu)
            .map_err(|e| WeightsError(format!("{}: {e}", path.display())))?;
        let mut take = |name: &str| -> Result<Vec<f32>, WeightsError> {
            let tensor = tensors
                .remove(name)
                .ok_or_else(|| WeightsError(format!("{}: tensor `{name}` is missing", path.display())))?;
            Ok(tensor.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
        };
        let (head_dim, kv_heads) = (shape.head_dim, shape.kv_heads);
        let blocks = (0..shape.layers)
            .map(|i| {
                let mut block =
                    BlockWeights::try_from_fn(|t| take(&format!("model.layers.{i}.{}.weight", BLOCK_TENSORS[t].2)))?;
                block.query = rows_to_interleaved(&block.query, heads, head_dim);
                block.key = rows_to_interleaved(&block.key, kv_heads, head_dim);
                Ok(block)
            })
            .collect::<Result<Vec<_>, WeightsError>>()?;
        let weights = LlamaWeights {
            embedding: take("model.embed_tokens.weight")?,
            output_norm: take("model.norm.weight")?,
            output: take("lm_head.weight").ok(),
            blocks,
            shape,
        };
        weights.check_sizes()?;
        Ok(weights)
    }

    /// Writes `config.json` and `model.safetensors` (F32) in the Hugging Face llama layout into
    /// `dir`, which must exist.
    pub fn save_hf(&self, dir: &Path, bos: Option<u32>, eos: Option<u32>) -> Result<(), WeightsError> {
        let s = &self.shape;
        let config = serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": s.hidden,
            "intermediate_size": s.ffn,
            "num_attention_heads": s.heads,
            "num_key_value_heads": s.kv_heads,
            "head_dim": s.head_dim,
            "num_hidden_layers": s.layers,
            "vocab_size": s.vocabulary,
            "max_position_embeddings": s.context,
            "rms_norm_eps": s.eps,
            "rope_theta": s.rope_base,
            "hidden_act": "silu",
            "tie_word_embeddings": self.output.is_none(),
            "bos_token_id": bos,
            "eos_token_id": eos,
            "torch_dtype": "float32",
        });
        let config_path = dir.join("config.json");
        std::fs::write(&config_path, serde_json::to_string_pretty(&config).expect("JSON of plain values"))
            .map_err(|e| WeightsError(format!("{}: {e}", config_path.display())))?;
        let tensors = self.hf_tensors()?;
        let path = dir.join("model.safetensors");
        candle_core::safetensors::save(&tensors, &path).map_err(|e| WeightsError(format!("{}: {e}", path.display())))
    }

    fn hf_tensors(&self) -> Result<HashMap<String, Tensor>, WeightsError> {
        let s = &self.shape;
        let mut tensors = HashMap::new();
        let mut put = |name: String, values: Vec<f32>, dims: &[usize]| -> Result<(), WeightsError> {
            tensors.insert(name, Tensor::from_vec(values, dims, &Device::Cpu)?);
            Ok(())
        };
        let hidden = s.hidden;
        put("model.embed_tokens.weight".into(), self.embedding.clone(), &[s.vocabulary, hidden])?;
        put("model.norm.weight".into(), self.output_norm.clone(), &[hidden])?;
        if let Some(output) = &self.output {
            put("lm_head.weight".into(), output.clone(), &[s.vocabulary, hidden])?;
        }
        let dims = s.block_dims();
        for (i, b) in self.blocks.iter().enumerate() {
            for (t, tensor) in b.tensors().into_iter().enumerate() {
                let values = match t {
                    1 => rows_to_halves(tensor, s.heads, s.head_dim),
                    2 => rows_to_halves(tensor, s.kv_heads, s.head_dim),
                    _ => tensor.clone(),
                };
                let (rows, cols) = dims[t];
                let dims: &[usize] = if rows == 1 { &[cols] } else { &[rows, cols] };
                put(format!("model.layers.{i}.{}.weight", BLOCK_TENSORS[t].2), values, dims)?;
            }
        }
        Ok(tensors)
    }

    /// The output projection (the embedding when tied).
    pub fn output_matrix(&self) -> &[f32] {
        self.output.as_deref().unwrap_or(&self.embedding)
    }
}

/// A Hugging Face config's RoPE base: `rope_theta`, or where transformers 5 writes it,
/// `rope_parameters.rope_theta`.
pub fn rope_theta(config: &serde_json::Value) -> Option<f64> {
    config["rope_theta"].as_f64().or_else(|| config["rope_parameters"]["rope_theta"].as_f64())
}

/// Rows of `heads` heads from the half-rotation layout (`j·d/2 + i`) to the interleaved one
/// (`2i + j`).
fn rows_to_interleaved(matrix: &[f32], heads: usize, head_dim: usize) -> Vec<f32> {
    permute_rows(matrix, heads, head_dim, |row| {
        let (j, i) = (row / (head_dim / 2), row % (head_dim / 2));
        2 * i + j
    })
}

/// The inverse of [`rows_to_interleaved`].
fn rows_to_halves(matrix: &[f32], heads: usize, head_dim: usize) -> Vec<f32> {
    permute_rows(matrix, heads, head_dim, |row| (row % 2) * (head_dim / 2) + row / 2)
}

/// Row `r` of each head moves to row `target(r)` of that head.
fn permute_rows(matrix: &[f32], heads: usize, head_dim: usize, target: impl Fn(usize) -> usize) -> Vec<f32> {
    let width = matrix.len() / (heads * head_dim).max(1);
    let mut out = vec![0.0; matrix.len()];
    for head in 0..heads {
        for row in 0..head_dim {
            let from = (head * head_dim + row) * width;
            let to = (head * head_dim + target(row)) * width;
            out[to..to + width].copy_from_slice(&matrix[from..from + width]);
        }
    }
    out
}

#[cfg(any(test, feature = "testing"))]
pub mod testing {
    //! Tiny random models for tests.
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::{BlockWeights, LlamaShape, LlamaWeights};

    /// A random model of the given shape: matrices uniform in ±`scale`, norms near 1.
    pub fn random(shape: LlamaShape, tied: bool, seed: u64) -> LlamaWeights {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut matrix =
            |len: usize, scale: f32| -> Vec<f32> { (0..len).map(|_| rng.random_range(-scale..scale)).collect() };
        let (h, v) = (shape.hidden, shape.vocabulary);
        let dims = shape.block_dims();
        let blocks = (0..shape.layers)
            .map(|_| {
                BlockWeights::try_from_fn::<()>(|t| {
                    let (rows, cols) = dims[t];
                    // Norms near 1, matrices small.
                    Ok(if rows == 1 {
                        matrix(cols, 0.2).into_iter().map(|x| 1.0 + x).collect()
                    } else {
                        matrix(rows * cols, 0.4)
                    })
                })
                .expect("infallible")
            })
            .collect();
        LlamaWeights {
            embedding: matrix(v * h, 1.0),
            output_norm: matrix(h, 0.2).into_iter().map(|x| 1.0 + x).collect(),
            output: (!tied).then(|| matrix(v * h, 0.3)),
            blocks,
            shape,
        }
    }

    /// A two-block model: 8-wide, 2 query heads sharing 1 key/value head, 12-wide SwiGLU, a
    /// 16-token vocabulary.
    pub fn tiny_shape() -> LlamaShape {
        LlamaShape {
            hidden: 8,
            heads: 2,
            kv_heads: 1,
            head_dim: 4,
            layers: 2,
            ffn: 12,
            vocabulary: 16,
            context: 64,
            eps: 1e-5,
            rope_base: 10_000.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hugging_face_rows_round_trip() {
        let matrix: Vec<f32> = (0..2 * 8 * 3).map(|v| v as f32).collect();
        let interleaved = rows_to_interleaved(&matrix, 2, 8);
        assert_ne!(interleaved, matrix);
        // Row 1 of a head (second of the first half) becomes row 2 (pair 1, first element).
        assert_eq!(&interleaved[2 * 3..3 * 3], &matrix[3..2 * 3]);
        assert_eq!(rows_to_halves(&interleaved, 2, 8), matrix);
    }

    #[test]
    fn weights_survive_the_hugging_face_layout() {
        // Not the default base, so that a base read from the wrong key shows.
        let shape = LlamaShape { rope_base: 100_000.0, ..testing::tiny_shape() };
        let weights = testing::random(shape, true, 3);
        let dir = tempfile::tempdir().unwrap();
        weights.save_hf(dir.path(), Some(1), Some(2)).unwrap();
        assert_eq!(LlamaWeights::load_hf(dir.path()).unwrap(), weights);
        // transformers 5 writes the RoPE base inside `rope_parameters`.
        let path = dir.path().join("config.json");
        let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let theta = config.as_object_mut().unwrap().remove("rope_theta").unwrap();
        config["rope_parameters"] = serde_json::json!({"rope_theta": theta, "rope_type": "default"});
        std::fs::write(&path, config.to_string()).unwrap();
        assert_eq!(LlamaWeights::load_hf(dir.path()).unwrap(), weights);
        std::fs::write(&path, "{}").unwrap();
        let error = LlamaWeights::load_hf(dir.path()).unwrap_err().to_string();
        assert!(error.contains("config.json") && error.contains("hidden_size"), "{error}");
    }
}
