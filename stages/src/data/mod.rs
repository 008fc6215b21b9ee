//! Data the agents are measured on and learn from: question sets, answer metrics, the
//! proposer's target answers, generated worlds.

pub mod datasets;
pub mod metrics;
pub mod targets;
pub mod world;
