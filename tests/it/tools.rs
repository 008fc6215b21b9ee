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

/// What a stand-in server saw: each request's path and `authorization` header.
type SeenRequests = std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>;

/// A stand-in for the Hugging Face Hub's file API (`GET /ORG/REPO/resolve/REVISION/FILE`, with
/// byte ranges, the commit and etag headers hf-hub reads); records each request's path and
/// `authorization` header.
fn serve_hub(files: Vec<(&'static str, Vec<u8>)>) -> (u16, SeenRequests) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request = String::new();
            if reader.read_line(&mut request).is_err() {
                continue;
            }
            let path = request.split_whitespace().nth(1).unwrap_or_default().to_string();
            let (mut range, mut authorization) = (None, String::new());
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
                    break;
                }
                let (name, value) = line.split_once(':').unwrap_or_default();
                match name.to_ascii_lowercase().as_str() {
                    "range" => range = value.trim().strip_prefix("bytes=").map(str::to_string),
                    "authorization" => authorization = value.trim().to_string(),
                    _ => {}
                }
            }
            log.lock().unwrap().push((path.clone(), authorization));
            let found = files.iter().find(|(name, _)| path == format!("/org/tiny/resolve/main/{name}"));
            let mut stream = stream;
            let Some((_, body)) = found else {
                let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                continue;
            };
            let (start, end) = match range.as_deref().and_then(|r| r.split_once('-')) {
                Some((a, b)) => (a.parse::<usize>().unwrap(), b.parse::<usize>().unwrap().min(body.len() - 1)),
                None => (0, body.len() - 1),
            };
            let etag: String = body.iter().map(|b| format!("{b:02x}")).take(16).collect();
            let head = format!(
                "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {start}-{end}/{}\r\n\
                 ETag: \"{etag}{}\"\r\nX-Repo-Commit: {}\r\nConnection: close\r\n\r\n",
                end + 1 - start,
                body.len(),
                body.len(),
                "c".repeat(40)
            );
            let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(&body[start..=end]));
        }
    });
    (port, seen)
}

#[test]
fn hf_references_fetch_a_file_or_a_model_directory_through_the_hub_api() {
    let dir = tempfile::tempdir().unwrap();
    let gguf: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
    let files = vec![
        ("model-Q8_0.gguf", gguf.clone()),
        ("config.json", b"{\"model_type\": \"llama\"}".to_vec()),
        ("model.safetensors", vec![7; 300]),
        ("tokenizer.json", b"{}".to_vec()),
    ];
    let (port, seen) = serve_hub(files);
    let fetch = |reference: &str| {
        crate::support::sesa(&["model", "fetch", reference], dir.path())
            .env("SESA_HOME", dir.path().join("home"))
            .env("HF_ENDPOINT", format!("http://127.0.0.1:{port}"))
            .env("HF_TOKEN", "hf_test_token")
            .output()
            .unwrap()
    };

    let output = fetch("hf://org/tiny/model-Q8_0.gguf");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let file = std::path::PathBuf::from(stdout(&output).trim());
    assert!(file.starts_with(dir.path().join("home/models/huggingface")), "{}", file.display());
    assert_eq!(std::fs::read(&file).unwrap(), gguf);
    assert!(seen.lock().unwrap().iter().all(|(_, auth)| auth == "Bearer hf_test_token"), "{:?}", seen.lock().unwrap());

    // A repository without a file is a model directory; `tokenizer_config.json` may be absent.
    let output = fetch("hf://org/tiny");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let directory = std::path::PathBuf::from(stdout(&output).trim());
    for name in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(directory.join(name).exists(), "{name} in {}", directory.display());
    }

    // A second fetch is served from the cache; a missing file is an error that names it.
    let requests = seen.lock().unwrap().len();
    assert!(fetch("hf://org/tiny/model-Q8_0.gguf").status.success());
    assert_eq!(seen.lock().unwrap().len(), requests, "the cached file was fetched again");
    let output = fetch("hf://org/tiny/missing.gguf");
    assert_eq!(output.status.code(), Some(1));
    let text = String::from_utf8_lossy(&output.stderr);
    assert!(text.contains("fetching `hf://org/tiny/missing.gguf`: missing.gguf:"), "{text}");
}
