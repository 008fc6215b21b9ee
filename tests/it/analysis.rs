//! The Parquet output is the analysis surface: DuckDB reads it with hive partitioning.
//!
//! Needs the Python `duckdb` package (`scripts/test` installs it). Without it the test says so
//! and passes, except under CI (`CI` set), where it fails.

use std::process::Command;

use arrow_array::{Array, UInt64Array};

use crate::support::{only_run, read_tables, run_sesa};

#[test]
fn duckdb_aggregates_over_the_hive_partitions() {
    let has_duckdb = Command::new("python3").args(["-c", "import duckdb"]).status().is_ok_and(|s| s.success());
    if !has_duckdb {
        sesa_engine::testing::skip(
            "duckdb_aggregates_over_the_hive_partitions",
            "no Python duckdb package (python3 -m pip install duckdb)",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("runs");
    let spec = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pipeline.yaml");
    let output = run_sesa(&["run", spec.to_str().unwrap(), "--store", store.to_str().unwrap()], dir.path());
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let run = only_run(&store);
    let query = format!(
        "import duckdb\n\
         rows = duckdb.sql(\"SELECT step, count(*), sum(value) FROM read_parquet('{}/tables/numbers/*/*.parquet', hive_partitioning=true) GROUP BY step ORDER BY step\").fetchall()\n\
         print('\\n'.join(f'{{s}},{{n}},{{t}}' for s, n, t in rows))",
        run.display()
    );
    let output = Command::new("python3").args(["-c", &query]).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let from_duckdb = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let expected: Vec<String> = read_tables(&run)
        .iter()
        .filter(|((table, _), _)| table == "numbers")
        .map(|((_, step), batch)| {
            let values = batch.column_by_name("value").unwrap().as_any().downcast_ref::<UInt64Array>().unwrap();
            format!("{step},{},{}", values.len(), values.values().iter().sum::<u64>())
        })
        .collect();
    assert_eq!(from_duckdb, expected.join("\n"));
}
