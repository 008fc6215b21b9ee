//! The spec sections of the SESA domain that configure agents: `model:` (which policy),
//! `agent:` (budgets and sampling) and `prompts:` (template files). The `search:` section lives
//! with the search backends.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, Section};

use crate::agent::{
    AgentLimits, DISTILL_PROMPT, JUDGE_PROMPT, PROPOSER_PROMPT, PromptKind, PromptTemplate, SOLVER_PROMPT,
    VERIFIER_PROMPT,
};
use crate::models;
use crate::policy::{
    CandleConfig, CandlePolicy, MistralRsConfig, MistralRsPolicy, OpenAiConfig, OpenAiPolicy, Policy, PolicyError,
    Sampling,
};

/// The most tokens any token budget may name (a turn, a response, a context, a micro-batch):
/// about a million, beyond the context of any model a run serves, so that a typo is refused at
/// validation rather than sized into an allocation.
pub const MAX_TOKENS: u64 = 1 << 20;

/// The policy: a local model served in process, or an OpenAI-compatible server.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(tag = "backend", rename_all = "snake_case", deny_unknown_fields)]
pub enum ModelSection {
    /// mistral.rs in process (CPU, or CUDA with the `cuda` feature).
    Mistralrs(MistralRsConfig),
    /// sesa's batched CPU forward pass (F32 weights dequantized from the GGUF), continuous
    /// batching, KV caches kept across turns, JSON-Schema-constrained decoding (llama-family
    /// GGUF).
    Candle(CandleConfig),
    /// Any OpenAI-compatible completions server.
    Openai(OpenAiConfig),
}

impl Section for ModelSection {
    const KEY: &'static str = "model";

    fn check(&self) -> Vec<ConfigProblem> {
        match self {
            ModelSection::Mistralrs(config) => {
                let mut problems = Vec::new();
                if config.instances == 0 || config.instances > 64 {
                    problems.push(ConfigProblem::new(
                        "instances",
                        format!("must be between 1 and 64, got {}", config.instances),
                    ));
                }
                problems.extend(check_local_model(&config.model));
                problems
            }
            ModelSection::Candle(config) => check_local_model(&config.model)
                .into_iter()
                .chain(ConfigProblem::size("cache_tokens", config.cache_tokens, 0..=16 * MAX_TOKENS))
                .collect(),
            ModelSection::Openai(config) => {
                let mut problems = Vec::new();
                if !config.base_url.starts_with("http://") && !config.base_url.starts_with("https://") {
                    problems.push(ConfigProblem::new("base_url", "must be an http:// or https:// URL"));
                }
                problems.extend(ConfigProblem::size("max_concurrency", config.max_concurrency, 1..=4_096));
                problems
            }
        }
    }
}

/// A local model must be a file or a name `sesa model fetch` knows.
fn check_local_model(model: &str) -> Option<ConfigProblem> {
    if Path::new(model).exists() || models::KNOWN_MODELS.iter().any(|m| m.name == model) {
        return None;
    }
    let known: Vec<&str> = models::KNOWN_MODELS.iter().map(|m| m.name).collect();
    Some(ConfigProblem::new("model", format!("`{model}` is neither a file nor a known model ({})", known.join(", "))))
}

impl ModelSection {
    /// Builds the policy, fetching a named local model into the cache if it is missing.
    pub async fn open(&self) -> Result<Arc<dyn Policy>, PolicyError> {
        match self {
            ModelSection::Mistralrs(config) => {
                let file = local_gguf(&config.model).await?;
                Ok(Arc::new(MistralRsPolicy::load(&file, config.instances).await?))
            }
            ModelSection::Candle(config) => {
                let file = local_model(&config.model).await?;
                let config = config.clone();
                tokio::task::spawn_blocking(move || CandlePolicy::load(&file, &config))
                    .await
                    .map_err(|e| PolicyError::Backend { name: "candle".into(), message: e.to_string() })?
                    .map(|policy| Arc::new(policy) as Arc<dyn Policy>)
            }
            ModelSection::Openai(config) => Ok(Arc::new(OpenAiPolicy::new(config.clone())?)),
        }
    }
}

