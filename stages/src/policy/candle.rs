//! The batched in-process policy: a llama-family GGUF model run by sesa's own forward pass on
//! the CPU (weights dequantized to F32 at load, read with candle's GGUF reader).
//!
//! It exists for speed where mistral.rs 0.8.1 is slow on the CPU (notes/mistralrs-0.8.md):
//! - All live trajectories of a `generate` call decode together: one projection per layer for
//!   the whole batch instead of one model instance per request.
//! - Each trajectory's KV cache is kept after its turn, so the next turn feeds only the new
//!   tokens (the tool result and what follows) instead of re-reading the whole context. Any
//!   cached sequence sharing a prefix with a new context serves it (the rollouts of one
//!   question share their prompt).
//! - The forward pass is row-local (see [`llama`]), so neither the cache nor the batch changes
//!   a single bit of the logits: a seed reproduces its trajectory exactly.
//!
//! It has no constrained decoding: a request with a JSON Schema is refused (use a mistralrs or
//! OpenAI-compatible judge for skill distillation).

mod llama;
mod tokenizer;

use std::fs::File;
use std::path::Path;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokenizers::Tokenizer;

use self::llama::{Chunk, KvCache, LlamaModel};
use super::sampling::sample;
use super::{ChatMessage, ChatTemplate, FinishReason, Generation, GenerationRequest, Policy, PolicyError};

/// A local llama-family GGUF model served by sesa's batched forward pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CandleConfig {
    /// A GGUF file, or the name of a model `sesa model fetch` knows (e.g. `smollm2-135m-instruct`).
    pub model: String,
    /// Tokens of KV cache kept between calls for reuse (the least recently used sequences go
    /// first). SmolLM2-135M needs 45 KiB per token: the default 32768 is about 1.5 GB.
    #[serde(default = "default_cache_tokens")]
    pub cache_tokens: usize,
}

fn default_cache_tokens() -> usize {
    32_768
}

/// Cached sequences: token ids with the KV cache of exactly those tokens.
struct Sessions {
    capacity: usize,
    clock: u64,
    entries: Vec<(Vec<u32>, KvCache, u64)>,
}

impl Sessions {
    /// The cache of the longest cached prefix of `context`, leaving at least one token to feed.
    fn lookup(&mut self, context: &[u32]) -> KvCache {
        self.clock += 1;
        let best = self
            .entries
            .iter_mut()
            .map(|entry| (entry.0.iter().zip(context).take_while(|(a, b)| a == b).count(), entry))
            .max_by_key(|(shared, _)| *shared);
        match best {
            Some((shared, entry)) if shared > 0 => {
                entry.2 = self.clock;
                entry.1.prefix(shared.min(context.len() - 1))
            }
            _ => KvCache::default(),
        }
    }

    /// Keeps `cache` (of `tokens`), dropping the sequences it extends and then the least
    /// recently used ones beyond the capacity.
    fn store(&mut self, tokens: Vec<u32>, cache: KvCache) {
        debug_assert_eq!(tokens.len(), cache.len());
        self.clock += 1;
        self.entries.retain(|(cached, _, _)| !tokens.starts_with(cached));
        self.entries.push((tokens, cache, self.clock));
        let mut total: usize = self.entries.iter().map(|e| e.0.len()).sum();
        while total > self.capacity {
            let Some(oldest) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.2).map(|(i, _)| i) else { break };
            total -= self.entries.swap_remove(oldest).0.len();
        }
    }
}

struct Inner {
    name: String,
    model: LlamaModel,
    tokenizer: Tokenizer,
    /// Token ids that end a turn.
    stops: Vec<u32>,
    sessions: Mutex<Sessions>,
}

/// The batched candle backend behind the [`Policy`] trait.
pub struct CandlePolicy {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for CandlePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CandlePolicy({})", self.inner.name)
    }
}

/// One trajectory being continued.
struct Live {
    context: Vec<u32>,
    cache: KvCache,
    /// Tokens to feed next.
    pending: Vec<u32>,
    rng: ChaCha8Rng,
    picks: Vec<(u32, f32)>,
    limit: usize,
    finish: Option<FinishReason>,
}

