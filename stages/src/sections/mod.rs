//! The spec sections of the SESA domain that configure agents, one file each: `model:` and
//! `judge:` (which policy, opened here), `world:` (a generated world, made on first use),
//! `agent:` and `prompts:` (budgets, sampling, template files); and `setup`, the one path from
//! a spec to what an agent episode needs. The choices a key names (`backend:`, `kind:`) are read
//! by the engine's `deserialize_tagged!`. The `search:` section lives with the search backends.

mod agent;
mod model;
mod setup;
#[cfg(test)]
mod tests;
mod world;

pub use self::agent::{AgentSection, PromptsSection};
pub use self::model::{JudgeSection, ModelSection, ProposerModelSection, local_model};
pub use self::setup::{AgentSetup, SetupError};
pub use self::world::WorldSection;

/// The most tokens any token budget may name (a turn, a response, a context, a micro-batch):
/// about a million, beyond the context of any model a run serves, so that a typo is refused at
/// validation rather than sized into an allocation.
pub const MAX_TOKENS: u64 = 1 << 20;
