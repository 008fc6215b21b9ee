//! Spec validation as a user meets it: every problem at once, each naming file, line or key.

use std::path::Path;

use sesa_engine::load_pipeline;

use crate::support::{ChildRegistry, redact, registry, run_sesa, run_sesa_with, stdout, write};

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
        "trainer.method={kind: lora, rank: 16, alpha: 32, top_layers: 0}",
        "trainer.update_method={kind: lora, rank: 0, alpha: 32}",
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
        "trainer.method.top_layers: must be at least 1 (leave it out to adapt every block)",
        "trainer.update_method.rank: must be between 1 and 4096, got 0",
    ] {
        assert!(errors.contains(expected), "expected `{expected}` in:\n{errors}");
    }
}

#[test]
fn an_update_method_is_refused_unless_lora_follows_lora() {
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("specs/quickstart.yaml");
    for (method, update_method, expected) in [
        ("{kind: full}", "{kind: lora, rank: 8, alpha: 16}", "needs `method` to be LoRA too"),
        ("{kind: lora, rank: 8, alpha: 16}", "{kind: full}", "only LoRA can follow another method"),
    ] {
        let overrides = [format!("trainer.method={method}"), format!("trainer.update_method={update_method}")];
        let Err(errors) = load_pipeline(&spec, &overrides, &sesa_stages::registry()) else {
            panic!("{update_method} after {method} validated")
        };
        let errors = errors.to_string();
        assert!(errors.contains(&format!("trainer.update_method: {expected}")), "{errors}");
    }
}

/// A port on this host where nothing listens (bound, then released).
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A server that answers every request with `body` as JSON, as a model server's `/v1/models`.
fn serve_json(body: &'static str) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().map_while(Result::ok) {
            let mut request = Vec::new();
            let mut buffer = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buffer[..n]),
                }
            }
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes()));
        }
    });
    port
}

