//! The SESA domain: the stage kinds and spec sections of self-evolving search-agent
//! experiments, registered for the `sesa` binary, and the parts they use.
//!
//! - `search`: the agents' search tool (BM25 index, retriever client and server, formatting).
//! - `data`: question sets, answer metrics, generated worlds.
//!
//! Registered so far: the `search:` section. The policy, skill-memory and loop stage kinds land
//! here next.

pub mod data;
pub mod search;

use sesa_engine::Registry;

/// The registry of every SESA stage kind and spec section.
pub fn registry() -> Registry {
    let mut registry = Registry::new();
    registry.section::<search::SearchConfig>();
    registry
}
