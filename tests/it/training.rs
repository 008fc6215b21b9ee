//! Training as a user drives it: a warm start then the loop with its RL update, on a tiny
//! random llama (SmolLM2's tokenizer, so prompts tokenize as they would), killed at random
//! moments and resumed, gives the tables and the final weights of an uninterrupted run;
//! `sesa model export` writes a directory the `candle` backend serves.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_array::types::{Float32Type, UInt32Type};
use rand::{Rng, SeedableRng};
use sesa_models::policy::ModelFiles;
use sesa_models::weights::{BlockWeights, LlamaShape, LlamaWeights};
use sesa_stages::data::world::{World, WorldConfig};

use crate::support::{ChildRegistry, only_run, run_sesa_with, sesa_script, sesa_with, spawn_sesa_with, stdout, write};

/// A two-block llama of width 16 over SmolLM2's vocabulary, random weights drawn from `seed`.
fn tiny_model(out: &Path, seed: u64) {
    let gguf = sesa_models::cache::fetch(&sesa_models::cache::sesa_home(), "smollm2-135m-instruct")
        .unwrap()
        .join("SmolLM2-135M-Instruct.Q4_1.gguf");
    let files = ModelFiles::read(&gguf).unwrap();
    let shape = LlamaShape {
        hidden: 16,
        heads: 2,
        kv_heads: 1,
        head_dim: 8,
        layers: 2,
        ffn: 32,
        vocabulary: files.weights.shape.vocabulary,
        context: 2048,
        eps: 1e-5,
        rope_base: 10_000.0,
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut matrix = |len: usize| -> Vec<f32> { (0..len).map(|_| rng.random_range(-0.3f32..0.3)).collect() };
    let (h, kv, f) = (shape.hidden, shape.kv_width(), shape.ffn);
    let blocks = (0..shape.layers)
        .map(|_| BlockWeights {
            attention_norm: vec![1.0; h],
            query: matrix(h * h),
            key: matrix(kv * h),
            value: matrix(kv * h),
            attention_out: matrix(h * h),
            ffn_norm: vec![1.0; h],
            gate: matrix(f * h),
            up: matrix(f * h),
            down: matrix(h * f),
        })
        .collect();
    let weights = LlamaWeights {
        embedding: matrix(shape.vocabulary * h),
        output_norm: vec![1.0; h],
        output: None,
        blocks,
        shape,
    };
    files.export(&weights, out).unwrap();
}

fn prompts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("specs/prompts")
}

/// A warm start on the first step, then the loop with its RL update on every step, with a
/// greedy evaluation after each.
fn spec(dir: &Path) -> PathBuf {
    let d = dir.display();
    let p = prompts().display().to_string();
    let text = format!(
        "\
name: tiny training
seed: 3
steps: 3
world: {{dir: {d}/world, seed: 4, entities: 120, questions: 30}}
model: {{backend: candle, model: {d}/tiny, cache_tokens: 2048}}
search: {{top_k: 2, backend: {{kind: bm25, index: {d}/index, corpus: {d}/world/corpus.jsonl}}}}
agent: {{max_turns: 2, max_turn_tokens: 6, max_total_tokens: 12, context_limit: 1024, sampling: {{temperature: 1.0}}}}
prompts: {{solver: {p}/solver_small.yaml, proposer: {p}/proposer_small.yaml, verifier: {p}/verifier.yaml}}
trainer: {{micro_batch_tokens: 700}}
stages:
  warmup:
    kind: warmup
    schedule: once
    world: {{questions: {d}/world/questions.jsonl, held_out: 10, limit: 8, rules: {{min_words: 4, min_searches: 1}}}}
    batch: 3
    optimizer: {{lr: 1.0e-3, warmup_steps: 1, schedule: cosine}}
  propose: {{kind: propose, after: [warmup], targets: {d}/world/targets.jsonl, batch: 2}}
  verify: {{kind: verify, after: [propose], noise: 1, max_tokens: 4, invalid: reuse}}
  solve: {{kind: solve, after: [verify], n_rollouts: 2}}
  reward: {{kind: reward, after: [solve], proposer: {{shape: frontier, lambda: 0.5}}}}
  update:
    kind: update
    after: [reward]
    optimizer: {{lr: 1.0e-3}}
    keep_every: 2
    replay: {{world: {{questions: {d}/world/questions.jsonl, roles: [solver], held_out: 10, limit: 8}}, per_step: 2, weight: 0.5}}
  evaluate:
    kind: evaluate
    after: [update]
    benchmarks: {{held_out: {{questions: {d}/world/questions.jsonl, last: 10, limit: 3}}}}
  base:
    kind: evaluate
    after: [update]
    schedule: at_end
    mode: base
    benchmarks: {{held_out: {{questions: {d}/world/questions.jsonl, last: 10, limit: 3}}}}
"
    );
    write(dir, "tiny.yaml", &text)
}

/// Every table of a run, by (table, step, writer).
type RunTables = BTreeMap<(String, u64, String), RecordBatch>;