#[test]
fn a_paper_spec_names_every_missing_resource_before_a_run_is_created() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let (closed, served) = (closed_port(), serve_json(r#"{"object": "list", "data": [{"id": "Qwen/Qwen2.5-7B"}]}"#));
    let targets = dir.path().join("targets.jsonl");
    let overrides = [
        format!("model.base_url=http://127.0.0.1:{served}/v1"),
        format!("model.chat_template={{from: {}}}", dir.path().join("qwen3").display()),
        format!("judge.base_url=http://127.0.0.1:{closed}/v1"),
        format!("search.backend.url=http://127.0.0.1:{closed}/retrieve"),
        format!("stages.propose.targets={}", targets.display()),
        format!(
            "stages.update.external={{command: [sh], dir: {}, reload_command: [sh]}}",
            dir.path().join("external").display()
        ),
    ];
    let command = |verb: &str, extra: &[String]| -> Vec<String> {
        let mut args = vec![verb.to_string(), "specs/ablation_no_frontier.yaml".to_string()];
        for set in &overrides {
            args.extend(["--set".to_string(), set.clone()]);
        }
        args.extend(extra.iter().cloned());
        args
    };
    let sesa = |args: &[String]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_sesa_with(ChildRegistry::Stages, &args, repo)
    };
    let stderr = |output: &std::process::Output| {
        redact(&String::from_utf8_lossy(&output.stderr), dir.path())
            .replace(&format!(":{served}/"), ":[SERVED]/")
            .replace(&format!(":{closed}/"), ":[CLOSED]/")
    };

    let output = sesa(&command("validate", &[]));
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    insta::assert_snapshot!(stderr(&output), @"
    error: the spec has 5 problems:
      - --set model.base_url=http://127.0.0.1:[SERVED]/v1: model.base_url: http://127.0.0.1:[SERVED]/v1/models serves `Qwen/Qwen2.5-7B`, not `Qwen/Qwen3-4B`; start an OpenAI-compatible server that serves `Qwen/Qwen3-4B` at http://127.0.0.1:[SERVED]/v1 (vLLM: `vllm serve Qwen/Qwen3-4B`, SGLang: `python -m sglang.launch_server --model-path Qwen/Qwen3-4B`), or set this key to the URL of yours
      - --set model.chat_template={from: [DIR]/qwen3}: model.chat_template.from: `[DIR]/qwen3` does not exist; name the served model's Hugging Face directory, its tokenizer_config.json, its GGUF file, or hf://ORG/REPO
      - --set search.backend.url=http://127.0.0.1:[CLOSED]/retrieve: search.backend.url: nothing answers at http://127.0.0.1:[CLOSED]/retrieve (cannot connect); start a retriever there: Search-R1's `retrieval_server.py` over wiki-18, or `sesa serve-retriever --index DIR` over a BM25 index (`sesa index build`)
      - --set judge.base_url=http://127.0.0.1:[CLOSED]/v1: judge.base_url: nothing answers at http://127.0.0.1:[CLOSED]/v1/models (cannot connect); start an OpenAI-compatible server that serves `judge` at http://127.0.0.1:[CLOSED]/v1 (vLLM: `vllm serve judge`, SGLang: `python -m sglang.launch_server --model-path judge`), or set this key to the URL of yours
      - --set stages.propose.targets=[DIR]/targets.jsonl: stages.propose.targets: `[DIR]/targets.jsonl` does not exist; write it from question sets with `sesa data targets QUESTIONS.jsonl … --out [DIR]/targets.jsonl` (their answers, each with a hop count), or name a generated world's `targets.jsonl` with a `world:` section
    without these servers, on a CPU: `sesa run specs/cpu/ablation_no_frontier.yaml`, this spec at CPU scale
    ");

    // The spec alone is fine.
    assert_eq!(sesa(&command("validate", &["--spec-only".into()])).status.code(), Some(0));

    // `sesa data targets` provides the file; the servers are still missing, and `run` says so
    // before it creates anything.
    let questions = write(
        dir.path(),
        "questions.jsonl",
        concat!(
            r#"{"id": "1", "question": "Capital of France?", "golden_answers": ["Paris"]}"#,
            "\n",
            r#"{"id": "2", "question": "Where is the Louvre?", "golden_answers": ["paris", "Paris, France"]}"#,
            "\n",
            r#"{"id": "3", "question": "Who wrote Hamlet?", "golden_answers": ["William Shakespeare"], "hops": 1}"#,
            "\n",
        ),
    );
    let made = run_sesa_with(
        ChildRegistry::Stages,
        &["data", "targets", questions.to_str().unwrap(), "--out", targets.to_str().unwrap(), "--hops", "3"],
        repo,
    );
    assert_eq!(made.status.code(), Some(0), "{}", String::from_utf8_lossy(&made.stderr));
    assert_eq!(
        redact(&stdout(&made), dir.path()),
        "[DIR]/targets.jsonl: 2 targets from 3 questions (1 repeated answers and 0 without one skipped)"
    );
    let mut lines: Vec<String> = std::fs::read_to_string(&targets).unwrap().lines().map(String::from).collect();
    lines.sort();
    assert_eq!(lines, [r#"{"answer":"Paris","hops":3}"#, r#"{"answer":"William Shakespeare","hops":1}"#]);

    let store = dir.path().join("runs");
    let output = sesa(&command("run", &["--store".into(), store.display().to_string()]));
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let text = stderr(&output);
    assert!(text.contains("the spec has 4 problems"), "{text}");
    assert!(!text.contains("stages.propose.targets"), "{text}");
    assert!(!store.exists(), "no run is created while resources are missing");
}

#[test]
fn what_a_spec_generates_on_first_use_is_not_required_to_exist() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let at = |path: &str| dir.path().join(path).display().to_string();
    let overrides = [
        format!("world.dir={}", at("world")),
        format!("search.backend.index={}", at("world-index")),
        format!("search.backend.corpus={}", at("world/corpus.jsonl")),
        format!("stages.propose.targets={}", at("world/targets.jsonl")),
        format!("stages.verify.fallback_questions={}", at("world/questions.jsonl")),
        format!("stages.warmup.world.questions={}", at("world/questions.jsonl")),
        format!("stages.before.benchmarks.held_out.questions={}", at("world/questions.jsonl")),
        format!("stages.after.benchmarks.held_out.questions={}", at("world/questions.jsonl")),
    ];
    let mut args = vec!["validate", "specs/quickstart.yaml"];
    for set in &overrides {
        args.extend(["--set", set.as_str()]);
    }
    let output = run_sesa_with(ChildRegistry::Stages, &args, repo);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));

    // Without the world, the same files are missing, and each is named.
    let world = "world=null".to_string();
    args.extend(["--set", world.as_str()]);
    let output = run_sesa_with(ChildRegistry::Stages, &args, repo);
    let text = redact(&String::from_utf8_lossy(&output.stderr), dir.path());
    assert_eq!(output.status.code(), Some(2), "{text}");
    for key in [
        "search.backend.corpus",
        "stages.propose.targets",
        "stages.verify.fallback_questions",
        "stages.warmup.world.questions",
        "stages.before.benchmarks.held_out.questions",
    ] {
        assert!(text.contains(&format!("{key}: `[DIR]/world/")), "expected {key} in:\n{text}");
    }
}

