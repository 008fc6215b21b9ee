//! Sentence embeddings for skill retrieval and deduplication: all-MiniLM-L6-v2 through the
//! packed BERT forward pass of [`super::bert`] (mean pooling, L2 normalisation), behind a cache
//! keyed by the text's hash, so a skill or question is embedded once per run.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use sha2::{Digest, Sha256};
use tokenizers::{Tokenizer, TruncationParams};

use super::bert::{BertConfig, BertEncoder, Scratch};

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
    encoder: BertEncoder,
    tokenizer: Tokenizer,
}

/// Tokens per forward pass at most: enough rows for the dense layers to run near the core's
/// peak, few enough that the passes spread over the cores.
const PASS_TOKENS: usize = 1024;
/// all-MiniLM-L6-v2 was trained on 256 tokens at most (`sentence_bert_config.json`).
const MAX_TOKENS: usize = 256;

impl MiniLm {
    /// Loads `model.safetensors`, `config.json` and `tokenizer.json` from `directory`.
    pub fn load(directory: &Path) -> Result<MiniLm, EmbedError> {
        let name = directory.file_name().and_then(|n| n.to_str()).unwrap_or("embedder").to_string();
        let error = |message: String| EmbedError { name: name.clone(), message };
        let config = std::fs::read_to_string(directory.join("config.json"))
            .map_err(|e| error(format!("{}: {e}", directory.join("config.json").display())))?;
        let config: BertConfig = serde_json::from_str(&config).map_err(|e| error(format!("config.json: {e}")))?;
        let encoder =
            BertEncoder::load(&directory.join("model.safetensors"), config).map_err(|e| error(e.to_string()))?;
        let mut tokenizer = Tokenizer::from_file(directory.join("tokenizer.json"))
            .map_err(|e| error(format!("tokenizer.json: {e}")))?;
        // Packed passes need no padding (the shipped tokenizer.json pads to 128).
        tokenizer.with_padding(None);
        let max_length = MAX_TOKENS.min(encoder.max_tokens());
        tokenizer
            .with_truncation(Some(TruncationParams { max_length, ..TruncationParams::default() }))
            .map_err(|e| error(format!("tokenizer truncation: {e}")))?;
        Ok(MiniLm { name, encoder, tokenizer })
    }

    fn error(&self, message: impl std::fmt::Display) -> EmbedError {
        EmbedError { name: self.name.clone(), message: message.to_string() }
    }
}

impl Embedder for MiniLm {
    fn name(&self) -> &str {
        &self.name
    }

    fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let encodings = self.tokenizer.encode_batch(texts.to_vec(), true).map_err(|e| self.error(e))?;
        let ids: Vec<&[u32]> = encodings.iter().map(|e| e.get_ids()).collect();
        if let Some(i) = ids.iter().position(|ids| ids.is_empty()) {
            return Err(self.error(format!("text {i} has no tokens")));
        }
        // Consecutive texts fill passes, one per core at least, each of PASS_TOKENS at most.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let total: usize = ids.iter().map(|ids| ids.len()).sum();
        let limit = total.div_ceil(cores).clamp(1, PASS_TOKENS);
        let mut passes: Vec<std::ops::Range<usize>> = Vec::new();
        let (mut start, mut tokens) = (0, 0);
        for (i, text) in ids.iter().enumerate() {
            if tokens > 0 && tokens + text.len() > limit {
                passes.push(start..i);
                (start, tokens) = (i, 0);
            }
            tokens += text.len();
        }
        if start < ids.len() {
            passes.push(start..ids.len());
        }
        // One worker per core takes the next pass; a single pass spreads its layers instead.
        let workers = cores.min(passes.len()).max(1);
        let threads = if workers == 1 { cores } else { 1 };
        let next = AtomicUsize::new(0);
        let done: Vec<Vec<(usize, Vec<Vec<f32>>)>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    scope.spawn(|| {
                        let mut scratch = Scratch::default();
                        let mut out = Vec::new();
                        loop {
                            let pass = next.fetch_add(1, Ordering::Relaxed);
                            let Some(range) = passes.get(pass) else { break out };
                            out.push((range.start, self.encoder.embed(&ids[range.clone()], &mut scratch, threads)));
                        }
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_default()).collect()
        });
        let mut vectors = vec![Vec::new(); texts.len()];
        for (start, pass) in done.into_iter().flatten() {
            for (offset, vector) in pass.into_iter().enumerate() {
                vectors[start + offset] = vector;
            }
        }
        if let Some(i) = vectors.iter().position(Vec::is_empty) {
            return Err(self.error(format!("an embedding worker failed before text {i}")));
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
}

/// The cosine similarity of two unit vectors.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
