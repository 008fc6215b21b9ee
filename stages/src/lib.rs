//! The SESA domain: the stage kinds and spec sections of self-evolving search-agent
//! experiments, registered for the `sesa` binary.
//!
//! Nothing is registered yet: the search, policy, skill-memory and loop stages land here one
//! issue at a time (see the README's status section).

use sesa_engine::Registry;

/// The registry of every SESA stage kind and spec section.
pub fn registry() -> Registry {
    Registry::new()
}
