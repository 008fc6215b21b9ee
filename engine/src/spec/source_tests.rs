//! Tests of the untyped layer: extends chains, merge, null removal, overrides, locations.

use std::path::{Path, PathBuf};

use super::{SourceDoc, locate_key};
use crate::spec::SpecError;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn yaml(doc: &SourceDoc) -> String {
    serde_yaml::to_string(&doc.value).unwrap()
}

#[test]
fn extends_chains_merge_deeply_and_null_removes() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "base.yaml",
        "name: base\nseed: 1\nsteps: 5\nstages:\n  a: {kind: k, rows: 2}\n  b: {kind: k, after: [a]}\n",
    );
    write(dir.path(), "mid.yaml", "extends: base.yaml\nsteps: 7\nstages:\n  a: {rows: 3}\n");
    let leaf = write(dir.path(), "leaf.yaml", "extends: mid.yaml\nname: leaf\nstages:\n  b: null\n");
    let doc = SourceDoc::load(&leaf).unwrap();
    insta::assert_snapshot!(yaml(&doc), @"
    name: leaf
    seed: 1
    steps: 7
    stages:
      a:
        kind: k
        rows: 3
    ");
    assert_eq!(doc.locate("steps").file.unwrap(), dir.path().join("mid.yaml"));
    assert_eq!(doc.locate("stages.a.rows").file.unwrap(), dir.path().join("mid.yaml"));
    assert_eq!(doc.locate("stages.a.kind").file.unwrap(), dir.path().join("base.yaml"));
    assert_eq!(doc.locate("name").file.unwrap(), leaf);
    assert_eq!(doc.root_file(), Some(leaf.as_path()));
}

/// A list of parents merges each file once, parents first, in the order listed: the shared
/// grandparent is not merged again over what the first parent removed.
#[test]
fn extends_a_list_merges_each_file_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "base.yaml", "name: base\nsteps: 5\nstages:\n  a: {kind: k, rows: 2}\n  b: {kind: k}\n");
    write(dir.path(), "ablation.yaml", "extends: base.yaml\nname: ablation\nstages:\n  b: null\n");
    write(dir.path(), "small.yaml", "extends: base.yaml\nsteps: 2\nstages:\n  a: {rows: 1}\n");
    let leaf = write(dir.path(), "leaf.yaml", "extends: [ablation.yaml, small.yaml]\nseed: 3\n");
    let doc = SourceDoc::load(&leaf).unwrap();
    insta::assert_snapshot!(yaml(&doc), @"
    name: ablation
    steps: 2
    stages:
      a:
        kind: k
        rows: 1
    seed: 3
    ");
    assert_eq!(doc.locate("stages.a.rows").file.unwrap(), dir.path().join("small.yaml"));
    assert_eq!(doc.locate("name").file.unwrap(), dir.path().join("ablation.yaml"));

    let bad = write(dir.path(), "bad.yaml", "name: bad\nextends: {file: base.yaml}\n");
    let message = SourceDoc::load(&bad).unwrap_err().to_string();
    assert!(message.contains("bad.yaml:2") && message.contains("or a list of them"), "{message}");
}

#[test]
fn an_extends_cycle_is_reported_with_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", "extends: b.yaml\n");
    write(dir.path(), "b.yaml", "extends: a.yaml\n");
    let error = SourceDoc::load(&dir.path().join("a.yaml")).unwrap_err();
    let SpecError::ExtendsCycle { files } = error else { panic!("expected a cycle, got {error:?}") };
    let names: Vec<_> = files.iter().map(|f| f.file_name().unwrap().to_str().unwrap()).collect();
    assert_eq!(names, ["a.yaml", "b.yaml", "a.yaml"]);
}

#[test]
fn a_missing_parent_is_named_with_the_spec_and_line_that_extend_it() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "leaf.yaml", "name: leaf\nextends: missing.yaml\n");
    let error = SourceDoc::load(&dir.path().join("leaf.yaml")).unwrap_err();
    let message = error.to_string();
    let SpecError::ExtendsMissing { line, looked_for, .. } = error else {
        panic!("expected a missing parent: {error:?}")
    };
    assert_eq!(line, 2);
    assert_eq!(looked_for, dir.path().join("missing.yaml"));
    assert!(
        message.contains("leaf.yaml:2: `extends: missing.yaml`") && message.contains("does not exist"),
        "{message}"
    );
    assert!(!message.contains("cycle"), "{message}");
}

