//! Data the agents are measured on: question sets, answer metrics, generated worlds.

pub mod datasets;
pub mod metrics;
pub mod world;
