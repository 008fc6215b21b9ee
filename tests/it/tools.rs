//! The search and world commands as a user runs them: generate a world, index it, query it,
//! serve it.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::{run_sesa, sesa, stdout, write};

#[test]
fn generate_index_and_query_a_world() {
    let dir = tempfile::tempdir().unwrap();
    let output = run_sesa(
        &["world", "generate", "--seed", "3", "--entities", "200", "--questions", "50", "--out", "world"],
        dir.path(),
    );
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    insta::assert_snapshot!(stdout(&output), @"world: 200 passages (corpus.jsonl), 50 questions (questions.jsonl), 46 targets (targets.jsonl)");
    let output = run_sesa(&["index", "build", "world/corpus.jsonl", "--out", "index"], dir.path());
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout(&output).starts_with("index: 200 passages indexed in"), "{}", stdout(&output));

    let questions = std::fs::read_to_string(dir.path().join("world/questions.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(questions.lines().next().unwrap()).unwrap();
    let title = first["supporting_titles"][0].as_str().unwrap();
    let output = run_sesa(&["index", "query", "index", title, "-k", "2"], dir.path());
    assert!(output.status.success());
    let shown = stdout(&output);
    assert!(shown.starts_with(&format!("Doc 1 (Title: \"{title}\")")), "{shown}");
    assert!(shown.contains("Doc 2 (Title: "), "{shown}");

    let output = run_sesa(&["index", "bench", "index", "--questions", "world/questions.jsonl", "-k", "10"], dir.path());
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout(&output).contains("recall@3"), "{}", stdout(&output));

    // The same seed writes the same files.
    let output = run_sesa(
        &["world", "generate", "--seed", "3", "--entities", "200", "--questions", "50", "--out", "again"],
        dir.path(),
    );
    assert!(output.status.success());
    for file in ["corpus.jsonl", "questions.jsonl", "targets.jsonl"] {
        assert_eq!(
            std::fs::read(dir.path().join("world").join(file)).unwrap(),
            std::fs::read(dir.path().join("again").join(file)).unwrap(),
            "{file}"
        );
    }
}

#[test]
fn a_malformed_corpus_line_is_named() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "corpus.jsonl", "{\"id\": \"1\", \"title\": \"A\", \"text\": \"a\"}\n{\"id\": \"2\"\n");
    let output = run_sesa(&["index", "build", "corpus.jsonl", "--out", "index"], dir.path());
    assert_eq!(output.status.code(), Some(1));
    insta::assert_snapshot!(String::from_utf8_lossy(&output.stderr).trim(), @"error: index `index`: corpus.jsonl:2: not a JSON passage: EOF while parsing an object at line 1 column 10");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["corpus.jsonl"], "a failed build leaves nothing behind");
}

#[test]
fn serve_retriever_answers_the_search_r1_api() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "corpus.jsonl",
        "{\"id\": \"1\", \"title\": \"Orla\", \"text\": \"Orla is the capital of Veltria.\"}\n",
    );
    assert!(run_sesa(&["index", "build", "corpus.jsonl", "--out", "index"], dir.path()).status.success());
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut server = sesa(&["serve-retriever", "--index", "index", "--port", &port.to_string()], dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let request = r#"{"queries": ["capital of Veltria"], "topk": 1, "return_scores": true}"#;
    let answer = std::process::Command::new("python3")
        .args(["-c", &format!(
            "import urllib.request, json\nr = urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:{port}/retrieve', data=b'{request}', headers={{'Content-Type': 'application/json'}}))\nbody = json.load(r)\nprint(json.dumps(body['result'][0][0]['document'], sort_keys=True))"
        )])
        .output()
        .unwrap();
    server.kill().unwrap();
    server.wait().unwrap();
    assert!(answer.status.success(), "{}", String::from_utf8_lossy(&answer.stderr));
    insta::assert_snapshot!(String::from_utf8_lossy(&answer.stdout).trim(), @r#"{"contents": "\"Orla\"\nOrla is the capital of Veltria.", "id": "1"}"#);
}
