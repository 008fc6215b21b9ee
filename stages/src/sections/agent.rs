//! `agent:` (budgets and sampling of every episode) and `prompts:` (template files).

use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, Section};

use super::MAX_TOKENS;
use crate::agent::{
    AgentLimits, DISTILL_PROMPT, JUDGE_PROMPT, PROPOSER_PROMPT, PromptKind, PromptTemplate, SOLVER_PROMPT,
    VERIFIER_PROMPT,
};
use sesa_models::policy::Sampling;

/// Budgets and sampling of every agent episode.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentSection {
    /// Generation turns at most (SSP: 10).
    #[serde(default = "defaults::max_turns")]
    pub max_turns: usize,
    /// New tokens per turn at most.
    #[serde(default = "defaults::max_turn_tokens")]
    pub max_turn_tokens: usize,
    /// Generated tokens per episode at most.
    #[serde(default = "defaults::max_total_tokens")]
    pub max_total_tokens: usize,
    /// Context length (prompt, generated and retrieved tokens) at which an episode stops.
    #[serde(default = "defaults::context_limit")]
    pub context_limit: usize,
    /// Sampling for training rollouts (SSP: temperature 1).
    #[serde(default = "defaults::sampling")]
    pub sampling: Sampling,
}

mod defaults {
    use crate::agent::AgentLimits;
    use sesa_models::policy::Sampling;

    pub fn max_turns() -> usize {
        AgentLimits::default().max_turns
    }
    pub fn max_turn_tokens() -> usize {
        AgentLimits::default().max_turn_tokens
    }
    pub fn max_total_tokens() -> usize {
        AgentLimits::default().max_total_tokens
    }
    pub fn context_limit() -> usize {
        AgentLimits::default().context_limit
    }
    pub fn sampling() -> Sampling {
        Sampling { temperature: 1.0, top_p: 1.0 }
    }
}

impl AgentSection {
    /// The budgets, for the agent loop.
    pub fn limits(&self) -> AgentLimits {
        AgentLimits {
            max_turns: self.max_turns,
            max_turn_tokens: self.max_turn_tokens,
            max_total_tokens: self.max_total_tokens,
            context_limit: self.context_limit,
        }
    }
}

impl Section for AgentSection {
    const KEY: &'static str = "agent";

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        for (key, value, max) in [
            ("max_turns", self.max_turns, 1_000),
            ("max_turn_tokens", self.max_turn_tokens, MAX_TOKENS),
            ("max_total_tokens", self.max_total_tokens, MAX_TOKENS),
            ("context_limit", self.context_limit, MAX_TOKENS),
        ] {
            problems.extend(ConfigProblem::size(key, value, 1..=max));
        }
        if self.max_turn_tokens > self.max_total_tokens {
            problems.push(ConfigProblem::new("max_turn_tokens", "cannot exceed max_total_tokens"));
        }
        if !(0.0..=10.0).contains(&self.sampling.temperature) {
            problems.push(ConfigProblem::new("sampling.temperature", "must be between 0 and 10"));
        }
        if !(self.sampling.top_p > 0.0 && self.sampling.top_p <= 1.0) {
            problems.push(ConfigProblem::new("sampling.top_p", "must be in (0, 1]"));
        }
        problems
    }
}

/// Prompt template files (paths relative to the directory `sesa` runs in).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptsSection {
    /// The solver's template: `{question}`, optional `{skills}`.
    pub solver: PathBuf,
    /// The proposer's template: `{answer}`, `{hops}`.
    #[serde(default)]
    pub proposer: Option<PathBuf>,
    /// The RAG verifier's template: `{materials}`, `{question}`.
    #[serde(default)]
    pub verifier: Option<PathBuf>,
    /// The answer judge's template: `{question}`, `{golden}`, `{answer}`.
    #[serde(default)]
    pub judge: Option<PathBuf>,
    /// The distillation judge's template: `{failures}`, `{max_skills}`.
    #[serde(default)]
    pub distill: Option<PathBuf>,
}

impl Section for PromptsSection {
    const KEY: &'static str = "prompts";

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        let mut check = |key: &str, path: &Path, kind: PromptKind| {
            if let Err(error) = PromptTemplate::load_kind(path, kind) {
                problems.push(ConfigProblem::new(key, error.to_string()));
            }
        };
        check("solver", &self.solver, SOLVER_PROMPT);
        for (key, path, kind) in [
            ("proposer", &self.proposer, PROPOSER_PROMPT),
            ("verifier", &self.verifier, VERIFIER_PROMPT),
            ("judge", &self.judge, JUDGE_PROMPT),
            ("distill", &self.distill, DISTILL_PROMPT),
        ] {
            if let Some(path) = path {
                check(key, path, kind);
            }
        }
        problems
    }
}