#[test]
fn overrides_are_typed_yaml_and_can_remove() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "s.yaml",
        "steps: 5\nstages:\n  reward: {kind: r, proposer: {lambda: 0.1}}\n  extra: {kind: x}\n",
    );
    let mut doc = SourceDoc::load(&path).unwrap();
    doc.apply_overrides(&[
        "stages.reward.proposer.lambda=0.5".into(),
        "steps=3".into(),
        "stages.extra=null".into(),
        "new.deep.key=[1, 2]".into(),
    ])
    .unwrap();
    insta::assert_snapshot!(yaml(&doc), @"
    steps: 3
    stages:
      reward:
        kind: r
        proposer:
          lambda: 0.5
    new:
      deep:
        key:
        - 1
        - 2
    ");
    let location = doc.locate("stages.reward.proposer.lambda");
    assert_eq!(location.argument.as_deref(), Some("stages.reward.proposer.lambda=0.5"));
}

#[test]
fn a_section_of_another_kind_replaces_the_one_it_overrides_and_the_same_kind_merges() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "s.yaml",
        "trainer: {method: {kind: lora, rank: 16, alpha: 32}}\nsearch: {backend: {kind: bm25, index: i}}\n",
    );
    let mut doc = SourceDoc::load(&path).unwrap();
    doc.apply_overrides(&["trainer.method={kind: full}".into(), "search.backend={kind: bm25, top: 3}".into()]).unwrap();
    insta::assert_snapshot!(yaml(&doc), @"
    trainer:
      method:
        kind: full
    search:
      backend:
        kind: bm25
        index: i
        top: 3
    ");
    assert_eq!(doc.locate("trainer.method.kind").argument.as_deref(), Some("trainer.method={kind: full}"));
    // A null in the replacing section leaves its key out, as it would remove it from the old.
    doc.apply_overrides(&["search.backend={kind: retriever, url: u, index: null}".into()]).unwrap();
    insta::assert_snapshot!(yaml(&doc), @"
    trainer:
      method:
        kind: full
    search:
      backend:
        kind: retriever
        url: u
    ");
}

#[test]
fn malformed_overrides_say_what_is_expected() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "s.yaml", "steps: 5\n");
    let mut doc = SourceDoc::load(&path).unwrap();
    let errors: Vec<String> = ["steps", "a..b=1", "x=[unclosed"]
        .iter()
        .map(|arg| doc.apply_overrides(&[arg.to_string()]).unwrap_err().to_string())
        .collect();
    insta::assert_snapshot!(errors.join("\n"), @"
    --set steps: expected KEY=VALUE, for example `steps=3`
    --set a..b=1: the key must be a dotted path such as `stages.reward.lambda`
    --set x=[unclosed: the value is not valid YAML: did not find expected ',' or ']'
    ");
}

#[test]
fn yaml_syntax_errors_carry_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "bad.yaml", "name: x\nstages:\n  a: {kind: k\n");
    let error = SourceDoc::load(&path).unwrap_err();
    let SpecError::Yaml { line, column, .. } = &error else { panic!("{error:?}") };
    assert_eq!((*line, *column), (Some(4), Some(1)));
}

#[test]
fn keys_are_located_by_indentation() {
    let text = "name: x\n# comment\nstages:\n  solve:\n    kind: solve\n    n: 5\n  reward:\n    kind: r\n    proposer:\n      lambda: 0.5\n";
    assert_eq!(locate_key(text, &["stages", "reward", "proposer", "lambda"]), Some(10));
    assert_eq!(locate_key(text, &["stages", "solve", "n"]), Some(6));
    assert_eq!(locate_key(text, &["stages", "reward", "kind"]), Some(8));
    // A missing leaf points at its deepest existing parent.
    assert_eq!(locate_key(text, &["stages", "solve", "missing"]), Some(4));
    assert_eq!(locate_key(text, &["nothing"]), None);
}
