//! The `trainer:` section: what is trained (full fine-tuning or LoRA) and how much memory a
//! micro-batch may take.

use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, Section};

use super::MAX_TOKENS;
use sesa_models::train::{LoraMethod, Method};

/// The `trainer:` section: what is trained and how much memory a micro-batch may take.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TrainerSection {
    /// Full fine-tuning (`{kind: full}`, the default) or LoRA (`{kind: lora, rank, alpha,
    /// targets}`).
    #[serde(default = "full")]
    pub method: Method,
    /// LoRA adapters of the `update` stage's (RL) own: its first step merges `method`'s
    /// adapters, trained so far, into the base (from then on the KL reference) and trains
    /// these, fresh, even when they equal `method`. A warm start needs every block, while RL
    /// can adapt the top few for a shorter update: `{kind: lora, rank: 16, alpha: 32,
    /// top_layers: 8}`. Needs `method` to be LoRA too (a checkpoint then holds both sets of
    /// adapters, megabytes). Absent: `update` trains `method`'s.
    #[serde(default)]
    pub update_method: Option<Method>,
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
        TrainerSection { method: Method::Full, update_method: None, micro_batch_tokens: micro_batch_tokens() }
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
        if let Some(update_method) = &self.update_method {
            problems.extend(
                update_method
                    .problems()
                    .into_iter()
                    .map(|(key, message)| ConfigProblem::new(format!("update_method.{key}"), message)),
            );
            match (&self.method, update_method) {
                (Method::Lora(_), Method::Lora(_)) => {}
                (_, Method::Full) => problems.push(ConfigProblem::new(
                    "update_method",
                    "only LoRA can follow another method: for full fine-tuning throughout, set `method: {kind: full}` \
                     and leave `update_method` out",
                )),
                (Method::Full, _) => problems.push(ConfigProblem::new(
                    "update_method",
                    "needs `method` to be LoRA too (after full fine-tuning, checkpoints would have to hold every \
                     weight): set `method: {kind: lora, ...}`, or leave `update_method` out \
                     (`--set trainer.update_method=null`)",
                )),
            }
        }
        problems.extend(ConfigProblem::size("micro_batch_tokens", self.micro_batch_tokens, 1..=MAX_TOKENS));
        problems
    }
}

impl TrainerSection {
    /// The adapters the `update` stage trains instead of `method`'s, if any.
    pub fn update_adapters(&self) -> Option<&LoraMethod> {
        match &self.update_method {
            Some(Method::Lora(lora)) => Some(lora),
            _ => None,
        }
    }

    /// The top blocks `update` trains alone, when it trains some only (LoRA's `top_layers`).
    pub fn update_top_layers(&self) -> Option<usize> {
        let method = match (&self.update_method, &self.method) {
            (Some(method), _) | (None, method) => method,
        };
        match method {
            Method::Lora(lora) => lora.top_layers,
            Method::Full => None,
        }
    }
}
