//! The batched in-process policy: a llama-family GGUF model run by sesa's own forward pass on
//! the CPU (weights dequantized to F32 at load, read with candle's GGUF reader).
//!
//! It exists for speed where mistral.rs 0.8.1 is slow on the CPU (about 7 solver trajectories
//! a minute where this backend runs 60, docs/benchmarks.md):
//! - Continuous batching ([`scheduler`]): every running request decodes in one forward step,
//!   one projection per layer for all of them; requests join and leave between steps.
//! - Each trajectory's KV cache is kept after its turn, so the next turn feeds only the new
//!   tokens (the tool result and what follows) instead of re-reading the whole context. Any
//!   cached or running sequence sharing a prefix with a new context serves it (the rollouts of
//!   one question share their prompt).
//! - The forward pass is row-local (see [`llama`]), so neither the cache nor the batch changes
//!   a single bit of the logits: a seed reproduces its trajectory exactly.
//!
//! A request with a JSON Schema is decoded under it (llguidance, the grammar engine mistral.rs
//! uses): tokens the schema forbids are masked before sampling, so log-probabilities are those
//! of the masked distribution.

mod decode_bench;
mod llama;
mod scheduler;
mod tokenizer;

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, OnceLock};

use futures::future::BoxFuture;
use llguidance::ParserFactory;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokenizers::Tokenizer;

pub use self::decode_bench::{DecodingTiming, bench_decoding, bench_token_ids, dense_macs_per_token};
use self::llama::LlamaModel;
use self::scheduler::{Message, Sessions, Submitted};
use super::chat::TemplateSource;
use super::{ChatFormat, ChatMessage, Generation, GenerationRequest, Policy, PolicyError};
use crate::kernels::{KvCacheDtype, Precision};
use crate::weights::{LlamaShape, LlamaWeights};

/// A local llama-family GGUF model served by sesa's batched forward pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CandleConfig {
    /// A GGUF file, or the name of a model `sesa model fetch` knows (e.g. `smollm2-135m-instruct`).
    pub model: String,
    /// Tokens of KV cache kept between calls for reuse (the least recently used sequences go
    /// first). SmolLM2-135M needs 45 KiB per token in F32 (half in F16): the default 32768 is
    /// about 1.5 GB. While an update reads the served block inputs, 2.25 KiB more per token,
    /// and up to four times as many tokens' inputs for finished sequences (about 0.3 GB).
    #[serde(default = "default_cache_tokens")]
    pub cache_tokens: usize,
    /// The policy version these weights are (0: as published, untrained). `sesa eval` sets it
    /// when it serves a run's exported policy, so evaluations record the version evaluated.
    #[serde(default)]
    pub policy_version: u64,
    /// How the weight matrices are stored and multiplied: `f32` (the default; a GGUF's
    /// quantized values are held exactly) or `int8` (a scale per 32 inputs, as GGUF's Q8_0:
    /// faster decoding, log-probabilities slightly off F32's). Either way a seed gives the
    /// same tokens whatever the batching. Trainers compute in F32 whatever this says.
    #[serde(default)]
    pub dtype: Precision,
    /// How keys and values are cached: `f32` (the default, as computed) or `f16` (rounded to
    /// nearest: half the cache's memory and of the bytes attention reads, with
    /// log-probabilities about 0.001 nats off F32's). Trainers compute in F32 whatever this says.
    #[serde(default)]
    pub kv_cache_dtype: KvCacheDtype,
}

fn default_cache_tokens() -> usize {
    32_768
}

/// What the scheduler thread and the callers share.
struct Inner {
    name: String,
    /// The shapes of the served weights (new weights must have the same).
    shape: LlamaShape,
    /// How weights are packed, new ones included.
    precision: Precision,
    /// How keys and values are cached.
    kv_cache_dtype: KvCacheDtype,
    /// Logits per position.
    vocabulary: usize,
    /// The version of the weights served (0 as loaded).
    version: AtomicU64,
    tokenizer: Tokenizer,
    /// Token ids that end a turn.
    stops: Vec<u32>,
    /// The model's own chat template, or ChatML.
    chat: ChatFormat,
    /// The grammar engine over this vocabulary, or why it could not be built (then requests with
    /// a JSON Schema are refused with that reason). Built on the first such request: most
    /// policies never need it.
    grammars: OnceLock<Result<ParserFactory, String>>,
    /// Tokens fed through the model, prompts and decoding alike: what tests of shared work
    /// count.
    #[cfg(test)]
    rows_fed: std::sync::atomic::AtomicUsize,
}

