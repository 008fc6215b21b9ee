//! Sentence embeddings for skill retrieval and deduplication: all-MiniLM-L6-v2 through
//! candle-transformers' BERT (mean pooling, L2 normalisation, padded batches), behind a cache
//! keyed by the text's hash, so a skill or question is embedded once per run.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use sha2::{Digest, Sha256};
use tokenizers::{PaddingParams, Tokenizer, TruncationParams};

/// Why texts could not be embedded.
#[derive(Debug, thiserror::Error)]
#[error("embedder `{name}`: {message}")]
pub struct EmbedError {
    /// The embedder.
    pub name: String,
    /// What went wrong.
    pub message: String,
}

/// Turns texts into unit vectors whose dot product is their cosine similarity.
pub trait Embedder: Send + Sync {
    /// A name for logs and tables.
    fn name(&self) -> &str;
    /// Embeds every text; vectors are L2-normalised, in input order.
    fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError>;
}

/// all-MiniLM-L6-v2 (or any BERT sentence encoder with mean pooling) on the CPU.
pub struct MiniLm {
    name: String,
    model: BertModel,
    tokenizer: Tokenizer,
    device: Device,
}

/// Texts per forward pass: small enough that padding to the longest text in a batch stays cheap
/// (texts are sorted by length first); batch 128 measured no faster.
const BATCH: usize = 32;
/// Vectors with the index of their text.
type Embedded = Vec<(usize, Vec<f32>)>;
/// all-MiniLM-L6-v2 was trained on 256 tokens at most (`sentence_bert_config.json`).
const MAX_TOKENS: usize = 256;

impl MiniLm {
    /// Loads `model.safetensors`, `config.json` and `tokenizer.json` from `directory`.
    pub fn load(directory: &Path) -> Result<MiniLm, EmbedError> {
        let name = directory.file_name().and_then(|n| n.to_str()).unwrap_or("embedder").to_string();
        let error = |message: String| EmbedError { name: name.clone(), message };
        let config = std::fs::read_to_string(directory.join("config.json"))
            .map_err(|e| error(format!("{}: {e}", directory.join("config.json").display())))?;
        let config: Config = serde_json::from_str(&config).map_err(|e| error(format!("config.json: {e}")))?;
        let device = Device::Cpu;
        let weights = directory.join("model.safetensors");
        // SAFETY: the weights file is memory-mapped read-only; the model cache is not written
        // while a run reads it.
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[&weights], DType::F32, &device) }
            .map_err(|e| error(format!("{}: {e}", weights.display())))?;
        let model = BertModel::load(vb, &config).map_err(|e| error(format!("loading BERT: {e}")))?;
        let mut tokenizer = Tokenizer::from_file(directory.join("tokenizer.json"))
            .map_err(|e| error(format!("tokenizer.json: {e}")))?;
        tokenizer.with_padding(Some(PaddingParams::default()));
        tokenizer
            .with_truncation(Some(TruncationParams { max_length: MAX_TOKENS, ..TruncationParams::default() }))
            .map_err(|e| error(format!("tokenizer truncation: {e}")))?;
        Ok(MiniLm { name, model, tokenizer, device })
    }

    fn forward(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
        let encodings = self.tokenizer.encode_batch(texts.to_vec(), true).map_err(|e| e.to_string())?;
        let rows = encodings.len();
        let width = encodings.first().map_or(0, |e| e.get_ids().len());
        let ids: Vec<u32> = encodings.iter().flat_map(|e| e.get_ids().iter().copied()).collect();
        let mask: Vec<u32> = encodings.iter().flat_map(|e| e.get_attention_mask().iter().copied()).collect();
        let run = || -> candle_core::Result<Vec<Vec<f32>>> {
            let ids = Tensor::from_vec(ids, (rows, width), &self.device)?;
            let mask = Tensor::from_vec(mask, (rows, width), &self.device)?;
            let types = ids.zeros_like()?;
            let hidden = self.model.forward(&ids, &types, Some(&mask))?;
            // Mean over the real tokens only, then unit length.
            let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
            let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
            let counts = mask.sum(1)?;
            let mean = summed.broadcast_div(&counts)?;
            let norms = mean.sqr()?.sum_keepdim(1)?.sqrt()?;
            mean.broadcast_div(&norms)?.to_vec2::<f32>()
        };
        run().map_err(|e| e.to_string())
    }
}

