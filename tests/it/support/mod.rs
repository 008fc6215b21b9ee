//! What the tests share: test-only stage kinds, running `sesa` as a child process, and reading
//! a run's tables back.

pub mod stages;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use arrow_array::RecordBatch;
use sesa_engine::Registry;

/// The environment variable that turns the test binary into a `sesa` process.
pub const CHILD_ARGS: &str = "SESA_IT_CHILD_ARGS";

/// The registry of the test stage kinds (never shipped).
pub fn registry() -> Registry {
    let mut registry = Registry::new();
    registry
        .stage::<stages::Numbers>()
        .stage::<stages::Offsets>()
        .stage::<stages::Square>()
        .stage::<stages::Total>()
        .stage::<stages::Fail>()
        .section::<stages::Limits>();
    registry
}

/// The environment variable that picks the child's registry (`stages`: the shipped one).
pub const CHILD_REGISTRY: &str = "SESA_IT_CHILD_REGISTRY";

/// Which stage kinds a child `sesa` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildRegistry {
    /// The test-only stage kinds.
    Test,
    /// The shipped SESA stage kinds.
    Stages,
}

/// A `sesa` command: this test binary re-run as the real command line with test stages.
pub fn sesa(args: &[&str], cwd: &Path) -> Command {
    sesa_with(ChildRegistry::Test, args, cwd)
}

/// A `sesa` command with the stage kinds of `registry`.
pub fn sesa_with(registry: ChildRegistry, args: &[&str], cwd: &Path) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("the test binary has a path"));
    command
        .args(["--exact", "child_process_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD_ARGS, serde_json::to_string(args).unwrap())
        .env(CHILD_REGISTRY, if registry == ChildRegistry::Stages { "stages" } else { "test" })
        .env("RUST_LOG", "warn")
        .current_dir(cwd)
        .stdin(Stdio::null());
    command
}

/// Runs `sesa` to completion and returns its output.
pub fn run_sesa(args: &[&str], cwd: &Path) -> Output {
    sesa(args, cwd).output().expect("the child process starts")
}

/// [`run_sesa`] with the stage kinds of `registry`.
pub fn run_sesa_with(registry: ChildRegistry, args: &[&str], cwd: &Path) -> Output {
    sesa_with(registry, args, cwd).output().expect("the child process starts")
}

/// What the child wrote to stdout, without the test harness's own lines.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout)
        .replace("\nrunning 1 test\n", "")
        .replace("test child_process_entry ... ", "")
        .lines()
        .take_while(|line| !line.starts_with("ok") && !line.starts_with("test result:"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Starts `sesa` in the background, its output discarded.
pub fn spawn_sesa(args: &[&str], cwd: &Path) -> Child {
    spawn_sesa_with(ChildRegistry::Test, args, cwd)
}

/// [`spawn_sesa`] with the stage kinds of `registry`.
pub fn spawn_sesa_with(registry: ChildRegistry, args: &[&str], cwd: &Path) -> Child {
    sesa_with(registry, args, cwd)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the child process starts")
}

/// Writes a shell script at `path` that runs `sesa ARGS... "$1"` (this test binary as the real
/// command line, with the shipped stages): for commands that run a program, such as an
/// external trainer, which gets its manifest's path as `$1`. The arguments, the test binary's
/// path and `$1` must hold no quote or backslash (temporary directories do not).
pub fn sesa_script(path: &Path, args: &[&str]) -> PathBuf {
    let fixed = serde_json::to_string(args).unwrap();
    // In the shell: '["a","b","' then "$1" then '"]': the JSON list with the manifest appended.
    let arguments = format!("'{},\"'\"$1\"'\"]'", fixed.trim_end_matches(']'));
    let binary = std::env::current_exe().expect("the test binary has a path");
    let text = format!(
        "{CHILD_ARGS}={arguments} {CHILD_REGISTRY}=stages RUST_LOG=warn exec '{}' --exact child_process_entry --nocapture --test-threads=1\n",
        binary.display()
    );
    std::fs::write(path, text).unwrap();
    path.to_path_buf()
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// The only run directory under `store`.
pub fn only_run(store: &Path) -> PathBuf {
    let runs: Vec<PathBuf> = std::fs::read_dir(store).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(runs.len(), 1, "expected one run in {}", store.display());
    runs.into_iter().next().unwrap()
}

/// Every published table of a run with one writer per table: (table, step) -> batch.
pub fn read_tables(run: &Path) -> BTreeMap<(String, u64), RecordBatch> {
    let mut tables = BTreeMap::new();
    let root = run.join("tables");
    let Ok(entries) = std::fs::read_dir(&root) else {
        return tables;
    };
    for table in entries {
        let table = table.unwrap();
        let name = table.file_name().to_string_lossy().into_owned();
        for partition in std::fs::read_dir(table.path()).unwrap() {
            let partition = partition.unwrap();
            let partition_name = partition.file_name().to_string_lossy().into_owned();
            let step: u64 = partition_name.strip_prefix("step=").unwrap().parse().unwrap();
            let files: Vec<_> = std::fs::read_dir(partition.path()).unwrap().map(|f| f.unwrap().path()).collect();
            assert_eq!(files.len(), 1, "one writer per table and step in {}", partition.path().display());
            let bytes = bytes::Bytes::from(std::fs::read(&files[0]).unwrap());
            tables.insert((name.clone(), step), sesa_engine::table::decode_parquet(bytes).unwrap());
        }
    }
    tables
}

/// Replaces a temporary directory in `text` with `[DIR]`, for snapshots.
pub fn redact(text: &str, dir: &Path) -> String {
    text.replace(&dir.display().to_string(), "[DIR]")
}