/// A stage that reads the policy beside a training stage would record whichever policy version
/// was served when it started; ordered through another stage (propose after warm_start_eval
/// after warmup in `specs/learn.yaml` and `specs/learn_memory.yaml`) it is fine.
#[test]
fn a_policy_reader_unordered_with_a_training_stage_is_refused_before_the_run() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = run_sesa_with(
        ChildRegistry::Stages,
        &["validate", "specs/warmup.yaml", "--set", "stages.after.after=[]"],
        repo,
    );
    let text = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(
        text.contains(
            "stages.after.after: `after` reads the policy that `warmup` trains, and neither runs after the other"
        ),
        "{text}"
    );
    assert_eq!(text.matches("reads the policy").count(), 1, "`before` runs before `warmup`: {text}");
    for spec in ["specs/learn.yaml", "specs/learn_memory.yaml"] {
        let output = run_sesa_with(ChildRegistry::Stages, &["validate", spec], repo);
        assert_eq!(output.status.code(), Some(0), "{spec}: {}", String::from_utf8_lossy(&output.stderr));
    }
}

/// A problem inside a choice's settings (a policy backend, a search backend, an embedder, a
/// reward shape) names the setting, and an unknown choice the ones there are.
#[test]
fn a_bad_setting_inside_a_choice_names_the_key_and_the_choices() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (set, expected) in [
        (
            "model.kv_cache_dtype=f8",
            "specs/quickstart.yaml:20: model: kv_cache_dtype: unknown variant `f8`, expected `f32` or `f16`",
        ),
        (
            "model.cache_tokens=lots",
            "specs/quickstart.yaml:20: model: cache_tokens: invalid type: string \"lots\", expected usize",
        ),
        (
            "model.backend=candel",
            "specs/quickstart.yaml:20: model: backend: unknown variant `candel`, expected one of `mistralrs`, `candle`, `openai`",
        ),
        (
            "search.backend.index=[1]",
            "specs/quickstart.yaml:25: search.backend: index: invalid type: sequence, expected path string",
        ),
        (
            "search.backend.kind=bm26",
            "specs/quickstart.yaml:25: search.backend: kind: unknown variant `bm26`, expected `bm25` or `retriever`",
        ),
        (
            "memory.embedder={kind: hashed_words, dimension: big}",
            // Another kind replaces the quickstart's embedder whole: the setting is the override's.
            "--set memory.embedder={kind: hashed_words, dimension: big}: memory.embedder: dimension: invalid type: string \"big\", expected usize",
        ),
        (
            "stages.reward.proposer.lambda=x",
            "specs/quickstart.yaml:104: stages.reward.proposer: lambda: invalid type: string \"x\", expected f64",
        ),
    ] {
        let output = run_sesa_with(ChildRegistry::Stages, &["validate", "specs/quickstart.yaml", "--set", set], repo);
        let text = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{text}");
        assert!(text.contains(expected), "{set}: {text}");
    }
}

