//! Every spec section of the SESA domain, one file each, all named `*Section`: `model:`,
//! `proposer_model:` and `judge:` (which policy, opened here), `world:` (a generated world, made
//! on first use), `agent:` and `prompts:` (budgets, sampling, template files), `search:` (the
//! agents' search tool), `memory:` (the embedder and the skill bank's rules) and `trainer:`
//! (full fine-tuning or LoRA); and `setup`, the one path from a spec to what an agent episode
//! needs. The choices a key names (`backend:`, `kind:`) are read by the engine's
//! `deserialize_tagged!`. A section is configuration: what it opens lives with its domain
//! (`search`, `memory`, `selfplay::training`).
mod agent;
mod memory;
mod model;
mod search;
mod setup;
#[cfg(test)]
mod tests;
mod trainer;
mod world;

pub use self::agent::{AgentSection, PromptsSection};
pub use self::memory::{EmbedderConfig, HashedWordsConfig, MemorySection, MinilmConfig, RetrieveBy, ShowSkills};
pub use self::model::{JudgeSection, ModelSection, ProposerModelSection, local_model};
pub use self::search::{Backend, Bm25Config, SearchSection, bm25_requirements};
pub use self::setup::{AgentSetup, SetupError};
pub use self::trainer::TrainerSection;
pub use self::world::WorldSection;

/// The most tokens any token budget may name (a turn, a response, a context, a micro-batch):
/// about a million, beyond the context of any model a run serves, so that a typo is refused at
/// validation rather than sized into an allocation.
pub const MAX_TOKENS: u64 = 1 << 20;
