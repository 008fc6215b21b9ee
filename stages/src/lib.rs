//! The SESA domain: the stage kinds and spec sections of self-evolving search-agent
//! experiments, registered for the `sesa` binary, and the parts they use.
//!
//! - `agent`: the multi-turn search-agent loop (proposer, solver, evaluation).
//! - `memory`: the skill memory (skills, embedder, bank, distillation).
//! - `models`: the model cache (`sesa model fetch`).
//! - `policy`: language models behind one trait (scripted for tests, OpenAI-compatible servers).
//! - `sections`: the `model:`, `agent:` and `prompts:` sections of specs.
//! - `search`: the agents' search tool (BM25 index, retriever client and server, formatting).
//! - `data`: question sets, answer metrics, generated worlds.
//!
//! Registered so far: the `model:`, `search:`, `agent:`, `prompts:` and `memory:` sections. The
//! loop's stage kinds land here next.

pub mod agent;
pub mod data;
pub mod memory;
pub mod models;
pub mod policy;
mod retry;
pub mod search;
pub mod sections;

use sesa_engine::Registry;

/// The registry of every SESA stage kind and spec section.
pub fn registry() -> Registry {
    let mut registry = Registry::new();
    registry
        .section::<sections::ModelSection>()
        .section::<search::SearchConfig>()
        .section::<sections::AgentSection>()
        .section::<sections::PromptsSection>()
        .section::<memory::MemorySection>();
    registry
}
