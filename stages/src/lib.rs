//! The SESA domain: the stage kinds and spec sections of self-evolving search-agent
//! experiments, registered for the `sesa` binary, and the parts they use.
//!
//! The models they run (kernels, weights, the model cache, policies, the trainer) are the
//! `sesa-models` crate's, below this one.
//!
//! - `agent`: the multi-turn search-agent loop (proposer, solver, evaluation).
//! - `memory`: the skill memory (skills, embedder, bank, distillation).
//! - `sections`: every spec section of the domain (`model:`, `search:`, `memory:`, `trainer:`, …).
//! - `search`: the agents' search tool (BM25 index, retriever client and server, formatting).
//! - `data`: question sets, answer metrics, generated worlds.
//! - `selfplay`: the loop's stage kinds and the resources they share.

pub mod agent;
pub mod data;
pub mod memory;
pub mod search;
pub mod sections;
pub mod selfplay;

use sesa_engine::Registry;

/// The registry of every SESA stage kind and spec section.
pub fn registry() -> Registry {
    let mut registry = Registry::new();
    registry
        .section::<sections::ModelSection>()
        .section::<sections::SearchSection>()
        .section::<sections::AgentSection>()
        .section::<sections::PromptsSection>()
        .section::<sections::MemorySection>()
        .section::<sections::JudgeSection>()
        .section::<sections::ProposerModelSection>()
        .section::<sections::WorldSection>()
        .section::<sections::TrainerSection>()
        .stage::<selfplay::Priming>()
        .stage::<selfplay::Propose>()
        .stage::<selfplay::Verify>()
        .stage::<selfplay::Solve>()
        .stage::<selfplay::Reward>()
        .stage::<selfplay::Collect>()
        .stage::<selfplay::Consolidate>()
        .stage::<selfplay::Warmup>()
        .stage::<selfplay::Update>()
        .stage::<selfplay::Evaluate>();
    registry
}

#[cfg(test)]
pub(crate) mod testing {
    //! Test support shared across modules.

    use std::path::PathBuf;

    /// `../shared/data/<name>` (the benchmark packs beside the repository), or `None` after
    /// saying it is absent ([`sesa_engine::testing::skip`]: under CI an absent pack fails).
    pub(crate) fn shared_data(name: &str) -> Option<PathBuf> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data").join(name);
        if path.exists() {
            return Some(path);
        }
        let test = std::thread::current().name().unwrap_or("a test").to_string();
        sesa_engine::testing::skip(&test, &format!("the benchmark pack {} is absent", path.display()));
        None
    }
}
