//! The `sesa` command line: flags, printing, exit codes. Everything else lives in
//! `sesa-engine` (generic), `sesa-models` (kernels, policies, the trainer) and `sesa-stages` (the
//! SESA domain).
//!
//! [`run_cli`] takes the registry as an argument so that tests can run the real command line
//! with test-only stage kinds.

mod ask;
mod bench;
mod cli;
mod data;
mod eval;
mod execute;
mod export;
mod logging;
mod preflight;
mod report;
mod skills;
mod support;
mod tables;

pub use cli::{main_with, run_cli};