/// A proposer served by a server cannot be trained in process; an external trainer can train it.
#[test]
fn a_proposer_model_that_cannot_be_trained_in_process_is_refused_before_the_run() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let proposer = "proposer_model={backend: openai, base_url: 'http://127.0.0.1:9/v1', model: m}";
    let validate = |update: &str| {
        // The quickstart without its warm start, which would train the proposer in process too.
        let mut args = vec!["validate", "specs/quickstart.yaml", "--set", proposer, "--set", update];
        for set in ["stages.before=null", "stages.warmup=null", "stages.after=null", "stages.propose.after=[priming]"] {
            args.extend(["--set", set]);
        }
        let output = run_sesa_with(ChildRegistry::Stages, &args, repo);
        assert_eq!(output.status.code(), Some(2), "the proposer's server is not there");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let text = validate("stages.update={kind: update, after: [consolidate], optimizer: {lr: 1.0e-6}}");
    assert!(
        text.contains("stages.update: `update` trains `proposer_model:` in process, which needs `backend: candle`"),
        "{text}"
    );
    assert!(!text.contains("trains `model:`"), "the solver's model is served in process: {text}");
    // An external trainer can train it, once something tells its server to reload.
    let external = "stages.update={kind: update, after: [consolidate], optimizer: {lr: 1.0e-6}, external: {command: [sh], dir: ext}}";
    let text = validate(external);
    assert!(!text.contains("in process"), "an external trainer trains both models: {text}");
    assert!(
        text.contains(
            "stages.update.external: nothing tells the server of `proposer_model:` to load the trainer's checkpoints"
        ),
        "{text}"
    );
    let text = validate(&external.replace("dir: ext", "dir: ext, reload_command: [sh]"));
    assert!(
        text.contains("the spec has 1 problem") && text.contains("proposer_model.base_url"),
        "only the missing server: {text}"
    );
}

/// One GPU: mistral.rs serves in process and reloads what an external trainer writes, so that
/// spec validates; trained in process it is refused. A fleet of servers is checked URL by URL.
#[test]
fn mistralrs_with_an_external_trainer_validates_and_a_fleet_is_checked_url_by_url() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let validate = |model: &str, update: &str| {
        let mut args =
            vec!["validate", "specs/quickstart.yaml", "--set", "model=null", "--set", model, "--set", update];
        for set in ["stages.before=null", "stages.warmup=null", "stages.after=null", "stages.propose.after=[priming]"] {
            args.extend(["--set", set]);
        }
        let output = run_sesa_with(ChildRegistry::Stages, &args, repo);
        (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let mistralrs = "model={backend: mistralrs, model: smollm2-135m-instruct}";
    let external = "stages.update={kind: update, after: [consolidate], optimizer: {lr: 1.0e-6}, external: {command: [sh], dir: ext}}";
    let (code, text) = validate(mistralrs, external);
    assert_eq!(code, Some(0), "{text}");
    let (code, text) =
        validate(mistralrs, "stages.update={kind: update, after: [consolidate], optimizer: {lr: 1.0e-6}}");
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("trains `model:` in process, which needs `backend: candle` there"), "{text}");

    let fleet = "model={backend: openai, base_url: ['http://127.0.0.1:9/v1', 'gpu-2:8000/v1'], model: m}";
    let (code, text) = validate(fleet, &external.replace("dir: ext", "dir: ext, reload_command: [sh]"));
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("model.base_url: `gpu-2:8000/v1` must be an http:// or https:// URL"), "{text}");
    let (_, text) = validate(&fleet.replace("'gpu-2:8000/v1'", "'http://127.0.0.1:9/v2'"), external);
    assert!(text.contains("nothing tells the server of `model:` to load the trainer's checkpoints"), "{text}");
    assert!(text.contains("127.0.0.1:9/v1/models") && text.contains("127.0.0.1:9/v2/models"), "each server: {text}");
}

