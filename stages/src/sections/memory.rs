//! The `memory:` section of a spec: the embedder and the bank's rules.

use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, Section};

use crate::memory::{BankConfig, CachedEmbedder, DedupBy, EmbedError, HashedWords, MiniLm, UsageRule};
use sesa_engine::deserialize_tagged;
use sesa_models::cache;

/// Which sentence embedder retrieves and deduplicates skills.
#[derive(Debug, Clone, PartialEq, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum EmbedderConfig {
    /// A BERT sentence encoder with mean pooling (all-MiniLM-L6-v2 by default).
    Minilm(MinilmConfig),
    /// A test double (hashed bag of words), not a semantic model: for fast tests only.
    HashedWords(HashedWordsConfig),
}

deserialize_tagged!(EmbedderConfig, "kind", {
    "minilm" => Minilm(settings),
    "hashed_words" => HashedWords(settings),
});

/// A BERT sentence encoder.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MinilmConfig {
    /// A known model name (`sesa model list`) or a directory with `model.safetensors`,
    /// `config.json` and `tokenizer.json`.
    #[serde(default = "default_embedder_model")]
    pub model: String,
}

/// The hashed bag of words.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HashedWordsConfig {
    /// Vector size.
    pub dimension: usize,
}

fn default_embedder_model() -> String {
    "all-minilm-l6-v2".into()
}

impl Default for EmbedderConfig {
    fn default() -> Self {
        EmbedderConfig::Minilm(MinilmConfig { model: default_embedder_model() })
    }
}

/// The skill memory: embedder, retrieval and the bank's rules (the paper's: top-3 skills, dedup by cosine similarity, capacity with eviction).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemorySection {
    /// The embedder.
    #[serde(default)]
    pub embedder: EmbedderConfig,
    /// Under `dedup_by: embedding`, a candidate is a duplicate when its cosine to some skill is
    /// above this. The paper's 0.93 is for E5; 0.8 is measured for all-MiniLM-L6-v2 (README,
    /// "Skill memory").
    #[serde(default = "defaults::dedup_threshold")]
    pub dedup_threshold: f32,
    /// What makes a candidate a duplicate: `embedding` (the default, the paper's way: cosine
    /// above `dedup_threshold`) or `trigger` (the same trigger, exactly: one skill per question
    /// pattern, for `distiller: rules`, whose patterns differ only in relation words and so sit
    /// close together in embedding space).
    #[serde(default)]
    pub dedup_by: DedupBy,
    /// Skills at most (paper: 800).
    #[serde(default = "defaults::capacity")]
    pub capacity: usize,
    /// Skills in the solver's prompt (paper: 3).
    #[serde(default = "defaults::top_k")]
    pub top_k: usize,
    /// A skill is shown only when its cosine to the question is at least this; a question
    /// whose top-k all fall below it is solved with no skill, and its rollouts record none.
    /// Unset (the paper's way), the top-k are always shown: irrelevant skills hurt a small
    /// solver most.
    #[serde(default)]
    pub min_similarity: Option<f32>,
    /// What a question is compared with: `question` (the paper's way: the question with each
    /// skill's description and trigger) or `pattern` (the question with its named entities
    /// masked, with each skill's trigger alone: a rule-based skill's trigger is such a pattern,
    /// so a question meets the skills of its own template; made-up names otherwise dominate a
    /// question's embedding).
    #[serde(default)]
    pub retrieve_by: RetrieveBy,
    /// How skills reach the solver: `prompt` (the paper's way: the top-k in the skills block of
    /// its prompt) or `plan` (the bank's rule-induced skills read as question templates; the
    /// chain they compose for the question is written as the solver's first thought, the plan
    /// its demonstrations open with, and the step to each next relation into its later
    /// thoughts; a question no template covers is solved with none; `top_k`,
    /// `min_similarity` and `retrieve_by` do not apply).
    #[serde(default)]
    pub show: ShowSkills,
    /// Retrievals before a harmful skill can be evicted (paper: 3).
    #[serde(default = "defaults::evict_min_retrievals")]
    pub evict_min_retrievals: u64,
    /// How usage is credited to skills.
    #[serde(default)]
    pub usage: UsageRule,
    /// Failures waiting for consolidation at most; the oldest are dropped (paper: 300).
    #[serde(default = "defaults::queue_capacity")]
    pub queue_capacity: usize,
}

