//! Integration tests of the `sesa` command line and the engine, in one test binary.
//!
//! Modules: `support` (test-only stage kinds and a way to run `sesa` as a child process),
//! `specs` (validation errors, extends, overrides), `graph` (rendered graphs), `runs` (run,
//! resume, SIGKILL crash recovery, Ctrl-C), `s3` (the same on an S3 server), `analysis` (DuckDB over the Parquet output),
//! `schema` (the checked-in JSON Schemas are current), `selfplay` (the SESA loop with a scripted policy),
//! `paper` (the paper specs at toy scale, `sesa report` and the documented DuckDB queries),
//! `tools` (world, index and retriever commands), `training` (a warm start killed and resumed,
//! model export).

mod analysis;
mod graph;
mod paper;
mod runs;
mod s3;
mod schema;
mod selfplay;
mod specs;
mod support;
mod tools;
mod training;

/// Entry point of child `sesa` processes: when `SESA_IT_CHILD_ARGS` is set, this test runs the
/// real command line with the test stage kinds and exits with its code; otherwise it does
/// nothing. See `support::sesa`.
#[test]
fn child_process_entry() {
    if let Ok(args) = std::env::var(support::CHILD_ARGS) {
        let args: Vec<String> = serde_json::from_str(&args).expect("child args are a JSON list");
        let registry = match std::env::var(support::CHILD_REGISTRY).as_deref() {
            Ok("stages") => sesa_stages::registry(),
            _ => support::registry(),
        };
        let code = sesa::run_cli(std::iter::once("sesa".to_string()).chain(args), registry);
        std::process::exit(code.into());
    }
}