/// Every table of a run, without wall times.
fn tables(run: &Path) -> RunTables {
    let mut out = BTreeMap::new();
    for table in std::fs::read_dir(run.join("tables")).unwrap() {
        let table = table.unwrap();
        let name = table.file_name().to_string_lossy().into_owned();
        for partition in std::fs::read_dir(table.path()).unwrap() {
            let partition = partition.unwrap();
            let step: u64 = partition.file_name().to_string_lossy().strip_prefix("step=").unwrap().parse().unwrap();
            for file in std::fs::read_dir(partition.path()).unwrap() {
                let file = file.unwrap();
                let bytes = bytes::Bytes::from(std::fs::read(file.path()).unwrap());
                let batch = sesa_engine::table::decode_parquet(bytes).unwrap();
                let writer = file.file_name().to_string_lossy().into_owned();
                out.insert((name.clone(), step, writer), without_times(&name, batch));
            }
        }
    }
    out
}

fn without_times(table: &str, batch: RecordBatch) -> RecordBatch {
    let keep: Vec<usize> =
        (0..batch.num_columns()).filter(|&i| !batch.schema().field(i).name().ends_with("_ms")).collect();
    let batch = batch.project(&keep).unwrap();
    if table != "step_metrics" {
        return batch;
    }
    let metrics = batch.column_by_name("metric").unwrap();
    let metrics = metrics.as_any().downcast_ref::<arrow_array::StringArray>().unwrap();
    let timeless: arrow_array::BooleanArray =
        metrics.iter().map(|m| Some(!m.unwrap_or_default().ends_with("_ms"))).collect();
    arrow_select::filter::filter_record_batch(&batch, &timeless).unwrap()
}

fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(&dir.path().join("tiny"), 11);
    World::generate(WorldConfig { seed: 4, entities: 120, questions: 30 }).write(&dir.path().join("world")).unwrap();
    dir
}

/// Runs `spec` into `dir/reference`; returns its tables, how long it took and its directory.
fn run_reference(dir: &Path, spec: &str) -> (RunTables, Duration, PathBuf) {
    let store = dir.join("reference");
    let clock = std::time::Instant::now();
    let output = run_sesa_with(ChildRegistry::Stages, &["run", spec, "--store", store.to_str().unwrap()], dir);
    let duration = clock.elapsed();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let run = only_run(&store);
    (tables(&run), duration, run)
}

/// The batch `writer` wrote into table `name` at `step`.
fn written<'a>(tables: &'a RunTables, name: &str, step: u64, writer: &str) -> &'a RecordBatch {
    &tables[&(name.to_string(), step, format!("{writer}.parquet"))]
}

/// The value of `metric` that `writer` wrote into `step_metrics` at `step`, if it wrote one.
fn step_metric(tables: &RunTables, step: u64, writer: &str, metric: &str) -> Option<f64> {
    let batch = written(tables, "step_metrics", step, writer);
    let values = batch.column_by_name("value").unwrap();
    let values = values.as_any().downcast_ref::<arrow_array::Float64Array>().unwrap();
    strings(batch, "metric").iter().position(|m| m == metric).map(|at| values.value(at))
}

/// Runs `spec` into `store` and kills it after `delay`: its run and whether it had completed,
/// or `None` when it was killed before the run had a directory and a manifest.
fn run_killed(dir: &Path, spec: &str, store: &Path, delay: Duration) -> Option<(PathBuf, bool)> {
    let mut child = spawn_sesa_with(ChildRegistry::Stages, &["run", spec, "--store", store.to_str().unwrap()], dir);
    std::thread::sleep(delay);
    child.kill().unwrap();
    child.wait().unwrap();
    let run = std::fs::read_dir(store).ok()?.next()?.unwrap().path();
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(run.join("manifest.json")).ok()?).unwrap();
    let completed = manifest["status"] == "completed";
    Some((run, completed))
}

/// Runs `spec` `trials` times, each killed at a random moment of a run as long as `duration`
/// (loading, training, serving, evaluating or committing) and resumed; asserts each resumed
/// run's tables are `reference`'s. Returns how many were killed before they completed. A trial
/// that completed before its kill (the machine got faster than when `duration` was measured)
/// is tried again at half the delay, up to three times, so that the count does not depend on
/// the machine's load staying put.
fn kill_and_resume(
    dir: &Path,
    spec: &str,
    reference: &RunTables,
    duration: Duration,
    trials: usize,
    seed: u64,
) -> usize {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut interrupted = 0;
    for trial in 0..trials {
        let mut fraction = rng.random_range(0.3..0.95);
        let mut attempt = 0;
        let outcome = loop {
            let store = dir.join(format!("trial-{trial}-{attempt}"));
            match run_killed(dir, spec, &store, duration.mul_f64(fraction)) {
                Some((_, true)) if attempt < 3 => (fraction, attempt) = (fraction / 2.0, attempt + 1),
                outcome => break outcome,
            }
        };
        let Some((run, completed)) = outcome else { continue };
        interrupted += usize::from(!completed);
        let resumed = run_sesa_with(ChildRegistry::Stages, &["resume", run.to_str().unwrap()], dir);
        assert_eq!(resumed.status.code(), Some(0), "trial {trial}: {}", String::from_utf8_lossy(&resumed.stderr));
        let tables = tables(&run);
        assert_eq!(tables.keys().collect::<Vec<_>>(), reference.keys().collect::<Vec<_>>(), "trial {trial}");
        for (key, batch) in reference {
            assert_eq!(tables.get(key), Some(batch), "trial {trial}: {key:?} differs");
        }
    }
    interrupted
}