/// The batched candle backend behind the [`Policy`] trait.
pub struct CandlePolicy {
    inner: Arc<Inner>,
    /// To the scheduler thread, which stops when this is dropped.
    submit: Sender<Message>,
}

impl std::fmt::Debug for CandlePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CandlePolicy({})", self.inner.name)
    }
}

impl CandlePolicy {
    /// Loads the model at `path` (a GGUF file, or a Hugging Face directory such as `sesa model
    /// export` writes; blocking: a second or two for SmolLM2-135M, which takes 650 MB as F32,
    /// its tied embedding kept twice) and starts its scheduler thread.
    pub fn load(path: &Path, config: &CandleConfig) -> Result<CandlePolicy, PolicyError> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("model").to_string();
        let error = |message: String| PolicyError::Backend { name: name.clone(), message };
        let files = ModelFiles::read(path).map_err(error)?;
        let chat = files.chat_format(&name);
        let ModelFiles { weights, tokenizer, stops, .. } = files;
        let model = LlamaModel::new(&weights, config.dtype, config.kv_cache_dtype);
        let inner = Arc::new(Inner {
            name: name.clone(),
            precision: config.dtype,
            kv_cache_dtype: config.kv_cache_dtype,
            vocabulary: model.vocabulary(),
            shape: weights.shape,
            version: AtomicU64::new(config.policy_version),
            tokenizer,
            stops,
            chat,
            grammars: OnceLock::new(),
            #[cfg(test)]
            rows_fed: Default::default(),
        });
        let (submit, submissions) = channel();
        let (scheduled, sessions) = (inner.clone(), Sessions::new(config.cache_tokens));
        std::thread::Builder::new()
            .name(format!("sesa-candle-{name}"))
            .spawn(move || scheduler::run(&scheduled, model, submissions, sessions))
            .map_err(|e| error(format!("cannot start the scheduler thread: {e}")))?;
        Ok(CandlePolicy { inner, submit })
    }

    /// The text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String, PolicyError> {
        self.inner.decode(ids)
    }

    /// The tokenizer (exported beside trained weights).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }
}

/// A llama-family model on disk, read whole: a GGUF file (weights dequantized, tokenizer
/// rebuilt from its metadata) or a Hugging Face directory (`config.json`, `model.safetensors`,
/// `tokenizer.json`).
pub struct ModelFiles {
    /// The weights as F32.
    pub weights: LlamaWeights,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// Token ids that end a turn (the first is end-of-sequence).
    pub stops: Vec<u32>,
    /// The beginning-of-sequence id, when the model names one.
    pub bos: Option<u32>,
    /// The chat template (Jinja), when the model has one.
    pub chat_template: Option<String>,
}

impl ModelFiles {
    /// Reads the model at `path`; errors name the file.
    pub fn read(path: &Path) -> Result<ModelFiles, String> {
        if path.is_dir() && path.join("config.json").exists() {
            return Self::read_hf(path);
        }
        let mut file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let content = candle_core::quantized::gguf_file::Content::read(&mut file)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let weights = LlamaWeights::from_gguf(&content, &mut file).map_err(|e| format!("{}: {e}", path.display()))?;
        let (tokenizer, stops) = tokenizer::from_gguf(&content).map_err(|e| format!("{}: {e}", path.display()))?;
        let bos = content.metadata.get("tokenizer.ggml.bos_token_id").and_then(|v| v.to_u32().ok());
        Ok(ModelFiles { weights, tokenizer, stops, bos, chat_template: gguf_chat_template(&content) })
    }

    /// How this model's prompts are rendered: its own template, or ChatML.
    pub fn chat_format(&self, name: &str) -> ChatFormat {
        let token = |id: Option<u32>| id.and_then(|id| self.tokenizer.id_to_token(id)).unwrap_or_default();
        ChatFormat::from_model(
            name,
            self.chat_template.as_deref(),
            &token(self.bos),
            &token(self.stops.first().copied()),
        )
    }

