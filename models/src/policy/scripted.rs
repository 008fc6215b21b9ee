//! A policy that replays canned turns, for tests only: a function of (context, seed) decides
//! the next turn, so behaviour is reproducible and independent of batching. Tokens are the
//! bytes of the text (ids 0–255), so ids always decode back to the text.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::BoxFuture;

use super::{ChatMessage, ChatTemplate, FinishReason, Generation, GenerationRequest, Policy, PolicyError};

type Script = dyn Fn(&str, u64) -> String + Send + Sync;

/// A test double: turns come from a function of the context and the seed.
#[derive(Clone)]
pub struct ScriptedPolicy {
    script: Arc<Script>,
    /// Stands in for a server that reloads an external trainer's checkpoints.
    version: Arc<AtomicU64>,
}

impl std::fmt::Debug for ScriptedPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScriptedPolicy")
    }
}

impl ScriptedPolicy {
    /// A policy whose next turn is `script(context, seed)`; the end-of-turn marker in the
    /// script's output means end of sequence.
    pub fn new(script: impl Fn(&str, u64) -> String + Send + Sync + 'static) -> Self {
        ScriptedPolicy { script: Arc::new(script), version: Arc::default() }
    }

    fn continue_one(&self, request: &GenerationRequest) -> Generation {
        let full = (self.script)(&request.context, request.seed);
        let end_of_turn = ChatTemplate::Chatml.end_of_turn();
        let mut text = full.clone();
        let mut finish = FinishReason::Eos;
        // Earliest stop string or end of turn wins, as in a real decoder.
        let mut cut = text.find(end_of_turn).map(|at| (at, at, FinishReason::Eos));
        for stop in &request.stop {
            if let Some(at) = text.find(stop.as_str()) {
                let end = at + stop.len();
                if cut.is_none_or(|(first, _, _)| at < first) {
                    cut = Some((at, end, FinishReason::Stop));
                }
            }
        }
        if let Some((_, end, reason)) = cut {
            text.truncate(end);
            if reason == FinishReason::Eos {
                text.truncate(text.len() - end_of_turn.len());
            }
            finish = reason;
        }
        if text.len() > request.max_tokens {
            let mut end = request.max_tokens;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            finish = FinishReason::Length;
        }
        let token_ids: Vec<u32> = text.bytes().map(u32::from).collect();
        let logprobs = token_ids
            .iter()
            .enumerate()
            .map(|(i, id)| -(((*id as u64 + i as u64 + request.seed) % 97) as f32) / 50.0)
            .collect();
        Generation { text, token_ids: Some(token_ids), logprobs: Some(logprobs), finish }
    }
}

impl Policy for ScriptedPolicy {
    fn name(&self) -> &str {
        "scripted"
    }

    fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }

    fn reloaded(&self, version: u64, _checkpoint: &std::path::Path) -> Result<(), PolicyError> {
        self.version.store(version, Ordering::SeqCst);
        Ok(())
    }

    fn render_chat(&self, messages: &[ChatMessage]) -> String {
        ChatTemplate::Chatml.render(messages)
    }

    fn tokenize<'a>(&'a self, text: &'a str) -> BoxFuture<'a, Result<Option<Vec<u32>>, PolicyError>> {
        Box::pin(async move { Ok(Some(text.bytes().map(u32::from).collect())) })
    }

    fn decode<'a>(&'a self, ids: &'a [u32]) -> BoxFuture<'a, Result<Option<String>, PolicyError>> {
        Box::pin(async move {
            Ok(Some(String::from_utf8_lossy(&ids.iter().map(|&id| id as u8).collect::<Vec<u8>>()).into_owned()))
        })
    }

    fn generate<'a>(
        &'a self,
        requests: &'a [GenerationRequest],
    ) -> BoxFuture<'a, Result<Vec<Generation>, PolicyError>> {
        Box::pin(async move { Ok(requests.iter().map(|r| self.continue_one(r)).collect()) })
    }
}