/// An external trainer starts from the initial weights it is configured with: after a warm
/// start in process it would throw the warm start away.
#[test]
fn an_external_update_after_an_in_process_warm_start_is_refused_before_the_run() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let external = "stages.update.external={command: [sh], dir: ext}";
    let args = ["validate", "specs/learn.yaml", "--set", external];
    let output = run_sesa_with(ChildRegistry::Stages, &args, repo);
    let text = String::from_utf8_lossy(&output.stderr);
    // The spec's per-hop proposer baseline is named for what it is.
    assert!(
        text.contains("stages.update.proposer_baseline_per_hops: an external trainer gets the proposer's raw rewards")
    );
    let baseline = "stages.update.proposer_baseline_per_hops=false";
    let output = run_sesa_with(ChildRegistry::Stages, &[&args[..], &["--set", baseline]].concat(), repo);
    assert_eq!(output.status.code(), Some(2));
    let text = String::from_utf8_lossy(&output.stderr);
    assert!(text.contains("stages.update.external: `model:` is also trained in process (`warmup`)"), "{text}");
    assert!(text.contains("sesa model export RUN --version N --out DIR"), "{text}");
    assert!(text.contains("the spec has 1 problem"), "{text}");
}

/// `sesa validate specs/learn.yaml` with each of `sets` as a `--set`.
fn validate_learn(sets: &[&str]) -> std::process::Output {
    let mut args = vec!["validate", "specs/learn.yaml"];
    args.extend(sets.iter().flat_map(|set| ["--set", set]));
    run_sesa_with(ChildRegistry::Stages, &args, Path::new(env!("CARGO_MANIFEST_DIR")))
}

/// Asserts that `specs/learn.yaml` with `sets` is refused (exit 2) with `problem` among its problems.
fn learn_refuses(sets: &[&str], problem: &str) {
    let output = validate_learn(sets);
    let text = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(text.contains(problem), "{text}");
}

/// Asserts that `specs/learn.yaml` with `sets` validates.
fn learn_accepts(sets: &[&str]) {
    let output = validate_learn(sets);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
}

/// The proposer has one baseline: a running mean or the per-hop-count means, not both.
#[test]
fn two_proposer_baselines_are_refused() {
    // `specs/learn.yaml` compares each proposal with those asked for as many hops.
    let running = "stages.update.proposer_baseline={decay: 0.9}";
    learn_refuses(&[running], "stages.update.proposer_baseline_per_hops: the proposer has one baseline");
    learn_accepts(&[running, "stages.update.proposer_baseline_per_hops=false"]);
}

/// `written_weight` is a weight of at most 1 and at least 0, and an external trainer weights
/// written tokens itself.
#[test]
fn a_written_weight_outside_zero_to_one_is_refused() {
    learn_refuses(&["stages.update.written_weight=1.5"], "stages.update.written_weight: must be in [0, 1], got 1.5");
    learn_accepts(&["stages.update.written_weight=0.25"]);
}

/// `excess_search_cost` multiplies a reward by 1 − cost per excess search: 1 or more would zero
/// or flip a correct answer's reward.
#[test]
fn an_excess_search_cost_outside_zero_to_one_is_refused() {
    learn_refuses(&["stages.reward.excess_search_cost=1"], "stages.reward.excess_search_cost: 1 is outside [0, 1)");
    learn_accepts(&["stages.reward.excess_search_cost=0.1"]);
}

/// The per-token credits: `misstep_penalty` is subtracted from advantages (a negative one would
/// reward missteps), `written_sft` added to written tokens' (a negative one would push down the
/// true chain's plan); an external trainer, which gets one advantage per sequence and weights
/// written tokens itself, could apply neither.
#[test]
fn a_negative_token_credit_or_one_with_an_external_trainer_is_refused() {
    for (key, negative, external) in [
        ("misstep_penalty", "-1", "an external trainer gets one advantage per sequence"),
        ("written_sft", "-0.5", "an external trainer weights written tokens itself"),
    ] {
        let key = format!("stages.update.{key}");
        learn_refuses(&[&format!("{key}={negative}")], &format!("{key}: must be a number ≥ 0, got {negative}"));
        learn_refuses(
            &[&format!("{key}=1"), "stages.update.external={command: [sh], dir: ext}"],
            &format!("{key}: {external}"),
        );
        learn_accepts(&[&format!("{key}=1")]);
    }
}

