//! FlashRAG JSONL and verl Parquet question sets.

use std::path::Path;

use super::*;

#[test]
fn flashrag_jsonl_loads_with_string_or_numeric_ids() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.jsonl");
    std::fs::write(
        &path,
        "{\"id\": \"a\", \"question\": \"Q1?\", \"golden_answers\": [\"x\", \"y\"]}\n{\"id\": 7, \"question\": \"Q2?\", \"golden_answers\": \"z\"}\n",
    )
    .unwrap();
    let questions = load_questions(&path).unwrap();
    assert_eq!(questions[0].golden_answers, ["x", "y"]);
    assert_eq!((questions[1].id.as_str(), questions[1].golden_answers[0].as_str()), ("7", "z"));
}

#[test]
fn a_malformed_line_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.jsonl");
    std::fs::write(
        &path,
        "{\"id\": \"a\", \"question\": \"Q1?\", \"golden_answers\": [\"x\"]}\n{\"id\": \"b\", \"question\": \"Q2?\"}\n",
    )
    .unwrap();
    let error = load_questions(&path).unwrap_err().to_string().replace(&dir.path().display().to_string(), "[DIR]");
    insta::assert_snapshot!(error, @"[DIR]/q.jsonl:2: expected a FlashRAG question {id, question, golden_answers}: missing field `golden_answers` at line 1 column 30");
}

#[test]
fn supporting_relations_must_match_the_supporting_titles() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.jsonl");
    let line = |relations: &str| {
        format!(
            "{{\"question\": \"Q?\", \"golden_answers\": [\"x\"], \"supporting_titles\": [\"A\", \"B\"], \"supporting_relations\": {relations}}}\n"
        )
    };
    std::fs::write(&path, line("[\"mother\", \"country\"]")).unwrap();
    assert_eq!(load_questions(&path).unwrap()[0].supporting_relations, ["mother", "country"]);
    std::fs::write(&path, line("[\"mother\"]")).unwrap();
    let error = load_questions(&path).unwrap_err().to_string().replace(&dir.path().display().to_string(), "[DIR]");
    insta::assert_snapshot!(error, @"[DIR]/q.jsonl:1: `supporting_relations` names 1 relations for 2 `supporting_titles`: give one per title, or none");
}

/// `tests/fixtures/verl_sample.parquet` was written by DuckDB in the layout of Search-R1's
/// `nq_search.py` (see the fixture's README).
#[test]
fn verl_parquet_imports_targets_and_questions() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/verl_sample.parquet");
    let questions = load_questions(&path).unwrap();
    assert_eq!(questions.len(), 2);
    assert_eq!(questions[0].question, "who wrote the silent harbour?");
    assert_eq!(questions[0].golden_answers, ["Ada Brisk", "A. Brisk"]);
    assert_eq!(questions[1].question, "what is the capital of veltria?", "taken from the prompt");
    assert_eq!(questions[1].golden_answers, ["Orla"]);
}

#[test]
fn the_shared_benchmark_packs_load_when_present() {
    for (name, count) in [("hotpotqa", 1100), ("bamboogle", 125)] {
        let Some(pack) = crate::testing::shared_data(name) else { continue };
        let config = DatasetConfig { benchmark: Benchmark::Hotpotqa, path: pack.join("questions.jsonl"), limit: None };
        let questions = config.load().unwrap();
        assert_eq!(questions.len(), count, "{name}");
        assert!(questions.iter().all(|q| !q.golden_answers.is_empty()));
    }
}