impl Embedder for MiniLm {
    fn name(&self) -> &str {
        &self.name
    }

    fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        // Sort by length so each padded batch holds texts of similar length.
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| texts[i].len());
        let chunks: Vec<&[usize]> = order.chunks(BATCH).collect();
        // candle's CPU BERT keeps about one core busy: batches go to one worker per core.
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, chunks.len().max(1));
        let done: Vec<Result<Embedded, String>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers)
                .map(|worker| {
                    let chunks = &chunks;
                    scope.spawn(move || {
                        let mut out = Vec::new();
                        for chunk in chunks.iter().skip(worker).step_by(workers) {
                            let batch: Vec<&str> = chunk.iter().map(|&i| texts[i]).collect();
                            out.extend(chunk.iter().copied().zip(self.forward(&batch)?));
                        }
                        Ok(out)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("an embedding worker panicked".into())))
                .collect()
        });
        let mut vectors = vec![Vec::new(); texts.len()];
        for part in done {
            for (i, vector) in part.map_err(|message| EmbedError { name: self.name.clone(), message })? {
                vectors[i] = vector;
            }
        }
        Ok(vectors)
    }
}

/// A test double, not a semantic model: each lowercased word is hashed into one of
/// `dimension` buckets. Texts sharing words are similar; paraphrases with other words are not.
/// It needs no weights, so loop tests run without fetching the embedder.
pub struct HashedWords {
    dimension: usize,
}

impl HashedWords {
    /// Vectors of `dimension` buckets.
    pub fn new(dimension: usize) -> HashedWords {
        HashedWords { dimension: dimension.max(1) }
    }
}

impl Embedder for HashedWords {
    fn name(&self) -> &str {
        "hashed-words"
    }

    fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(texts
            .iter()
            .map(|text| {
                let mut vector = vec![0.0f32; self.dimension];
                for word in text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
                    let digest = Sha256::digest(word.to_lowercase().as_bytes());
                    let bucket = u64::from_le_bytes(digest[..8].try_into().expect("8 bytes")) as usize % self.dimension;
                    vector[bucket] += 1.0;
                }
                normalize(&mut vector);
                vector
            })
            .collect())
    }
}

fn normalize(vector: &mut [f32]) {
    let norm = vector.iter().map(|v| v * v).sum::<f32>().sqrt();
    if norm > 0.0 {
        vector.iter_mut().for_each(|v| *v /= norm);
    }
}

/// An embedder behind a cache keyed by the SHA-256 of each text.
pub struct CachedEmbedder {
    inner: Box<dyn Embedder>,
    cache: Mutex<HashMap<[u8; 32], Vec<f32>>>,
}

impl CachedEmbedder {
    /// Caches `inner`.
    pub fn new(inner: Box<dyn Embedder>) -> CachedEmbedder {
        CachedEmbedder { inner, cache: Mutex::new(HashMap::new()) }
    }

    /// The embedder's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Embeds the texts not seen before in one batch; returns every vector in input order.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let keys: Vec<[u8; 32]> = texts.iter().map(|t| Sha256::digest(t.as_bytes()).into()).collect();
        let missing: Vec<usize> = {
            let cache = self.cache.lock().expect("embedding cache lock");
            let mut seen = std::collections::HashSet::new();
            (0..texts.len()).filter(|&i| !cache.contains_key(&keys[i]) && seen.insert(keys[i])).collect()
        };
        if !missing.is_empty() {
            let batch: Vec<&str> = missing.iter().map(|&i| texts[i]).collect();
            let vectors = self.inner.embed_batch(&batch)?;
            let mut cache = self.cache.lock().expect("embedding cache lock");
            for (&i, vector) in missing.iter().zip(vectors) {
                cache.insert(keys[i], vector);
            }
        }
        let cache = self.cache.lock().expect("embedding cache lock");
        Ok(keys.iter().map(|k| cache[k].clone()).collect())
    }

    /// One text.
    pub fn embed_one(&self, text: &str) -> Result<Vec<f32>, EmbedError> {
        Ok(self.embed(&[text])?.remove(0))
    }
}

/// The cosine similarity of two unit vectors.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