#[test]
fn a_training_run_killed_anywhere_resumes_to_the_same_tables_and_weights() {
    let dir = setup();
    let spec = spec(dir.path());
    let spec_arg = spec.to_str().unwrap();
    let (reference, duration, run) = run_reference(dir.path(), spec_arg);
    let versions: Vec<(u64, &str)> = reference
        .keys()
        .filter(|(t, _, _)| t == "policy_versions")
        .map(|(_, s, w)| (*s, w.trim_end_matches(".parquet")))
        .collect();
    assert_eq!(versions, [(1, "update"), (1, "warmup"), (2, "update"), (3, "update")], "a version per training stage");
    let checkpoints: Vec<(u64, &str)> = reference
        .keys()
        .filter(|(t, _, _)| t == "checkpoints")
        .map(|(_, s, w)| (*s, w.trim_end_matches(".parquet")))
        .collect();
    assert_eq!(
        checkpoints,
        [(1, "warmup"), (2, "update"), (3, "update")],
        "the update's keep_every 2 keeps step 2's checkpoint and the last one"
    );
    let steps = &reference[&("train_steps".to_string(), 1, "warmup.parquet".to_string())];
    assert!(steps.num_rows() >= 2, "micro-batches of at most 700 tokens");
    for step in 1..=3u64 {
        // The evaluation after step n's update ran the weights it made: version n + 1.
        let evals = &reference[&("evals".to_string(), step, "evaluate.parquet".to_string())];
        let versions = evals.column_by_name("policy_version").unwrap();
        let versions = versions.as_any().downcast_ref::<arrow_array::UInt64Array>().unwrap();
        assert_eq!(versions.len(), 3);
        assert!(versions.iter().all(|v| v == Some(step + 1)), "step {step}: {versions:?}");
        // Both roles were updated, the proposer first; its rollouts came from version n.
        let updates = &reference[&("updates".to_string(), step, "update.parquet".to_string())];
        let roles = updates.column_by_name("role").unwrap();
        let roles: Vec<&str> =
            roles.as_any().downcast_ref::<arrow_array::StringArray>().unwrap().iter().flatten().collect();
        assert_eq!(roles, ["proposer", "solver"], "step {step}");
        let rollouts = &reference[&("rollouts".to_string(), step, "solve.parquet".to_string())];
        // Two of the warm start's solver demonstrations replayed beside the step's rollouts.
        let sequences = updates.column_by_name("sequences").unwrap();
        let sequences = sequences.as_any().downcast_ref::<arrow_array::UInt64Array>().unwrap();
        assert_eq!(sequences.value(1), rollouts.num_rows() as u64 + 2, "step {step}");
        assert_eq!(step_metric(&reference, step, "update", "solver_replayed"), Some(2.0), "step {step}");
        assert_eq!(step_metric(&reference, step, "update", "proposer_replayed"), None, "step {step}");
        let nll = step_metric(&reference, step, "update", "solver_replay_nll").unwrap();
        assert!(nll > 0.0 && nll.is_finite(), "step {step}: the demonstrations' −log p {nll}");
        let made_by = rollouts.column_by_name("policy_version").unwrap();
        let made_by = made_by.as_any().downcast_ref::<arrow_array::UInt64Array>().unwrap();
        assert!(made_by.iter().all(|v| v == Some(step)), "step {step}: {made_by:?}");
    }

    let interrupted = kill_and_resume(dir.path(), spec_arg, &reference, duration, 4, 7);
    assert!(interrupted >= 2, "only {interrupted} trials were killed before the run completed");

    // At the end, `base` answers with the initial weights (a second copy), the loop's own
    // evaluation with the last version.
    let version = |writer: &str| {
        let batch = &reference[&("evals".to_string(), 3, format!("{writer}.parquet"))];
        let column = batch.column_by_name("policy_version").unwrap();
        column.as_any().downcast_ref::<arrow_array::UInt64Array>().unwrap().value(0)
    };
    assert_eq!(version("base"), 0);
    assert!(version("evaluate") > 0);

    // The last version exported serves as a model of its own, with the trained weights.
    let export = dir.path().join("export");
    let output = run_sesa_with(
        ChildRegistry::Stages,
        &["model", "export", run.to_str().unwrap(), "--out", export.to_str().unwrap()],
        dir.path(),
    );
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let exported = ModelFiles::read(&export).unwrap();
    let initial = ModelFiles::read(&dir.path().join("tiny")).unwrap();
    assert!(exported.weights != initial.weights, "the export holds trained weights");
    assert_eq!(exported.weights.shape, initial.weights.shape);
    let earlier = dir.path().join("export-2");
    let output = run_sesa_with(
        ChildRegistry::Stages,
        &["model", "export", run.to_str().unwrap(), "--version", "3", "--out", earlier.to_str().unwrap()],
        dir.path(),
    );
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(ModelFiles::read(&earlier).unwrap().weights != exported.weights, "version 3 is not the last");
    let missing = run_sesa_with(
        ChildRegistry::Stages,
        &["model", "export", run.to_str().unwrap(), "--version", "2", "--out", export.to_str().unwrap()],
        dir.path(),
    );
    assert_ne!(missing.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no policy version 2"), "deleted by keep_every");

    // `sesa eval` of the run: its last policy version without memory, and the initial policy,
    // as new runs of the same name in another store.
    let evals = dir.path().join("evals");
    let questions = format!("held_out={}/world/questions.jsonl", dir.path().display());
    let mut versions = Vec::new();
    let listed = || -> std::collections::BTreeSet<PathBuf> {
        std::fs::read_dir(&evals).map(|d| d.map(|e| e.unwrap().path()).collect()).unwrap_or_default()
    };
    for mode in ["memory-off", "base"] {
        let before = listed();
        let output = sesa_with(
            ChildRegistry::Stages,
            &[
                "eval",
                run.to_str().unwrap(),
                "--mode",
                mode,
                "--benchmark",
                &questions,
                "--sample",
                "3",
                "--store",
                evals.to_str().unwrap(),
            ],
            dir.path(),
        )
        .env("SESA_HOME", dir.path().join("home"))
        .output()
        .unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
        let printed = String::from_utf8_lossy(&output.stdout);
        assert!(printed.lines().any(|l| l.starts_with("held_out") && l.contains(" 3 ")), "{printed}");
        // The run this evaluation made (run ids of the same second sort by a random suffix).
        let newest = listed().difference(&before).next().cloned().expect("a new run");
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(newest.join("manifest.json")).unwrap()).unwrap();
        assert_eq!(manifest["name"], "tiny training", "an evaluation keeps the run's name");
        let rows = tables(&newest);
        let batch = &rows[&("evals".to_string(), 1, "evaluate.parquet".to_string())];
        assert_eq!(batch.num_rows(), 3);
        let column = batch.column_by_name("policy_version").unwrap();
        versions.push(column.as_any().downcast_ref::<arrow_array::UInt64Array>().unwrap().value(0));
    }
    assert!(versions[0] > 0, "memory off answers with the trained policy: {versions:?}");
    assert_eq!(versions[1], 0, "base answers with the initial weights");
    assert!(dir.path().join("home/exports").exists(), "the policy was exported into SESA_HOME");
}

