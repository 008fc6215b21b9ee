//! The paper's matrix at toy scale: the shipped `ssp`, `sesa` and three ablation specs, with
//! small overrides, run with the scripted policy on a small generated world, evaluated at their
//! last step (base, memory off, memory on) and reported by `sesa report`. Checks that each
//! ablation's artifacts show its intended difference, fixes the report's structure with a
//! snapshot, and runs every SQL query of `docs/analysis.md` and the README on these artifacts
//! with DuckDB, so the documents cannot rot.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use arrow_array::{Array, Float64Array, RecordBatch, StringArray};
use sesa_engine::{ArtifactStore, Progress, ProgressMode, Run, RunOutcome, StopRequest, load_pipeline, read_table};

use crate::selfplay::{external_trainer, resources, world};
use crate::support::run_sesa;

/// The five runs, in one store.
struct Matrix {
    _dir: tempfile::TempDir,
    store: PathBuf,
    /// Spec file → run directory.
    runs: BTreeMap<&'static str, PathBuf>,
}

const SPECS: [&str; 5] =
    ["ssp.yaml", "sesa.yaml", "ablation_no_priming.yaml", "ablation_no_frontier.yaml", "ablation_no_distillation.yaml"];

/// Toy-scale overrides of a paper spec: three steps of four proposals, distillation every
/// second step with skills from step 2, updates by a stand-in external trainer (the scripted
/// policy does not learn, but every update is a policy version), and evaluations at the last
/// step, after its update (a stage beside `update` would see whichever version was served when
/// it ran).
fn overrides(spec: &str, questions: &Path, trainer: &Path, batches: &Path) -> Vec<String> {
    let benchmark = format!("{{codes: {{questions: {}}}}}", questions.display());
    let evaluate = |mode: &str| {
        format!("{{kind: evaluate, after: [update], schedule: at_end, mode: {mode}, benchmarks: {benchmark}}}")
    };
    let mut set = vec![
        "steps=3".to_string(),
        format!("stages.propose.targets={}", world().join("world/targets.jsonl").display()),
        "stages.propose.batch=4".into(),
        "stages.propose.rules={min_words: 4, min_searches: 1}".into(),
        "stages.solve.n_rollouts=3".into(),
        format!(
            "stages.update.external={{command: [sh, {}], dir: {}, timeout_s: 60}}",
            trainer.display(),
            batches.join(spec).display()
        ),
        // The stand-in trainer's weights go nowhere: no server to reload.
        "stages.update.external.reload_command=null".into(),
        format!("stages.eval_base={}", evaluate("base")),
        format!("stages.eval_off={}", evaluate("memory_off")),
    ];
    if spec != "ssp.yaml" {
        set.push("stages.solve.skills_from_step=2".into());
        set.push(format!("stages.eval_on={}", evaluate("memory_on")));
    }
    if spec != "ssp.yaml" && spec != "ablation_no_distillation.yaml" {
        set.push("stages.consolidate.schedule={every: 2}".into());
        set.push("stages.consolidate.min_failures=1".into());
    }
    set
}

fn matrix() -> &'static Matrix {
    static MATRIX: OnceLock<Matrix> = OnceLock::new();
    MATRIX.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("runs");
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        // Questions in the scripted solver's code-word form (see `selfplay::script`): it answers
        // CODE- questions, and SECRET- ones only with skills in its prompt.
        let questions = dir.path().join("codes.jsonl");
        let targets = std::fs::read_to_string(world().join("world/targets.jsonl")).unwrap();
        let lines: Vec<String> = targets
            .lines()
            .take(6)
            .enumerate()
            .map(|(i, line)| {
                let target: serde_json::Value = serde_json::from_str(line).unwrap();
                let answer = target["answer"].as_str().unwrap();
                let code = answer.chars().rev().collect::<String>().replace(' ', "_");
                let word = if i % 2 == 0 { "CODE" } else { "SECRET" };
                let question = format!("Which entity hides behind the word {word}-{code} here?");
                serde_json::json!({"id": format!("q{i}"), "question": question, "golden_answers": [answer]}).to_string()
            })
            .collect();
        std::fs::write(&questions, lines.join("\n") + "\n").unwrap();
        let (trainer, mode) = external_trainer(dir.path());
        std::fs::write(mode, "ok").unwrap();
        let runs = runtime.block_on(async {
            let root = ArtifactStore::open(store.to_str().unwrap()).unwrap();
            let mut runs = BTreeMap::new();
            for spec in SPECS {
                let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("specs").join(spec);
                let pipeline = load_pipeline(
                    &path,
                    &overrides(spec, &questions, &trainer, &dir.path().join("batches")),
                    &sesa_stages::registry(),
                )
                .unwrap_or_else(|e| panic!("{spec}: {e}"));
                let mut run = Run::create(&root, pipeline, "test").await.unwrap();
                let mut scripted = resources(world(), Arc::new(Mutex::new(Vec::new())));
                if spec == "ssp.yaml" {
                    scripted = scripted.without_memory();
                }
                run = run.with_resources(|r| scripted.install(r));
                let (_stop, stop) = tokio::sync::watch::channel(StopRequest::None);
                let outcome = run.execute(&Progress::new(ProgressMode::Hidden), stop).await;
                assert_eq!(outcome.unwrap_or_else(|e| panic!("{spec}: {e}")), RunOutcome::Completed, "{spec}");
                runs.insert(spec, store.join(run.id()));
            }
            runs
        });
        Matrix { _dir: dir, store, runs }
    })
}