/// `update.replay` trains demonstrations of the roles the update trains, at a positive weight,
/// in process: each refusal names its key; the warm start's own demonstrations are accepted.
#[test]
fn a_replay_the_update_cannot_train_is_refused() {
    let replay = |roles: &str, per_step: usize, weight: f64| {
        format!(
            "stages.update.replay={{world: {{questions: data/world-train/questions.jsonl, max_hops: 2, roles: [{roles}]}}, \
             per_step: {per_step}, weight: {weight}}}"
        )
    };
    learn_accepts(&[&replay("solver", 24, 1.0)]);
    learn_refuses(&[&replay("solver", 24, 0.0)], "stages.update.replay.weight: 0 is no positive weight");
    learn_refuses(&[&replay("solver", 0, 1.0)], "stages.update.replay.per_step:");
    learn_refuses(&[&replay("judge", 24, 1.0)], "stages.update.replay.world.roles: `judge` is neither");
    learn_refuses(&[&replay("", 24, 1.0)], "stages.update.replay.world.roles: name `solver`, `proposer` or both");
    learn_refuses(
        &[&replay("proposer", 24, 1.0), "stages.update.roles=[solver]"],
        "stages.update.replay.world.roles: `proposer` is replayed but not trained",
    );
    learn_refuses(
        &[
            &replay("solver", 24, 1.0),
            "stages.update.external={command: [sh], dir: ext}",
            "stages.update.proposer_baseline_per_hops=false",
        ],
        "stages.update.replay: an external trainer gets the step's trajectories only",
    );
}

/// `guided_groups` and `guided_min_hops` pick the groups `guidance` helps: without guidance they
/// would do nothing.
#[test]
fn guided_groups_and_depths_without_guidance_are_refused() {
    learn_refuses(
        &["stages.solve.guided_groups=all"],
        "stages.solve.guided_groups: `all` chooses the groups `guidance` helps",
    );
    learn_accepts(&["stages.solve.guided_groups=all", "stages.solve.guidance=plan"]);
    learn_accepts(&["stages.solve.guided_groups=all", "stages.solve.guidance=probe"]);
    learn_refuses(
        &["stages.solve.guided_min_hops=3"],
        "stages.solve.guided_min_hops: chooses the questions `guidance` helps",
    );
    learn_accepts(&["stages.solve.guided_min_hops=3", "stages.solve.guidance=plan"]);
}

/// `verify.plan` writes into the verifier's search loop: with the materials in the verifier's
/// prompt there is no response to open with a plan, so it is refused, naming the key.
#[test]
fn a_verifier_plan_without_searching_is_refused() {
    learn_refuses(
        &["stages.verify.plan=true", "stages.verify.reads=prompt"],
        "stages.verify.plan: writes into the verifier's search loop",
    );
    learn_accepts(&["stages.verify.plan=true"]);
}

/// `min_substitutes` draws from `fallback_questions` in place of the reuse pool: without them,
/// or without `invalid: reuse`, it is refused, naming the key.
#[test]
fn min_substitutes_without_fallback_questions_is_refused() {
    let two = "stages.verify.min_substitutes=2";
    learn_refuses(
        &[two, "stages.verify.fallback_questions=null"],
        "stages.verify.min_substitutes: draws from `fallback_questions`",
    );
    // Only `invalid: reuse` replaces proposals with questions; a dummy would ignore the key.
    learn_refuses(
        &[two, "stages.verify.invalid=dummy"],
        "stages.verify.min_substitutes: replaces invalid proposals only with `invalid: reuse`",
    );
    learn_accepts(&[two]);
}