    fn read_hf(dir: &Path) -> Result<ModelFiles, String> {
        let weights = LlamaWeights::load_hf(dir).map_err(|e| e.to_string())?;
        let path = dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let config: serde_json::Value = std::fs::read_to_string(dir.join("config.json"))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default();
        let ids = |value: &serde_json::Value| -> Vec<u32> {
            match value {
                serde_json::Value::Array(values) => {
                    values.iter().filter_map(|v| v.as_u64()).map(|v| v as u32).collect()
                }
                value => value.as_u64().map(|v| v as u32).into_iter().collect(),
            }
        };
        let mut stops = ids(&config["eos_token_id"]);
        stops.extend(tokenizer.token_to_id("<|endoftext|>"));
        stops.dedup();
        if stops.is_empty() {
            return Err(format!("{}: `eos_token_id` is missing", dir.join("config.json").display()));
        }
        let chat_template = std::fs::read_to_string(dir.join("tokenizer_config.json"))
            .ok()
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
            .and_then(|c| super::chat::tokenizer_config_template(&c));
        Ok(ModelFiles { weights, tokenizer, stops, bos: ids(&config["bos_token_id"]).first().copied(), chat_template })
    }

    /// Writes `weights` (in place of these) as a Hugging Face directory with this model's
    /// tokenizer: what transformers, vLLM and the `candle` backend load.
    pub fn export(&self, weights: &LlamaWeights, out: &Path) -> Result<(), String> {
        std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
        weights.save_hf(out, self.bos, self.stops.first().copied()).map_err(|e| e.to_string())?;
        let path = out.join("tokenizer.json");
        self.tokenizer.save(&path, false).map_err(|e| format!("{}: {e}", path.display()))?;
        let token = |id: Option<u32>| id.and_then(|id| self.tokenizer.id_to_token(id));
        let config = serde_json::json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": token(self.bos),
            "eos_token": token(self.stops.first().copied()),
            "pad_token": token(self.stops.first().copied()),
            "chat_template": self.chat_template,
        });
        let path = out.join("tokenizer_config.json");
        std::fs::write(&path, serde_json::to_string_pretty(&config).expect("plain JSON"))
            .map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// A GGUF's chat template (`tokenizer.chat_template`).
fn gguf_chat_template(content: &candle_core::quantized::gguf_file::Content) -> Option<String> {
    content.metadata.get("tokenizer.chat_template").and_then(|v| v.to_string().ok()).cloned()
}

/// The chat template of the GGUF file at `path` and its special tokens, from its metadata
/// alone (for backends that load the file themselves).
pub fn gguf_template_source(path: &Path) -> Result<TemplateSource, String> {
    use candle_core::quantized::gguf_file::Value;
    let mut file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let content =
        candle_core::quantized::gguf_file::Content::read(&mut file).map_err(|e| format!("{}: {e}", path.display()))?;
    let token = |key: &str| -> String {
        let id = content.metadata.get(key).and_then(|v| v.to_u32().ok());
        let tokens = content.metadata.get("tokenizer.ggml.tokens").and_then(|v| v.to_vec().ok());
        match (id, tokens) {
            (Some(id), Some(tokens)) => match tokens.get(id as usize) {
                Some(Value::String(token)) => token.clone(),
                _ => String::new(),
            },
            _ => String::new(),
        }
    };
    Ok(TemplateSource {
        source: gguf_chat_template(&content),
        bos_token: token("tokenizer.ggml.bos_token_id"),
        eos_token: token("tokenizer.ggml.eos_token_id"),
    })
}

/// llguidance's grammar engine over the vocabulary of `tokenizer`, with `stops` as end of
/// sequence.
fn grammar_engine(tokenizer: &Tokenizer, stops: &[u32], vocabulary: usize) -> Result<ParserFactory, String> {
    // toktrie reads tokenizers 0.21, sesa uses 0.22: they share the JSON form.
    let json = tokenizer.to_string(false).map_err(|e| e.to_string())?;
    let mut bytes =
        toktrie_hf_tokenizers::ByteTokenizer::from_json_bytes(json.as_bytes()).map_err(|e| e.to_string())?;
    if !stops.is_empty() {
        bytes.set_eos_tokens(stops);
    }
    let environment = bytes.into_tok_env(Some(vocabulary)).map_err(|e| e.to_string())?;
    ParserFactory::new_simple(&environment).map_err(|e| e.to_string())
}