/// A Hugging Face directory named in a spec, or else the GGUF file of the local model.
pub async fn local_model(model: &str) -> Result<PathBuf, PolicyError> {
    let path = Path::new(model);
    if path.is_dir() && path.join("config.json").exists() {
        return Ok(path.to_path_buf());
    }
    local_gguf(model).await
}

/// The GGUF file of a local model named in a spec, fetched into the model cache if needed.
async fn local_gguf(model: &str) -> Result<std::path::PathBuf, PolicyError> {
    let error = |message: String| PolicyError::Backend { name: model.to_string(), message };
    let path = models::resolve_or_fetch(model).await.map_err(|e| error(e.to_string()))?;
    gguf_in(&path).map_err(error)
}

/// The judge: answers the RAG check and judges answers when asked, and distils skills. Any
/// policy backend; without this section, the policy judges.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct JudgeSection(pub ModelSection);

impl Section for JudgeSection {
    const KEY: &'static str = "judge";

    fn check(&self) -> Vec<ConfigProblem> {
        self.0.check()
    }
}

/// A generated world (`sesa world generate`), created on first use: the contamination-free
/// corpus, questions and target answers of the quickstart.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorldSection {
    /// Where the world's files go (`corpus.jsonl`, `questions.jsonl`, `targets.jsonl`).
    pub dir: PathBuf,
    /// The world's seed.
    #[serde(default)]
    pub seed: u64,
    /// Entities (and so passages).
    #[serde(default = "default_entities")]
    pub entities: usize,
    /// Benchmark questions to generate.
    #[serde(default = "default_questions")]
    pub questions: usize,
}

fn default_entities() -> usize {
    2000
}

fn default_questions() -> usize {
    500
}

impl Section for WorldSection {
    const KEY: &'static str = "world";

    fn check(&self) -> Vec<ConfigProblem> {
        [
            ConfigProblem::size("entities", self.entities, 10..=10_000_000),
            ConfigProblem::size("questions", self.questions, 1..=10_000_000),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

impl WorldSection {
    /// Generates the world into `dir` unless the one there was generated with the same
    /// parameters and generator version (its `world.json`); a stale or unstamped world is
    /// regenerated, with a warning that says what differed. An index built from its corpus
    /// is rebuilt when next opened (see `Bm25Index::open_or_build`).
    pub fn ensure(&self) -> Result<(), SetupError> {
        use crate::data::world::{GENERATOR_VERSION, World, WorldConfig, WorldStamp};
        let config = WorldConfig { seed: self.seed, entities: self.entities, questions: self.questions };
        let wanted = WorldStamp { generator: GENERATOR_VERSION, config };
        let dir = self.dir.display();
        match WorldStamp::read(&self.dir) {
            Some(stamp) if stamp == wanted => return Ok(()),
            Some(stamp) => {
                tracing::warn!(
                    "the world in {dir} was generated with {}: regenerating it",
                    stamp.differences(&wanted).join(", ")
                )
            }
            None if self.dir.join("corpus.jsonl").exists() => {
                tracing::warn!("the world in {dir} does not record how it was generated (world.json): regenerating it")
            }
            None => {}
        }
        tracing::info!(dir = %dir, seed = self.seed, entities = self.entities, "generating the world");
        let world = World::generate(config);
        world.write(&self.dir).map_err(|e| SetupError::World(format!("{}: {e}", self.dir.display())))?;
        Ok(())
    }
}

/// The GGUF file at `path`, or the only one in the directory `path`.
fn gguf_in(path: &Path) -> Result<PathBuf, String> {
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    let files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    match files.as_slice() {
        [file] => Ok(file.clone()),
        [] => Err(format!("no .gguf file in {}", path.display())),
        _ => Err(format!("several .gguf files in {}; name one", path.display())),
    }
}

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
    use crate::policy::Sampling;

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
        let search = spec.section::<crate::search::SearchConfig>().ok_or(SetupError::MissingSection("search"))?;
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