#[test]
fn training_in_process_without_an_in_process_policy_is_refused_before_the_run() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = run_sesa_with(
        ChildRegistry::Stages,
        &[
            "validate",
            "specs/quickstart.yaml",
            "--set",
            "model=null",
            "--set",
            "model={backend: openai, base_url: 'http://127.0.0.1:9/v1', model: m}",
            "--set",
            "stages.update={kind: update, after: [reward], optimizer: {lr: 1.0e-6}}",
        ],
        repo,
    );
    let text = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(
        text.contains("stages.update: `update` trains `model:` in process, which needs `backend: candle` there"),
        "{text}"
    );
}

/// Each CPU variant under `specs/cpu/` is its paper spec in the CPU setting: it differs from
/// `specs/cpu/sesa.yaml` exactly where the paper spec differs from `specs/sesa.yaml` (SSP also
/// never shows skills nor evaluates with them, and evaluates the base policy), and it loads with every
/// stage kind, so a change to a paper ablation reaches its CPU variant.
#[test]
fn cpu_variants_are_the_paper_specs_in_the_cpu_setting() {
    use std::collections::BTreeMap;
    fn flatten(value: &serde_yaml::Value, prefix: &str, out: &mut BTreeMap<String, String>) {
        match value {
            serde_yaml::Value::Mapping(map) => {
                for (key, child) in map {
                    let key = key.as_str().unwrap();
                    flatten(child, &if prefix.is_empty() { key.to_string() } else { format!("{prefix}.{key}") }, out);
                }
            }
            other => {
                out.insert(prefix.to_string(), serde_yaml::to_string(other).unwrap());
            }
        }
    }
    let specs = Path::new(env!("CARGO_MANIFEST_DIR")).join("specs");
    let resolved = |path: &Path| {
        let mut keys = BTreeMap::new();
        flatten(&sesa_engine::spec::SourceDoc::load(path).unwrap().value, "", &mut keys);
        keys
    };
    // The keys whose value differs; a section or stage that only one side has counts once, by
    // its own name, whatever the other spec's CPU setting put inside it.
    let diff = |a: &BTreeMap<String, String>, b: &BTreeMap<String, String>| -> Vec<String> {
        let has = |side: &BTreeMap<String, String>, prefix: &str| {
            side.keys().any(|k| k == prefix || k.starts_with(&format!("{prefix}.")))
        };
        let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
        let differing = keys.into_iter().filter(|k| a.get(*k) != b.get(*k)).map(|k| {
            let parts: Vec<&str> = k.split('.').collect();
            (1..parts.len())
                .map(|n| parts[..n].join("."))
                .find(|prefix| !has(a, prefix) || !has(b, prefix))
                .unwrap_or_else(|| k.clone())
        });
        differing.collect::<std::collections::BTreeSet<String>>().into_iter().collect()
    };
    let (paper, cpu) = (resolved(&specs.join("sesa.yaml")), resolved(&specs.join("cpu/sesa.yaml")));
    let mut variants = 0;
    for entry in std::fs::read_dir(specs.join("cpu")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        load_pipeline(&path, &[], &sesa_stages::registry()).unwrap_or_else(|e| panic!("specs/cpu/{name}: {e}"));
        if name == "sesa.yaml" {
            continue;
        }
        let mut expected = diff(&paper, &resolved(&specs.join(&name)));
        let mut found = diff(&cpu, &resolved(&path));
        if name == "ssp.yaml" {
            // When the solver sees skills, its memory-on evaluation, and SSP's base evaluation:
            // what only the CPU setting has.
            let cpu_only = |k: &String| {
                ["stages.solve.skills_from_step", "stages.eval_on", "stages.eval_base"].contains(&k.as_str())
            };
            expected.retain(|k| !cpu_only(k));
            found.retain(|k| !cpu_only(k));
        }
        assert!(!expected.is_empty(), "{name}: the paper spec does not differ from sesa.yaml");
        assert_eq!(
            found, expected,
            "specs/cpu/{name} differs from specs/cpu/sesa.yaml elsewhere than specs/{name} from specs/sesa.yaml"
        );
        variants += 1;
    }
    assert_eq!(variants, 4);
}
