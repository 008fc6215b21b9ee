//! The SESA domain: the stage kinds and spec sections of self-evolving search-agent
//! experiments, registered for the `sesa` binary, and the parts they use.
//!
//! - `agent`: the multi-turn search-agent loop (proposer, solver, evaluation).
//! - `models`: the model cache (`sesa model fetch`).
//! - `policy`: language models behind one trait (scripted for tests, OpenAI-compatible servers).
//! - `search`: the agents' search tool (BM25 index, retriever client and server, formatting).
//! - `data`: question sets, answer metrics, generated worlds.
//!
//! Registered so far: the `search:` section. The policy, skill-memory and loop stage kinds land
//! here next.

pub mod agent;
pub mod data;
pub mod models;
pub mod policy;
pub mod search;

use sesa_engine::Registry;

/// The registry of every SESA stage kind and spec section.
pub fn registry() -> Registry {
    let mut registry = Registry::new();
    registry.section::<search::SearchConfig>();
    registry
}
