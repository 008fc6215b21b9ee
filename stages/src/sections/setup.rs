//! From a spec to what an agent episode needs: the one set-up path of `run`, `ask` and the
//! benchmarks.

use std::sync::Arc;

use super::{AgentSection, ModelSection, PromptsSection, WorldSection};
use crate::agent::{PROPOSER_PROMPT, PromptTemplate, SOLVER_PROMPT};
use sesa_models::policy::{Policy, PolicyError};

/// Why an agent could not be set up from a spec.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// The spec lacks a section the agent needs.
    #[error("the spec has no `{0}:` section, which running an agent needs")]
    MissingSection(&'static str),
    /// A role whose template the `prompts:` section does not name.
    #[error("the spec's `prompts:` has no `{0}` template")]
    MissingPrompt(&'static str),
    /// The policy could not be opened.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The search backend could not be opened.
    #[error(transparent)]
    Search(#[from] crate::search::SearchError),
    /// A prompt template is invalid.
    #[error(transparent)]
    Prompt(#[from] crate::agent::PromptError),
    /// The skill embedder could not be opened.
    #[error(transparent)]
    Embedder(#[from] crate::memory::EmbedError),
    /// The world could not be generated.
    #[error("generating the world: {0}")]
    World(String),
}

/// Everything an agent episode needs, opened from a spec's `model:`, `search:`, `agent:` and
/// `prompts:` sections.
pub struct AgentSetup {
    /// The policy.
    pub policy: Arc<dyn Policy>,
    /// The search tool.
    pub search: Arc<dyn crate::search::Search>,
    /// Passages per search.
    pub top_k: usize,
    /// Budgets and sampling.
    pub agent: AgentSection,
    /// Template files.
    pub prompts: PromptsSection,
}

impl AgentSetup {
    /// Opens what an agent needs, the same way for `sesa run`, `ask` and the benchmarks:
    /// generates the spec's world and builds its BM25 index if they are missing, opens the
    /// search backend and the policy (fetching a named model if needed).
    pub async fn from_spec(spec: &sesa_engine::spec::Spec) -> Result<AgentSetup, SetupError> {
        let model = spec.section::<ModelSection>().ok_or(SetupError::MissingSection("model"))?;
        let search = spec.section::<super::SearchSection>().ok_or(SetupError::MissingSection("search"))?;
        let agent = spec.section::<AgentSection>().ok_or(SetupError::MissingSection("agent"))?;
        let prompts = spec.section::<PromptsSection>().ok_or(SetupError::MissingSection("prompts"))?;
        if let Some(world) = spec.section::<WorldSection>() {
            world.ensure()?;
        }
        Ok(AgentSetup {
            search: search.open_or_build()?,
            policy: model.open().await?,
            top_k: search.top_k,
            agent: (*agent).clone(),
            prompts: (*prompts).clone(),
        })
    }

    /// The prompt template of `role`.
    pub fn template(&self, role: crate::agent::Role) -> Result<PromptTemplate, SetupError> {
        Ok(match role {
            crate::agent::Role::Solver => PromptTemplate::load_kind(&self.prompts.solver, SOLVER_PROMPT)?,
            crate::agent::Role::Proposer => {
                let path = self.prompts.proposer.as_ref().ok_or(SetupError::MissingPrompt("proposer"))?;
                PromptTemplate::load_kind(path, PROPOSER_PROMPT)?
            }
        })
    }

    /// The agent loop for `role`.
    pub fn agent(&self, role: crate::agent::Role) -> crate::agent::AgentRun<'_> {
        crate::agent::AgentRun {
            role,
            policy: self.policy.as_ref(),
            search: self.search.as_ref(),
            top_k: self.top_k,
            limits: self.agent.limits(),
            sampling: self.agent.sampling,
        }
    }
}