impl CandlePolicy {
    /// Loads the GGUF file at `path` (blocking: a second or two for SmolLM2-135M, which takes
    /// 540 MB as F32).
    pub fn load(path: &Path, config: &CandleConfig) -> Result<CandlePolicy, PolicyError> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("model").to_string();
        let error = |message: String| PolicyError::Backend { name: name.clone(), message };
        let mut file = File::open(path).map_err(|e| error(format!("{}: {e}", path.display())))?;
        let content = candle_core::quantized::gguf_file::Content::read(&mut file)
            .map_err(|e| error(format!("{}: {e}", path.display())))?;
        let model = LlamaModel::load(&content, &mut file).map_err(|e| error(format!("{}: {e}", path.display())))?;
        let (tokenizer, stops) =
            tokenizer::from_gguf(&content).map_err(|e| error(format!("{}: {e}", path.display())))?;
        let sessions = Mutex::new(Sessions { capacity: config.cache_tokens, clock: 0, entries: Vec::new() });
        Ok(CandlePolicy { inner: Arc::new(Inner { name, model, tokenizer, stops, sessions }) })
    }

    /// The text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String, PolicyError> {
        self.inner.decode(ids)
    }
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

    fn generate(&self, requests: &[GenerationRequest]) -> Result<Vec<Generation>, PolicyError> {
        let mut lives = Vec::with_capacity(requests.len());
        for request in requests {
            if request.json_schema.is_some() {
                return Err(self.error(
                    "the candle backend has no constrained decoding; give the spec a `judge:` section \
                     with the mistralrs or openai backend for skill distillation",
                ));
            }
            let context = match &request.context_ids {
                Some(ids) => ids.clone(),
                None => self.tokenize(&request.context)?,
            };
            if context.is_empty() {
                return Err(self.error("empty context"));
            }
            let limit = request.max_tokens.min(self.model.shape.context.saturating_sub(context.len()));
            let cache = self.sessions.lock().expect("session lock").lookup(&context);
            lives.push(Live {
                pending: context[cache.len()..].to_vec(),
                context,
                cache,
                rng: ChaCha8Rng::seed_from_u64(request.seed),
                picks: Vec::new(),
                limit,
                finish: (limit == 0).then_some(FinishReason::Length),
            });
        }
        // Requests with the same context and cache (the rollouts of one question) read it once:
        // the twins copy the first one's cache and logits after the first forward step.
        let twin_of: Vec<Option<usize>> = (0..lives.len())
            .map(|i| {
                (0..i).find(|&j| {
                    lives[j].finish.is_none()
                        && lives[j].context == lives[i].context
                        && lives[j].cache.len() == lives[i].cache.len()
                })
            })
            .collect();
        let mut first_step = true;
        loop {
            let feeding: Vec<usize> = (0..lives.len())
                .filter(|&i| lives[i].finish.is_none() && !(first_step && twin_of[i].is_some()))
                .collect();
            if feeding.is_empty() {
                break;
            }
            let mut chunks: Vec<Chunk<'_>> = lives
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| feeding.contains(i))
                .map(|(_, live)| Chunk { cache: &mut live.cache, tokens: &live.pending })
                .collect();
            let logits = self.model.forward(&mut chunks).map_err(|e| self.error(e))?;
            drop(chunks);
            let mut next: Vec<Option<Vec<f32>>> = vec![None; lives.len()];
            for (i, logits) in feeding.into_iter().zip(logits) {
                next[i] = Some(logits);
            }
            if std::mem::take(&mut first_step) {
                for (i, twin) in twin_of.iter().enumerate() {
                    if let (Some(j), None) = (*twin, lives[i].finish) {
                        lives[i].cache = lives[j].cache.clone();
                        next[i] = next[j].clone();
                    }
                }
            }
            let active: Vec<((&mut Live, &GenerationRequest), Vec<f32>)> = lives
                .iter_mut()
                .zip(requests)
                .zip(next)
                .filter_map(|(pair, logits)| logits.map(|logits| (pair, logits)))
                .collect();
            active.into_par_iter().try_for_each(|((live, request), mut logits)| {
                if request.ignore_eos {
                    self.stops.iter().for_each(|&id| logits[id as usize] = f32::NEG_INFINITY);
                }
                let (id, logprob) = sample(&logits, request.sampling, &mut live.rng);
                live.picks.push((id, logprob));
                live.pending = vec![id];
                live.finish = if self.stops.contains(&id) {
                    Some(FinishReason::Eos)
                } else if self.ends_with_stop(&live.picks, &request.stop)? {
                    Some(FinishReason::Stop)
                } else if live.picks.len() >= live.limit {
                    Some(FinishReason::Length)
                } else {
                    None
                };
                Ok::<_, PolicyError>(())
            })?;
        }
        let mut generations = Vec::with_capacity(lives.len());
        for live in lives {
            let ids: Vec<u32> = live.picks.iter().map(|(id, _)| *id).collect();
            let text = self.decode(&ids)?;
            // The cache holds the context and every pick but the last (never fed).
            let mut fed = live.context;
            fed.extend(ids.iter().take(ids.len().saturating_sub(1)));
            if fed.len() == live.cache.len() {
                self.sessions.lock().expect("session lock").store(fed, live.cache);
            }
            generations.push(Generation {
                text,
                token_ids: Some(ids),
                logprobs: Some(live.picks.iter().map(|(_, lp)| *lp).collect()),
                finish: live.finish.unwrap_or(FinishReason::Length),
            });
        }
        Ok(generations)
    }

    /// Whether the text of `picks` has just come to contain a stop string. Only the last
    /// tokens are decoded: a stop string that appeared earlier would have stopped generation.
    fn ends_with_stop(&self, picks: &[(u32, f32)], stops: &[String]) -> Result<bool, PolicyError> {
        let Some(longest) = stops.iter().map(String::len).max() else { return Ok(false) };
        let tail: Vec<u32> = picks[picks.len().saturating_sub(longest + 1)..].iter().map(|(id, _)| *id).collect();
        let text = self.decode(&tail)?;
        Ok(stops.iter().any(|stop| text.contains(stop.as_str())))
    }
}

impl Policy for CandlePolicy {
    fn name(&self) -> &str {
        &self.inner.name
    }

    fn render_chat(&self, messages: &[ChatMessage]) -> String {
        // SmolLM2 (the default) and Qwen use ChatML.
        ChatTemplate::Chatml.render(messages)
    }

    fn tokenize<'a>(&'a self, text: &'a str) -> BoxFuture<'a, Result<Option<Vec<u32>>, PolicyError>> {
        Box::pin(async move { self.inner.tokenize(text).map(Some) })
    }

    fn generate<'a>(
        &'a self,
        requests: &'a [GenerationRequest],
    ) -> BoxFuture<'a, Result<Vec<Generation>, PolicyError>> {
        let inner = self.inner.clone();
        let requests = requests.to_vec();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || inner.generate(&requests))
                .await
                .map_err(|e| PolicyError::Backend { name: self.inner.name.clone(), message: e.to_string() })?
        })
    }
}

#[cfg(test)]
mod tests;