async fn table(run: &Path, name: &str) -> Vec<(u64, RecordBatch)> {
    let root = ArtifactStore::open(run.parent().unwrap().to_str().unwrap()).unwrap();
    read_table(&root, run.file_name().unwrap().to_str().unwrap(), name).await.unwrap()
}

fn column<'a, T: 'static>(batch: &'a RecordBatch, name: &str) -> &'a T {
    batch.column_by_name(name).unwrap_or_else(|| panic!("no column {name}")).as_any().downcast_ref::<T>().unwrap()
}

#[test]
fn each_ablation_shows_its_difference_in_the_artifacts() {
    let matrix = matrix();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    runtime.block_on(async {
        let events = |spec: &'static str| async move {
            let mut by_stage: Vec<(String, String)> = Vec::new();
            for (_, batch) in table(&matrix.runs[spec], "skill_events").await {
                let events = column::<StringArray>(&batch, "event");
                let stages = batch.column_by_name("stage").map(|c| c.as_any().downcast_ref::<StringArray>().unwrap());
                for i in 0..batch.num_rows() {
                    let stage = stages.map_or(String::new(), |s| s.value(i).to_string());
                    by_stage.push((events.value(i).to_string(), stage));
                }
            }
            by_stage
        };
        // SESA distils: consolidation adds skills beyond the 15 seeds.
        let sesa = events("sesa.yaml").await;
        let added = sesa.iter().filter(|(e, _)| e == "added").count();
        assert!(added > 15, "SESA adds distilled skills to its 15 seeds: {added} added");
        // − distillation: no failures collected, no skill added beyond the seeds.
        assert!(table(&matrix.runs["ablation_no_distillation.yaml"], "failures").await.is_empty());
        let frozen = events("ablation_no_distillation.yaml").await;
        assert_eq!(frozen.iter().filter(|(e, _)| e == "added").count(), 15, "only the seeds");
        // − priming: the bank starts empty (no seed is ever added at step 1).
        let unprimed = table(&matrix.runs["ablation_no_priming.yaml"], "skills").await;
        assert!(unprimed.iter().all(|(step, b)| *step > 1 || b.num_rows() == 0), "an empty start bank");
        assert!(events("ablation_no_priming.yaml").await.iter().filter(|(e, _)| e == "added").count() < added);
        // − frontier: the proposer's reward is exactly 1 − p̂.
        let mut checked = 0;
        for (_, batch) in table(&matrix.runs["ablation_no_frontier.yaml"], "rewards").await {
            let (roles, rewards) = (column::<StringArray>(&batch, "role"), column::<Float64Array>(&batch, "reward"));
            let p_hat = column::<Float64Array>(&batch, "p_hat");
            for i in (0..batch.num_rows()).filter(|&i| roles.value(i) == "proposer" && p_hat.is_valid(i)) {
                assert_eq!(rewards.value(i), 1.0 - p_hat.value(i));
                checked += 1;
            }
        }
        assert!(checked > 0, "some proposals were solved");
        // SSP has no memory: nothing of the bank in its tables, and no memory-on evaluation.
        assert!(table(&matrix.runs["ssp.yaml"], "skills").await.iter().all(|(_, b)| b.num_rows() == 0));
        for (_, batch) in table(&matrix.runs["ssp.yaml"], "evals").await {
            assert!(column::<StringArray>(&batch, "mode").iter().all(|m| m != Some("memory_on")));
        }
    });
}

