//! Spec validation as a user meets it: every problem at once, each naming file, line or key.

use std::path::Path;

use sesa_engine::load_pipeline;

use crate::support::{redact, registry, run_sesa, stdout, write};

/// The message `sesa validate` prints for `text`, paths redacted.
fn problems(text: &str) -> String {
    problems_with(text, &[])
}

fn problems_with(text: &str, overrides: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "spec.yaml", text);
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    match load_pipeline(&path, &overrides, &registry()) {
        Ok(_) => "valid".to_string(),
        Err(errors) => redact(&errors.to_string(), dir.path()),
    }
}

const VALID: &str = "name: t\nseed: 1\nsteps: 2\nstages:\n  numbers: {kind: numbers, rows: 3}\n";

#[test]
fn a_valid_spec_passes() {
    assert_eq!(problems(VALID), "valid");
}

#[test]
fn all_problems_are_reported_together() {
    let text = "\
name: ''
seed: -1
steps: 0
colour: blue
stages:
  numbers:
    kind: numbers
    rows: 0
  square:
    kind: square
    after: [numbrs]
  mystery:
    kind: teleport
";
    insta::assert_snapshot!(problems(text), @"
    the spec has 7 problems:
      - [DIR]/spec.yaml:4: colour: unknown key; a spec has: name, description, seed, steps, stages, limits
      - [DIR]/spec.yaml:1: name: expected a non-empty string
      - [DIR]/spec.yaml:2: seed: expected a non-negative integer
      - [DIR]/spec.yaml:3: steps: expected an integer between 1 and 10000000
      - [DIR]/spec.yaml:8: stages.numbers.rows: must be at least 1, got 0
      - [DIR]/spec.yaml:13: stages.mystery.kind: unknown stage kind `teleport`; known kinds: fail, numbers, offsets, square, total
      - [DIR]/spec.yaml:11: stages.square.after: no stage named `numbrs` in this spec; stages: numbers, square, mystery
    ");
}

#[test]
fn type_errors_name_the_dotted_key_and_line() {
    let text = "name: t\nseed: 1\nsteps: 2\nlimits:\n  max_value: lots\nstages:\n  numbers:\n    kind: numbers\n    rows: 3\n    delay_ms: soon\n";
    insta::assert_snapshot!(problems(text), @r#"
    the spec has 2 problems:
      - [DIR]/spec.yaml:5: limits.max_value: invalid type: string "lots", expected u64
      - [DIR]/spec.yaml:10: stages.numbers.delay_ms: invalid type: string "soon", expected u64
    "#);
}

#[test]
fn unknown_keys_in_a_stage_are_rejected() {
    let text = "name: t\nseed: 1\nsteps: 2\nstages:\n  numbers:\n    kind: numbers\n    rows: 3\n    rowz: 4\n";
    insta::assert_snapshot!(problems(text), @"
    the spec has 1 problem:
      - [DIR]/spec.yaml:8: stages.numbers.rowz: unknown field `rowz`, expected one of `rows`, `delay_ms`, `keep_every`
    ");
}

#[test]
fn section_range_checks_name_the_key() {
    let text = "name: t\nseed: 1\nsteps: 2\nlimits: {max_value: 0}\nstages:\n  numbers: {kind: numbers, rows: 3}\n";
    insta::assert_snapshot!(problems(text), @"
    the spec has 1 problem:
      - [DIR]/spec.yaml:4: limits.max_value: must be at least 1
    ");
}

#[test]
fn cycles_name_the_stages_on_them() {
    let text = "\
name: t
seed: 1
steps: 2
stages:
  numbers: {kind: numbers, rows: 3, after: [total]}
  offsets: {kind: offsets}
  square: {kind: square, after: [numbers, offsets]}
  total: {kind: total, after: [square]}
";
    insta::assert_snapshot!(problems(text), @"
    the spec has 1 problem:
      - the stages form a cycle through `after:`: numbers -> square -> total -> numbers
    ");
}

#[test]
fn an_input_without_an_upstream_writer_is_an_error() {
    let text = "\
name: t
seed: 1
steps: 2
stages:
  numbers: {kind: numbers, rows: 3}
  square: {kind: square, after: [numbers]}
";
    insta::assert_snapshot!(problems(text), @"
    the spec has 1 problem:
      - [DIR]/spec.yaml:6: stages.square: reads table `offsets`, but no stage in this spec writes it
    ");
    let text = "\
name: t
seed: 1
steps: 2
stages:
  numbers: {kind: numbers, rows: 3}
  offsets: {kind: offsets}
  square: {kind: square, after: [numbers]}
";
    insta::assert_snapshot!(problems(text), @"
    the spec has 1 problem:
      - [DIR]/spec.yaml:7: stages.square: reads table `offsets`, but its writer `offsets` is not upstream of it; add `offsets` to `stages.square.after`
    ");
}

#[test]
fn several_writers_may_append_to_a_table_no_stage_reads() {
    let text = "\
name: t
seed: 1
steps: 1
stages:
  small: {kind: numbers, rows: 2}
  large: {kind: numbers, rows: 3}
";
    assert_eq!(problems(text), "valid");
    let dir = tempfile::tempdir().unwrap();
    let spec = write(dir.path(), "spec.yaml", text);
    let output = run_sesa(&["run", spec.to_str().unwrap(), "--store", "runs"], dir.path());
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let run = crate::support::only_run(&dir.path().join("runs"));
    let mut files: Vec<String> = std::fs::read_dir(run.join("tables/numbers/step=1"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, ["large.parquet", "small.parquet"]);

    let text =
        format!("{text}  offsets: {{kind: offsets}}\n  square: {{kind: square, after: [small, large, offsets]}}\n");
    insta::assert_snapshot!(problems(&text), @"
    the spec has 1 problem:
      - [DIR]/spec.yaml:8: stages.square: reads table `numbers`, which several stages write (small, large); only a table with one writer can be read
    ");
}

#[test]
fn stage_names_must_be_usable_as_file_names() {
    let text = "name: t\nseed: 1\nsteps: 1\nstages:\n  a/b: {kind: numbers, rows: 2}\n";
    insta::assert_snapshot!(problems(text), @"
    the spec has 1 problem:
      - [DIR]/spec.yaml:5: stages.a/b: stage names may only use letters, digits, `_` and `-`
    ");
}

#[test]
fn bad_schedules_say_what_is_allowed() {
    let text = "name: t\nseed: 1\nsteps: 2\nstages:\n  numbers: {kind: numbers, rows: 3, schedule: {every: 0}}\n";
    insta::assert_snapshot!(problems(text), @"
    the spec has 1 problem:
      - [DIR]/spec.yaml:5: stages.numbers.schedule: expected `every_step`, `once`, `at_end` or `{every: k}` with k >= 1
    ");
}

#[test]
fn yaml_syntax_errors_give_line_and_column() {
    insta::assert_snapshot!(problems("name: t\nstages:\n  numbers: {kind: numbers\n"), @"
    the spec has 1 problem:
      - [DIR]/spec.yaml:4:1: invalid YAML: did not find expected ',' or '}'
    ");
}

#[test]
fn overrides_are_validated_like_the_file() {
    assert_eq!(problems_with(VALID, &["steps=5", "stages.numbers.rows=10"]), "valid");
    insta::assert_snapshot!(problems_with(VALID, &["steps=many", "stages.numbers.rows=-3"]), @"
    the spec has 2 problems:
      - --set steps=many: steps: expected an integer between 1 and 10000000
      - --set stages.numbers.rows=-3: stages.numbers.rows: invalid value: integer `-3`, expected u64
    ");
}

#[test]
fn an_ablation_drops_a_stage_in_one_line() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let pipeline = load_pipeline(&fixtures.join("no_total.yaml"), &[], &registry()).unwrap();
    let names: Vec<&str> = pipeline.spec().stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["offsets", "numbers", "square"]);
    assert_eq!(pipeline.spec().name, "no total");
    assert_eq!(pipeline.spec().steps, 6);
}

#[test]
fn sesa_validate_exits_2_and_prints_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "bad.yaml", "name: t\nseed: 1\nsteps: 0\nstages:\n  x: {kind: nope}\n");
    let output = run_sesa(&["validate", "bad.yaml"], dir.path());
    assert_eq!(output.status.code(), Some(2));
    insta::assert_snapshot!(String::from_utf8_lossy(&output.stderr), @"
    error: the spec has 2 problems:
      - bad.yaml:3: steps: expected an integer between 1 and 10000000
      - bad.yaml:5: stages.x.kind: unknown stage kind `nope`; known kinds: fail, numbers, offsets, square, total
    ");
    write(dir.path(), "good.yaml", VALID);
    let output = run_sesa(&["validate", "good.yaml"], dir.path());
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    insta::assert_snapshot!(stdout(&output), @"good.yaml: ok: `t`, 2 steps, 1 stages");
}

#[test]
fn absurd_sizes_are_refused_with_their_bounds_before_anything_is_allocated() {
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("specs/quickstart.yaml");
    let overrides: Vec<String> = [
        "stages.solve.n_rollouts=4000000000",
        "stages.propose.batch=0",
        "agent.context_limit=99999999999",
        "world.entities=5",
        "memory.capacity=18446744073709551615",
    ]
    .map(String::from)
    .to_vec();
    let Err(errors) = load_pipeline(&spec, &overrides, &sesa_stages::registry()) else {
        panic!("absurd sizes validated")
    };
    let errors = errors.to_string();
    for expected in [
        "stages.solve.n_rollouts: must be between 1 and 4096, got 4000000000",
        "stages.propose.batch: must be between 1 and 100000, got 0",
        "agent.context_limit: must be between 1 and 1048576, got 99999999999",
        "world.entities: must be between 10 and 10000000, got 5",
        "memory.capacity: must be between 1 and 1000000, got 18446744073709551615",
    ] {
        assert!(errors.contains(expected), "expected `{expected}` in:\n{errors}");
    }
}
