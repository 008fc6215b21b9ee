//! The `trainer:` section: what is trained (full fine-tuning or LoRA) and how much memory a
//! micro-batch may take.

use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, Section};

use super::MAX_TOKENS;
use sesa_models::train::Method;

/// The `trainer:` section: what is trained and how much memory a micro-batch may take.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TrainerSection {
    /// Full fine-tuning (`{kind: full}`, the default) or LoRA (`{kind: lora, rank, alpha,
    /// targets}`).
    #[serde(default = "full")]
    pub method: Method,
    /// Tokens per micro-batch at most; gradients of micro-batches accumulate into one
    /// optimizer step. Activations take about 1 MB per token for SmolLM2-135M.
    #[serde(default = "micro_batch_tokens")]
    pub micro_batch_tokens: usize,
}

fn full() -> Method {
    Method::Full
}

fn micro_batch_tokens() -> usize {
    2048
}

impl Default for TrainerSection {
    fn default() -> Self {
        TrainerSection { method: Method::Full, micro_batch_tokens: micro_batch_tokens() }
    }
}

impl Section for TrainerSection {
    const KEY: &'static str = "trainer";

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems: Vec<ConfigProblem> = self
            .method
            .problems()
            .into_iter()
            .map(|(key, message)| ConfigProblem::new(format!("method.{key}"), message))
            .collect();
        problems.extend(ConfigProblem::size("micro_batch_tokens", self.micro_batch_tokens, 1..=MAX_TOKENS));
        problems
    }
}