mod defaults {
    pub fn dedup_threshold() -> f32 {
        0.8
    }
    pub fn capacity() -> usize {
        800
    }
    pub fn top_k() -> usize {
        3
    }
    pub fn evict_min_retrievals() -> u64 {
        3
    }
    pub fn queue_capacity() -> usize {
        300
    }
}

/// What retrieval compares a question with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RetrieveBy {
    /// The question, with each skill's description and trigger.
    #[default]
    Question,
    /// The question's pattern (named entities masked), with each skill's trigger.
    Pattern,
}

/// How a retrieved skill reaches the solver.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ShowSkills {
    /// In the skills block of the solver's prompt.
    #[default]
    Prompt,
    /// Written into the solver's response as the plan of the chain the skills' templates
    /// compose for the question, as plan guidance writes one: a small solver follows a plan it
    /// is given far more often than a strategy it reads.
    Plan,
}

impl Section for MemorySection {
    const KEY: &'static str = "memory";

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        if !(-1.0..=1.0).contains(&self.dedup_threshold) {
            problems.push(ConfigProblem::new("dedup_threshold", "a cosine similarity, between -1 and 1"));
        }
        if self.min_similarity.is_some_and(|m| !(-1.0..=1.0).contains(&m)) {
            problems.push(ConfigProblem::new("min_similarity", "a cosine similarity, between -1 and 1"));
        }
        problems.extend(ConfigProblem::size("capacity", self.capacity, 1..=1_000_000));
        problems.extend(ConfigProblem::size("top_k", self.top_k, 1..=100));
        problems.extend(ConfigProblem::size("queue_capacity", self.queue_capacity, 0..=10_000_000));
        if let EmbedderConfig::HashedWords(HashedWordsConfig { dimension }) = self.embedder {
            problems.extend(ConfigProblem::size("embedder.dimension", dimension, 1..=65_536));
        }
        if let EmbedderConfig::Minilm(MinilmConfig { model }) = &self.embedder
            && !std::path::Path::new(model).exists()
            && !cache::KNOWN_MODELS.iter().any(|m| m.name == model)
        {
            problems.push(ConfigProblem::new(
                "embedder.model",
                format!("`{model}` is neither a directory nor a known model (see `sesa model list`)"),
            ));
        }
        problems
    }
}

impl MemorySection {
    /// The dedup threshold a spec gets when it names none.
    pub fn default_dedup_threshold() -> f32 {
        defaults::dedup_threshold()
    }

    /// The bank's rules with every default.
    pub fn default_bank_config() -> BankConfig {
        BankConfig {
            capacity: defaults::capacity(),
            dedup_by: DedupBy::default(),
            dedup_threshold: defaults::dedup_threshold(),
            evict_min_retrievals: defaults::evict_min_retrievals(),
            usage: UsageRule::default(),
        }
    }

    /// The bank's rules.
    pub fn bank_config(&self) -> BankConfig {
        BankConfig {
            capacity: self.capacity,
            dedup_by: self.dedup_by,
            dedup_threshold: self.dedup_threshold,
            evict_min_retrievals: self.evict_min_retrievals,
            usage: self.usage,
        }
    }

    /// Opens the embedder, fetching a named model it lacks.
    pub async fn open_embedder(&self) -> Result<CachedEmbedder, EmbedError> {
        Ok(CachedEmbedder::new(match &self.embedder {
            EmbedderConfig::Minilm(MinilmConfig { model }) => {
                let directory = cache::resolve_or_fetch(model)
                    .await
                    .map_err(|e| EmbedError { name: model.clone(), message: e.to_string() })?;
                Box::new(
                    tokio::task::spawn_blocking(move || MiniLm::load(&directory))
                        .await
                        .map_err(|e| EmbedError { name: model.clone(), message: e.to_string() })??,
                )
            }
            EmbedderConfig::HashedWords(HashedWordsConfig { dimension }) => Box::new(HashedWords::new(*dimension)),
        }))
    }
}