impl Inner {
    fn error(&self, message: impl std::fmt::Display) -> PolicyError {
        PolicyError::Backend { name: self.name.clone(), message: message.to_string() }
    }

    fn decode(&self, ids: &[u32]) -> Result<String, PolicyError> {
        self.tokenizer.decode(ids, true).map_err(|e| self.error(e))
    }

    fn tokenize(&self, text: &str) -> Result<Vec<u32>, PolicyError> {
        Ok(self.tokenizer.encode(text, false).map_err(|e| self.error(e))?.get_ids().to_vec())
    }
}

impl Policy for CandlePolicy {
    fn name(&self) -> &str {
        &self.inner.name
    }

    fn render_chat(&self, messages: &[ChatMessage]) -> String {
        self.inner.chat.render(messages)
    }

    fn tokenize<'a>(&'a self, text: &'a str) -> BoxFuture<'a, Result<Option<Vec<u32>>, PolicyError>> {
        Box::pin(async move { self.inner.tokenize(text).map(Some) })
    }

    fn decode<'a>(&'a self, ids: &'a [u32]) -> BoxFuture<'a, Result<Option<String>, PolicyError>> {
        Box::pin(async move { self.inner.decode(ids).map(Some) })
    }

    fn generate<'a>(
        &'a self,
        requests: &'a [GenerationRequest],
    ) -> BoxFuture<'a, Result<Vec<Generation>, PolicyError>> {
        // One message for the whole call, so its requests start in one step (and those of one
        // context follow one leader).
        let (submitted, replies): (Vec<Submitted>, Vec<_>) = requests
            .iter()
            .map(|request| {
                let (reply, answer) = tokio::sync::oneshot::channel();
                (Submitted { request: request.clone(), reply }, answer)
            })
            .unzip();
        let stopped = || self.inner.error("the scheduler thread stopped (see the log for why)");
        let sent = submitted.is_empty() || self.submit.send(Message::Requests(submitted)).is_ok();
        Box::pin(async move {
            if !sent {
                return Err(stopped());
            }
            let mut generations = Vec::with_capacity(replies.len());
            for answer in replies {
                generations.push(answer.await.map_err(|_| stopped())??);
            }
            Ok(generations)
        })
    }

    fn version(&self) -> u64 {
        self.inner.version.load(Ordering::SeqCst)
    }

    fn precision(&self) -> Option<Precision> {
        Some(self.inner.precision)
    }

    fn kv_cache_dtype(&self) -> Option<KvCacheDtype> {
        Some(self.inner.kv_cache_dtype)
    }

    fn reloaded(&self, version: u64, checkpoint: &Path) -> Result<(), PolicyError> {
        let files = ModelFiles::read(checkpoint).map_err(|e| self.inner.error(e))?;
        self.load_weights(&files.weights, version)
    }

    fn block_inputs(&self, sequences: &[Vec<u32>], top: usize) -> Result<Option<Vec<Vec<f32>>>, PolicyError> {
        let layers = self.inner.shape.layers;
        if top == 0 || top >= layers {
            return Ok(None);
        }
        let layer = layers - top;
        let (reply, answer) = std::sync::mpsc::channel();
        let stopped = || self.inner.error("the scheduler thread stopped (see the log for why)");
        self.submit
            .send(Message::BlockInputs { sequences: sequences.to_vec(), layer, reply })
            .map_err(|_| stopped())?;
        let inputs = answer.recv().map_err(|_| stopped())?.map_err(|e| self.inner.error(e))?;
        Ok(Some(inputs))
    }

    fn load_weights(&self, weights: &LlamaWeights, version: u64) -> Result<(), PolicyError> {
        if weights.shape != self.inner.shape {
            return Err(self.inner.error(format!(
                "new weights of another shape ({:?}) than the served ones ({:?})",
                weights.shape, self.inner.shape
            )));
        }
        let (done, swapped) = std::sync::mpsc::channel();
        let stopped = || self.inner.error("the scheduler thread stopped (see the log for why)");
        self.submit
            .send(Message::Replace(
                Box::new(LlamaModel::new(weights, self.inner.precision, self.inner.kv_cache_dtype)),
                done,
            ))
            .map_err(|_| stopped())?;
        swapped.recv().map_err(|_| stopped())?;
        self.inner.version.store(version, Ordering::SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