#[test]
fn sesa_report_fills_the_papers_tables_and_draws_the_curves() {
    let matrix = matrix();
    let out = matrix.store.parent().unwrap().join("report");
    let mut args = vec!["report".to_string()];
    args.extend(matrix.runs.values().map(|p| p.to_string_lossy().into_owned()));
    args.extend(["--out".to_string(), out.to_string_lossy().into_owned()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = run_sesa(&args, matrix.store.parent().unwrap());
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let markdown = std::fs::read_to_string(out.join("report.md")).unwrap();
    // The run list holds ids, hashes and wall times: everything after it is fixed.
    let tables = &markdown[markdown.find("## The paper's tables").expect("the tables section")..];
    insta::assert_snapshot!("paper_report", tables);
    for name in
        ["validation_accuracy", "valid_rate", "active_skills", "proposer_reward", "mean_p_hat", "solver_success"]
    {
        let png = std::fs::read(out.join(format!("{name}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{name}.png");
        let svg = std::fs::read_to_string(out.join(format!("{name}.svg"))).unwrap();
        assert!(svg.contains("<svg") && svg.contains("sesa-no-frontier"), "{name}.svg has a line per run");
    }
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert_eq!(html.matches("<svg").count(), 6, "the page holds every figure inline");
    assert!(!html.contains("http-equiv=\"refresh\""), "only --watch reloads");
    for run in matrix.runs.values() {
        let id = run.file_name().unwrap().to_str().unwrap();
        assert!(markdown.contains(id), "the run list names {id}");
    }
    // `--watch` over runs that have all stopped writes once, with a page that reloads itself.
    let watched = matrix.store.parent().unwrap().join("watched");
    let mut args: Vec<String> = vec!["report".into(), matrix.runs["sesa.yaml"].to_string_lossy().into_owned()];
    args.extend(["--watch", "--interval", "1", "--out"].map(String::from));
    args.push(watched.to_string_lossy().into_owned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = run_sesa(&args, matrix.store.parent().unwrap());
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let html = std::fs::read_to_string(watched.join("report.html")).unwrap();
    assert!(html.contains("<meta http-equiv=\"refresh\" content=\"1\">"));
}

/// Every ```sql block of `file`, with `runs/<run-id>` pointing at `run` and `runs/*` at the
/// store.
fn sql_blocks(file: &str, run: &Path, store: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
    text.split("```sql\n")
        .skip(1)
        .map(|block| {
            let sql = block.split("```").next().unwrap();
            sql.replace("runs/<run-id>", run.to_str().unwrap()).replace("runs/*", &format!("{}/*", store.display()))
        })
        .collect()
}

#[test]
fn every_documented_query_runs_on_a_real_runs_artifacts() {
    let has_duckdb = Command::new("python3").args(["-c", "import duckdb"]).status().is_ok_and(|s| s.success());
    if !has_duckdb {
        sesa_engine::testing::skip(
            "every_documented_query_runs_on_a_real_runs_artifacts",
            "no Python duckdb package (python3 -m pip install duckdb)",
        );
        return;
    }
    let matrix = matrix();
    let run = &matrix.runs["sesa.yaml"];
    let mut queries = sql_blocks("docs/analysis.md", run, &matrix.store);
    assert!(queries.len() >= 6, "docs/analysis.md has its queries");
    queries.extend(sql_blocks("README.md", run, &matrix.store));
    for sql in &queries {
        let script = "import duckdb, sys\nrows = duckdb.sql(sys.stdin.read()).fetchall()\nprint(len(rows))";
        let mut child = Command::new("python3")
            .args(["-c", script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(sql.as_bytes()).unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{sql}\n{}", String::from_utf8_lossy(&output.stderr));
        let rows: usize = String::from_utf8_lossy(&output.stdout).trim().parse().unwrap();
        // A block may say that a short run leaves it empty; every other one returns rows.
        assert!(rows > 0 || sql.contains("may return no rows"), "no rows from:\n{sql}");
    }
}