/// LoRA carries a whole run: the warm start trains adapters on every block, RL fresh ones on
/// the top block over the warm start's merged into the base (`update_method`; the KL
/// reference is that base), checkpoints hold adapters and moments only (RL's with the warm
/// start's merged ones), a run
/// killed anywhere resumes to the same tables, and the export holds the merged weights the
/// run served.
#[test]
fn a_lora_run_checkpoints_its_adapters_resumes_and_exports_the_merged_weights() {
    let dir = setup();
    let text = std::fs::read_to_string(spec(dir.path())).unwrap().replace(
        "trainer: {micro_batch_tokens: 700}",
        "trainer: {micro_batch_tokens: 700, method: {kind: lora, rank: 2, alpha: 4}, \
         update_method: {kind: lora, rank: 2, alpha: 4, top_layers: 1}}",
    );
    let spec = write(dir.path(), "lora.yaml", &text);
    let spec_arg = spec.to_str().unwrap();
    let (reference, duration, run) = run_reference(dir.path(), spec_arg);
    let table = |name: &str, step: u64, writer: &str| written(&reference, name, step, writer);
    for (step, writer) in [(1, "warmup"), (1, "update"), (3, "update")] {
        assert_eq!(strings(table("policy_versions", step, writer), "method"), ["lora"], "step {step} {writer}");
    }
    let count = |names: &[String], prefix: &str| names.iter().filter(|n| n.starts_with(prefix)).count();
    // The warm start: both blocks' seven projections, A and B each.
    let names = strings(table("checkpoints", 1, "warmup"), "tensor");
    assert_eq!((count(&names, "adapters."), count(&names, "merged.")), (28, 0), "{names:?}");
    let names = strings(table("checkpoints", 3, "update"), "tensor");
    // RL: the top block only (the lower block trains nothing, so the backward pass stops above
    // it), AdamW's two moments, and the warm start's adapters, merged into the base.
    assert_eq!((count(&names, "adapters."), count(&names, "merged.")), (14, 28), "{names:?}");
    assert!(
        names.iter().all(|n| ["adapters.", "adam_m.", "adam_v.", "merged."].iter().any(|p| n.starts_with(p))),
        "{names:?}"
    );
    let bytes = integers(table("policy_versions", 3, "update"), "checkpoint_bytes")[0];
    let weights = ModelFiles::read(&dir.path().join("tiny")).unwrap().weights;
    let full = 3
        * 4
        * (weights.embedding.len()
            + weights.blocks.iter().map(|b| b.tensors().iter().map(|t| t.len()).sum::<usize>()).sum::<usize>());
    assert!(bytes * 100 < full as u64, "a LoRA checkpoint of {bytes} bytes against {full} for full fine-tuning");
    let updates = table("updates", 3, "update");
    assert!(integers(updates, "tokens").iter().sum::<u64>() > 0, "the update trained");
    // RL's passes start at the top block from the inputs the served model kept for it: the
    // gradients are those of the trainer's own pass over both blocks, up to rounding.
    let own = dir.path().join("own-blocks");
    let output = run_sesa_with(
        ChildRegistry::Stages,
        &["run", spec_arg, "--store", own.to_str().unwrap(), "--set", "stages.update.served_block_inputs=false"],
        dir.path(),
    );
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let own = tables(&only_run(&own));
    let norms = |tables: &RunTables| reals(written(tables, "updates", 1, "update"), "grad_norm");
    let (served, computed) = (norms(&reference), norms(&own));
    assert_ne!(served, computed, "the update computed the blocks below the adapters itself");
    for (a, b) in served.iter().zip(&computed) {
        assert!((a - b).abs() <= 1e-4 * b.abs(), "gradient norms {served:?} from served inputs, {computed:?} without");
    }

    kill_and_resume(dir.path(), spec_arg, &reference, duration, 2, 9);

    // The export holds the merged weights the run served: version 3 (kept by keep_every 2)
    // scores step 3's rollouts, which version 3 generated, as the server recorded them.
    let export_version = |version: &str, out: &Path| {
        let output = run_sesa_with(
            ChildRegistry::Stages,
            &["model", "export", run.to_str().unwrap(), "--version", version, "--out", out.to_str().unwrap()],
            dir.path(),
        );
        assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
        ModelFiles::read(out).unwrap().weights
    };
    // The largest gap between what `weights` give step `step`'s rollouts and what the server
    // recorded.
    let gap = |weights: &LlamaWeights, step: u64| {
        let rollouts = table("rollouts", step, "solve");
        let model = sesa_models::train::TrainModel::new(weights.clone());
        let (prompts, responses) =
            (lists::<UInt32Type>(rollouts, "prompt_ids"), lists::<UInt32Type>(rollouts, "token_ids"));
        let (masks, recorded) =
            (lists::<UInt32Type>(rollouts, "loss_mask"), lists::<Float32Type>(rollouts, "logprobs"));
        let mut largest = 0.0f32;
        for r in 0..prompts.len() {
            let tokens: Vec<u32> = prompts[r].iter().chain(&responses[r]).copied().collect();
            let trained: Vec<usize> = (0..responses[r].len()).filter(|&t| masks[r][t] != 0).collect();
            let positions: Vec<usize> = trained.iter().map(|t| prompts[r].len() + t).collect();
            let example = sesa_models::train::Example { tokens: &tokens, positions: &positions, block_inputs: None };
            let scored = model.forward(&[example], 1.0).unwrap().logprobs.remove(0);
            for (s, &t) in scored.iter().zip(&trained) {
                largest = largest.max((s - recorded[r][t]).abs());
            }
        }
        largest
    };
    let export = dir.path().join("export");
    let exported = export_version("3", &export);
    assert!(integers(table("rollouts", 3, "solve"), "policy_version").iter().all(|&v| v == 3));
    let (served, initial) = (gap(&exported, 3), gap(&weights, 3));
    assert!(served < 1e-4, "the export scores the served tokens {served} nats apart");
    assert!(initial > 100.0 * served.max(1e-6), "the initial weights score them alike ({initial} nats apart)");
    // The warm start's version (no merged adapters in its checkpoint) exports as it served
    // step 1's rollouts too.
    let warm = export_version("1", &dir.path().join("export-warm"));
    assert!(integers(table("rollouts", 1, "solve"), "policy_version").iter().all(|&v| v == 1));
    let served = gap(&warm, 1);
    assert!(served < 1e-4, "the warm start's export scores its served tokens {served} nats apart");
    assert!(gap(&exported, 1) > 100.0 * served.max(1e-6), "versions 1 and 3 score step 1 alike");

    // `sesa ask --run` puts a question to the run's version 3: the same episode as the spec
    // with the exported version 3 in `model:`, not the initial weights'.
    let ask = |args: &[&str]| {
        let mut all = vec!["ask", "Where was the founder of Minyny Institute born?", "--seed", "5"];
        all.extend(args);
        let output = sesa_with(ChildRegistry::Stages, &all, dir.path())
            .env("SESA_HOME", dir.path().join("home"))
            .output()
            .expect("the child process starts");
        (output.status.code(), stdout(&output), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let without_time = |printed: String| printed[..printed.rfind(" in ").unwrap_or(printed.len())].to_string();
    let (code, from_run, stderr) = ask(&["--run", run.to_str().unwrap(), "--version", "3"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("asking policy version 3 of"), "{stderr}");
    let exported_model = format!("model={{backend: candle, model: {}, cache_tokens: 2048}}", export.display());
    let (_, from_export, _) = ask(&["--spec", spec_arg, "--set", &exported_model]);
    let (_, from_initial, _) = ask(&["--spec", spec_arg]);
    assert_eq!(without_time(from_run.clone()), without_time(from_export));
    assert_ne!(without_time(from_run), without_time(from_initial), "the initial weights answer alike");
    let (code, _, stderr) = ask(&["--run", run.to_str().unwrap(), "--version", "9"]);
    assert!(code == Some(1) && stderr.contains("no policy version 9 (its versions: 1, 2, 3, 4)"), "{stderr}");
    let (code, _, stderr) = ask(&["--run", run.to_str().unwrap(), "--memory"]);
    assert!(code == Some(1) && stderr.contains("no `memory:` section"), "{stderr}");
}

/// The column `name` of `batch`, a list column, as vectors.
fn lists<T: arrow_array::ArrowPrimitiveType>(batch: &RecordBatch, name: &str) -> Vec<Vec<T::Native>> {
    let column = batch.column_by_name(name).unwrap();
    let list = column.as_any().downcast_ref::<arrow_array::ListArray>().unwrap();
    (0..arrow_array::Array::len(list))
        .map(|i| list.value(i).as_any().downcast_ref::<arrow_array::PrimitiveArray<T>>().unwrap().values().to_vec())
        .collect()
}

/// The column `name` of `batch` as strings.
fn strings(batch: &RecordBatch, name: &str) -> Vec<String> {
    let column = batch.column_by_name(name).unwrap();
    column.as_any().downcast_ref::<arrow_array::StringArray>().unwrap().iter().map(|v| v.unwrap().to_string()).collect()
}

/// The column `name` of `batch` as integers.
fn integers(batch: &RecordBatch, name: &str) -> Vec<u64> {
    let column = batch.column_by_name(name).unwrap();
    column.as_any().downcast_ref::<arrow_array::UInt64Array>().unwrap().values().to_vec()
}

/// The column `name` of `batch` as reals.
fn reals(batch: &RecordBatch, name: &str) -> Vec<f64> {
    let column = batch.column_by_name(name).unwrap();
    column.as_any().downcast_ref::<arrow_array::Float64Array>().unwrap().values().to_vec()
}

/// [`spec`] for two steps with a tiny proposer of its own (`proposer_model:`, written to
/// `dir/tiny-proposer`), as text.
fn two_models(dir: &Path) -> String {
    tiny_model(&dir.join("tiny-proposer"), 12);
    let proposer =
        format!("proposer_model: {{backend: candle, model: {}/tiny-proposer, cache_tokens: 2048}}", dir.display());
    std::fs::read_to_string(spec(dir))
        .unwrap()
        .replace("steps: 3", "steps: 2")
        .replace("trainer:", &format!("{proposer}\ntrainer:"))
}

/// With `proposer_model:` the proposer plays with its own weights, served here in int8 with an
/// F16 KV cache, and each model is trained by its own trainer, with its own versions and
/// checkpoints; a killed run resumes both (int8 weights reloaded after each update), and
/// either exports.
#[test]
fn a_proposer_model_is_served_and_trained_apart_and_resumes() {
    let dir = setup();
    let d = dir.path().display().to_string();
    // The warm start teaches the solver only, so the two models' versions differ.
    let text = two_models(dir.path())
        .replace("held_out: 10, limit: 8,", "held_out: 10, limit: 8, roles: [solver],")
        .replace("    keep_every: 2\n", "")
        .replace(
            "tiny-proposer, cache_tokens: 2048}",
            "tiny-proposer, cache_tokens: 2048, dtype: int8, kv_cache_dtype: f16}",
        );
    let spec = write(dir.path(), "proposer.yaml", &text);
    let spec_arg = spec.to_str().unwrap();
    let (reference, duration, run) = run_reference(dir.path(), spec_arg);
    let table = |name: &str, step: u64, writer: &str| written(&reference, name, step, writer);
    let versions = |step: u64, writer: &str| {
        let batch = table("policy_versions", step, writer);
        strings(batch, "model").into_iter().zip(integers(batch, "version")).collect::<Vec<_>>()
    };
    let made = |models: &[(&str, u64)]| models.iter().map(|(m, v)| (m.to_string(), *v)).collect::<Vec<_>>();
    assert_eq!(versions(1, "warmup"), made(&[("model", 1)]));
    assert_eq!(versions(1, "update"), made(&[("proposer_model", 1), ("model", 2)]), "the proposer first");
    assert_eq!(versions(2, "update"), made(&[("proposer_model", 2), ("model", 3)]));
    // Each checkpoint file holds the tensors of the models its stage trained, labelled.
    let mut labels = strings(table("checkpoints", 2, "update"), "model");
    labels.dedup();
    assert_eq!(labels, ["proposer_model", "model"]);
    for step in 1..=2u64 {
        // Questions came from the proposer's weights, answers from the solver's.
        let proposed = integers(table("proposals", step, "propose"), "policy_version");
        assert!(proposed.iter().all(|&v| v == step - 1), "step {step}: {proposed:?}");
        let solved = integers(table("rollouts", step, "solve"), "policy_version");
        assert!(solved.iter().all(|&v| v == step), "step {step}: {solved:?}");
        // Each in its own precision, recorded with what it wrote.
        let recorded = |name: &str, writer: &str, column: &str| {
            let values = strings(table(name, step, writer), column);
            assert!(!values.is_empty(), "step {step}: no {name}");
            values
        };
        assert!(recorded("proposals", "propose", "precision").iter().all(|p| p == "int8"), "step {step}");
        assert!(recorded("rollouts", "solve", "precision").iter().all(|p| p == "f32"), "step {step}");
        assert!(recorded("proposals", "propose", "kv_cache_dtype").iter().all(|p| p == "f16"), "step {step}");
        assert!(recorded("rollouts", "solve", "kv_cache_dtype").iter().all(|p| p == "f32"), "step {step}");
    }

    kill_and_resume(dir.path(), spec_arg, &reference, duration, 2, 8);

    // Either model exports; the proposer's holds its own trained weights.
    let export = |proposer: bool, name: &str| {
        let out = dir.path().join(name);
        let mut args = vec!["model", "export", run.to_str().unwrap(), "--out", out.to_str().unwrap()];
        if proposer {
            args.push("--proposer");
        }
        let output = run_sesa_with(ChildRegistry::Stages, &args, dir.path());
        assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
        ModelFiles::read(&out).unwrap().weights
    };
    let (solver, proposer) = (export(false, "solver-export"), export(true, "proposer-export"));
    let initial = ModelFiles::read(&dir.path().join("tiny-proposer")).unwrap().weights;
    assert!(proposer != initial, "the proposer's export holds trained weights");
    assert!(proposer != solver);
    let missing = run_sesa_with(
        ChildRegistry::Stages,
        &["model", "export", run.to_str().unwrap(), "--proposer", "--version", "3", "--out", d.as_str()],
        dir.path(),
    );
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no policy version 3 of `proposer_model`"));
}

/// `world.proposer_limit` shows the proposer more of the world's questions than the solver
/// (`limit`), never one of the held-out tail: two warm starts of one run, the second with it.
#[test]
fn the_proposer_is_shown_more_targets_than_the_solver_with_its_own_limit() {
    let dir = setup();
    let d = dir.path().display();
    let world = |extra: &str| {
        format!(
            "{{questions: {d}/world/questions.jsonl, held_out: 10, limit: 3{extra}, rules: {{min_words: 4, min_searches: 1}}}}"
        )
    };
    // The training spec's model, world, search and prompts; one step of two warm starts.
    let base = std::fs::read_to_string(spec(dir.path())).unwrap().replace("steps: 3", "steps: 1");
    let text = format!(
        "{}stages:
  same: {{kind: warmup, world: {same}, batch: 4, optimizer: {{lr: 1.0e-3}}}}
  more: {{kind: warmup, after: [same], world: {more}, batch: 4, optimizer: {{lr: 1.0e-3}}}}
",
        base.split("trainer:").next().unwrap(),
        same = world(""),
        more = world(", proposer_limit: 100, proposer_facts: true"),
    );
    let spec = write(dir.path(), "limit.yaml", &text);
    let (tables, _, _) = run_reference(dir.path(), spec.to_str().unwrap());
    let count = |writer: &str, metric: &str| step_metric(&tables, 1, writer, metric).unwrap() as usize;
    let (solver, proposer) = (count("same", "solver_demonstrations"), count("same", "proposer_demonstrations"));
    assert!(solver <= 3 && proposer <= 3, "{solver} and {proposer} demonstrations of 3 questions");
    assert_eq!(count("more", "solver_demonstrations"), solver, "the solver keeps its limit");
    // 20 trainable questions (30 less 10 held out) give the proposer more than 3 did, and at
    // most one demonstration each.
    let more = count("more", "proposer_demonstrations");
    assert!(more > proposer && more <= 20, "{more} proposer demonstrations against {proposer}");
}

/// `sesa train-external` behind the external contract trains a run's two models apart: each
/// from its own initial weights, then from its own last checkpoint, which the in-process
/// policies serve after each step.
#[test]
fn sesa_as_an_external_trainer_trains_a_proposer_model_apart() {
    let dir = setup();
    let d = dir.path().display().to_string();
    let text = two_models(dir.path());
    let trainer = sesa_script(
        &dir.path().join("trainer.sh"),
        &["train-external", "--model", &format!("{d}/tiny"), "--proposer-model", &format!("{d}/tiny-proposer")],
    );
    // An external trainer gets the step's trajectories only: no replay.
    let text: String = text.lines().filter(|l| !l.starts_with("    replay:")).map(|l| format!("{l}\n")).collect();
    let text = text.replace("after: [warmup]", "after: []").replace(
        "    keep_every: 2\n",
        &format!("    external: {{command: [sh, {}], dir: {d}/external}}\n", trainer.display()),
    );
    let text = text[..text.find("  warmup:").unwrap()].to_string() + &text[text.find("  propose:").unwrap()..];
    let spec = write(dir.path(), "external.yaml", &text);
    let store = dir.path().join("runs");
    let output = run_sesa_with(
        ChildRegistry::Stages,
        &["run", spec.to_str().unwrap(), "--store", store.to_str().unwrap()],
        dir.path(),
    );
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let run = tables(&only_run(&store));
    let table = |name: &str, step: u64, writer: &str| &run[&(name.to_string(), step, format!("{writer}.parquet"))];
    let checkpoint = |step: u64, model: &str| format!("{d}/external/step-{step:08}/{model}/checkpoint");
    for step in 1..=2u64 {
        let versions = table("policy_versions", step, "update");
        assert_eq!(strings(versions, "model"), ["proposer_model", "model"]);
        assert_eq!(integers(versions, "version"), [step, step]);
        assert_eq!(
            strings(versions, "external_checkpoint"),
            [checkpoint(step, "proposer_model"), checkpoint(step, "model")]
        );
        let proposed = integers(table("proposals", step, "propose"), "policy_version");
        assert!(proposed.iter().all(|&v| v == step - 1), "step {step}: {proposed:?}");
    }
    let weights = |path: &str| ModelFiles::read(Path::new(path)).unwrap().weights;
    let initial_proposer = weights(&format!("{d}/tiny-proposer"));
    let proposer = weights(&checkpoint(2, "proposer_model"));
    assert!(proposer != initial_proposer, "the proposer's own weights were trained");
    // Trained from its own initial weights, not the solver's: far nearer to them.
    let distance = |a: &LlamaWeights, b: &LlamaWeights| -> f64 {
        a.embedding.iter().zip(&b.embedding).map(|(x, y)| f64::from(x - y).powi(2)).sum()
    };
    let initial_solver = weights(&format!("{d}/tiny"));
    assert!(distance(&proposer, &initial_proposer) * 100.0 < distance(&proposer, &initial_solver));
    assert!(proposer != weights(&checkpoint(2, "model")));
    // A manifest of the proposer's model names it, and starts from its own last checkpoint.
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(format!("{d}/external/step-00000002/proposer_model/manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["model"], "proposer_model");
    assert_eq!(manifest["previous_checkpoint"], checkpoint(1, "proposer_model"));
}

/// `sesa ask` sets up as `sesa run` does: on a fresh directory it generates the spec's world
/// and builds its index rather than failing on the missing index.
#[test]
fn ask_generates_the_world_and_index_a_fresh_clone_lacks() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(&dir.path().join("tiny"), 11);
    let spec = spec(dir.path());
    assert!(!dir.path().join("world").exists() && !dir.path().join("index").exists());
    let output = run_sesa_with(
        ChildRegistry::Stages,
        &["ask", "Where was the founder of Minyny Institute born?", "--spec", spec.to_str().unwrap()],
        dir.path(),
    );
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(dir.path().join("world/corpus.jsonl").exists() && dir.path().join("index").exists());
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.contains("Where was the founder of Minyny Institute born?"), "{printed}");
    assert!(printed.contains("turns,") && printed.contains("searches,"), "{printed}");
}

/// The kernels give the same bits with and without their vector code: `sesa ask` with int8
/// weights samples the same trajectory with `SESA_KERNELS=portable`, and with `avx2` (on an
/// AVX-512 CPU, the level below), as at the CPU's best (each sampled token depends on every
/// logit's bits).
#[test]
fn portable_kernels_sample_the_same_trajectory_as_the_vector_ones() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(&dir.path().join("tiny"), 11);
    let spec = spec(dir.path());
    let ask = |kernels: &str| {
        let output = sesa_with(
            ChildRegistry::Stages,
            &[
                "ask",
                "Where was the founder of Minyny Institute born?",
                "--spec",
                spec.to_str().unwrap(),
                "--set",
                "model.dtype=int8",
                "--set",
                "agent={max_turns: 3, max_turn_tokens: 40, max_total_tokens: 120, context_limit: 1024, sampling: {temperature: 1.0}}",
            ],
            dir.path(),
        )
        .env("SESA_KERNELS", kernels)
        .output()
        .expect("the child process starts");
        assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
        // Without the closing line's wall time ("… tokens generated in 0.3s").
        let mut printed = stdout(&output);
        if let Some(end) = printed.rfind(" in ") {
            printed.truncate(end);
        }
        printed
    };
    let best = ask("");
    assert!(best.contains("turns,") && best.ends_with("tokens generated"), "{best}");
    assert_eq!(ask("portable"), best, "SESA_KERNELS=portable");
    assert_eq!(ask("avx2"), best, "SESA_KERNELS=avx2");
}

/// `sesa model export` of a model rather than a run: the GGUF's weights (dequantized) as a
/// Hugging Face directory, what an external trainer starts from; read back, the same weights.
#[test]
fn a_model_exports_as_the_weights_it_is_loaded_with() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = sesa_models::cache::fetch(&sesa_models::cache::sesa_home(), "smollm2-135m-instruct")
        .unwrap()
        .join("SmolLM2-135M-Instruct.Q4_1.gguf");
    let out = dir.path().join("hf");
    let export = |extra: &[&str]| {
        let mut args = vec!["model", "export", gguf.to_str().unwrap(), "--out", out.to_str().unwrap()];
        args.extend(extra);
        run_sesa_with(ChildRegistry::Stages, &args, dir.path())
    };
    let output = export(&[]);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(ModelFiles::read(&out).unwrap().weights == ModelFiles::read(&gguf).unwrap().weights);
    let output = export(&["--version", "1"]);
    assert_ne!(output.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&output.stderr).contains("is a model, not a run"), "{output:?}");
}
