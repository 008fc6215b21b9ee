//! Runs as a user drives them: run, resume, kill -9 at random moments, Ctrl-C, failures.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use sesa_engine::manifest::{RunManifest, RunStatus};

use crate::support::{only_run, read_tables, run_sesa, spawn_sesa, write};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn manifest(run: &Path) -> RunManifest {
    serde_json::from_slice(&std::fs::read(run.join("manifest.json")).unwrap()).unwrap()
}

fn run_to_completion(store: &Path, extra: &[&str]) -> PathBuf {
    let spec = fixture("pipeline.yaml");
    let mut args = vec!["run", spec.to_str().unwrap(), "--store", store.to_str().unwrap()];
    args.extend(extra);
    let output = run_sesa(&args, store.parent().unwrap());
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    only_run(store)
}

fn assert_no_staging(run: &Path) {
    let staged = std::fs::read_dir(run.join("_staging")).map(|entries| entries.count()).unwrap_or(0);
    assert_eq!(staged, 0, "staging files left in {}", run.display());
}

#[test]
fn a_run_writes_hive_partitioned_tables_and_commit_records() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_to_completion(&dir.path().join("runs"), &[]);
    let tables = read_tables(&run);
    let keys: Vec<String> = tables.keys().map(|(t, s)| format!("{t}/step={s}")).collect();
    insta::assert_snapshot!(keys.join("\n"), @"
    numbers/step=1
    numbers/step=2
    numbers/step=3
    numbers/step=4
    numbers/step=5
    numbers/step=6
    offsets/step=1
    squares/step=1
    squares/step=2
    squares/step=3
    squares/step=4
    squares/step=5
    squares/step=6
    totals/step=2
    totals/step=4
    totals/step=6
    ");
    assert_eq!(tables[&("numbers".to_string(), 3)].num_rows(), 40);
    let manifest = manifest(&run);
    assert_eq!((manifest.status, manifest.committed_steps, manifest.steps), (RunStatus::Completed, 6, 6));
    let commit: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("commits/step-00000002.json")).unwrap()).unwrap();
    let stages: Vec<&str> = commit["stages"].as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(stages, ["numbers", "square", "total"]);
    // `square` read `offsets` from step 1, recorded with the fingerprint that step committed.
    let step1: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("commits/step-00000001.json")).unwrap()).unwrap();
    assert_eq!(commit["stages"]["square"]["inputs"]["offsets"]["step"], 1);
    assert_eq!(
        commit["stages"]["square"]["inputs"]["offsets"]["fingerprint"],
        step1["stages"]["offsets"]["fingerprint"]
    );
    assert!(run.join("spec.yaml").exists());
    assert_no_staging(&run);
}

#[test]
fn the_same_seed_gives_the_same_tables_and_another_seed_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let first = read_tables(&run_to_completion(&dir.path().join("a"), &[]));
    let second = read_tables(&run_to_completion(&dir.path().join("b"), &[]));
    assert_eq!(first, second);
    let other = read_tables(&run_to_completion(&dir.path().join("c"), &["--set", "seed=8"]));
    assert_ne!(first[&("numbers".to_string(), 1)], other[&("numbers".to_string(), 1)]);
}

#[test]
fn reordering_a_specs_keys_keeps_its_hash_and_its_stage_fingerprints() {
    let dir = tempfile::tempdir().unwrap();
    let written = "name: keys\nseed: 7\nsteps: 1\nlimits: {max_value: 1000}\nstages:\n  \
                   offsets: {kind: offsets, schedule: once}\n  \
                   numbers: {kind: numbers, rows: 40, delay_ms: 0}\n  \
                   square: {kind: square, after: [numbers, offsets]}\n";
    let reordered = "stages:\n  square: {after: [numbers, offsets], kind: square}\n  \
                     numbers: {delay_ms: 0, rows: 40, kind: numbers}\n  \
                     offsets: {schedule: once, kind: offsets}\n\
                     limits: {max_value: 1000}\nsteps: 1\nseed: 7\nname: keys\n";
    let runs: Vec<PathBuf> = [("written", written), ("reordered", reordered)]
        .into_iter()
        .map(|(name, text)| {
            let spec = write(dir.path(), &format!("{name}.yaml"), text);
            let store = dir.path().join(name);
            let output = run_sesa(&["run", spec.to_str().unwrap(), "--store", store.to_str().unwrap()], dir.path());
            assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
            only_run(&store)
        })
        .collect();
    assert_eq!(manifest(&runs[0]).spec_hash, manifest(&runs[1]).spec_hash);
    let fingerprints = |run: &Path| {
        let commit: serde_json::Value =
            serde_json::from_slice(&std::fs::read(run.join("commits/step-00000001.json")).unwrap()).unwrap();
        let stages = commit["stages"].as_object().unwrap();
        let mut fingerprints: Vec<(String, String)> =
            stages.iter().map(|(name, record)| (name.clone(), record["fingerprint"].to_string())).collect();
        fingerprints.sort();
        fingerprints
    };
    let written = fingerprints(&runs[0]);
    assert_eq!(written.len(), 3);
    assert_eq!(written, fingerprints(&runs[1]));
}

/// Kills `sesa run` (and then `sesa resume`) with SIGKILL at random moments, resumes until the
/// run completes, and checks the tables equal those of an uninterrupted run: no lost and no
/// duplicated rows.
#[test]
fn sigkill_at_random_moments_then_resume_gives_identical_tables() {
    let dir = tempfile::tempdir().unwrap();
    let reference = read_tables(&run_to_completion(&dir.path().join("reference"), &[]));
    let spec = fixture("pipeline.yaml");
    let mut rng = rand::rngs::StdRng::seed_from_u64(2026);
    for trial in 0..4 {
        let store = dir.path().join(format!("trial-{trial}"));
        let store_arg = store.to_str().unwrap();
        // Each step takes about 200 ms of stage work; kill somewhere in the first steps.
        let set_delay = "stages.numbers.delay_ms=200";
        let mut child =
            spawn_sesa(&["run", spec.to_str().unwrap(), "--store", store_arg, "--set", set_delay], dir.path());
        std::thread::sleep(Duration::from_millis(rng.random_range(100..1200)));
        child.kill().unwrap();
        child.wait().unwrap();
        let mut kills = 1;
        loop {
            let Ok(run) = std::fs::read_dir(&store).map(|_| only_run(&store)) else { panic!("no run created") };
            let run_arg = run.to_str().unwrap().to_string();
            let mut resume = spawn_sesa(&["resume", &run_arg], dir.path());
            if kills < 3 && rng.random_bool(0.5) {
                std::thread::sleep(Duration::from_millis(rng.random_range(50..600)));
                resume.kill().unwrap();
                resume.wait().unwrap();
                kills += 1;
                continue;
            }
            let status = resume.wait().unwrap();
            assert!(status.success(), "trial {trial}: resume failed: {status}");
            break;
        }
        let run = only_run(&store);
        let resumed = read_tables(&run);
        assert_eq!(resumed.len(), reference.len(), "trial {trial}: partitions differ");
        for (key, batch) in &reference {
            // `numbers` ran with a delay here; its values do not depend on it.
            assert_eq!(resumed.get(key), Some(batch), "trial {trial}: {key:?} differs");
        }
        assert_eq!(manifest(&run).status, RunStatus::Completed);
        assert_no_staging(&run);
    }
}

/// A run has one writer: a second `resume` while the first writes is refused and names it;
/// `sesa runs` reads liveness from the lease; once the writer is killed, `resume` takes over.
#[test]
fn a_second_writer_is_refused_until_the_first_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let reference = read_tables(&run_to_completion(&dir.path().join("reference"), &[]));
    let store = dir.path().join("runs");
    let spec = fixture("pipeline.yaml");
    let mut first = spawn_sesa(
        &["run", spec.to_str().unwrap(), "--store", store.to_str().unwrap(), "--set", "stages.numbers.delay_ms=1000"],
        dir.path(),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !std::fs::read_dir(&store).is_ok_and(|mut d| d.next().is_some())
        || !only_run(&store).join("lease.json").exists()
    {
        assert!(std::time::Instant::now() < deadline, "the run never took its lease");
        std::thread::sleep(Duration::from_millis(20));
    }
    let run = only_run(&store);
    let lease: serde_json::Value = serde_json::from_slice(&std::fs::read(run.join("lease.json")).unwrap()).unwrap();
    assert_eq!(lease["pid"], first.id());
    let second = run_sesa(&["resume", run.to_str().unwrap()], dir.path());
    assert_eq!(second.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains(&format!("is being written by pid {}", first.id())) && stderr.contains("--force"),
        "{stderr}"
    );
    let listing = run_sesa(&["runs", "--store", store.to_str().unwrap()], dir.path());
    assert!(String::from_utf8_lossy(&listing.stdout).contains(" running "), "{listing:?}");

    first.kill().unwrap();
    first.wait().unwrap();
    let listing = run_sesa(&["runs", "--store", store.to_str().unwrap()], dir.path());
    assert!(String::from_utf8_lossy(&listing.stdout).contains(" stopped "), "the writer is gone: {listing:?}");
    let output = run_sesa(&["resume", run.to_str().unwrap()], dir.path());
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(read_tables(&run), reference);
    assert!(!run.join("lease.json").exists(), "released when the run completed");
}

#[test]
fn ctrl_c_stops_after_a_committed_step_and_resume_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let reference = read_tables(&run_to_completion(&dir.path().join("reference"), &[]));
    let store = dir.path().join("runs");
    let spec = fixture("pipeline.yaml");
    let child = spawn_sesa(
        &["run", spec.to_str().unwrap(), "--store", store.to_str().unwrap(), "--set", "stages.numbers.delay_ms=300"],
        dir.path(),
    );
    std::thread::sleep(Duration::from_millis(700));
    let killed = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130));
    let run = only_run(&store);
    let stopped = manifest(&run);
    assert_eq!(stopped.status, RunStatus::Interrupted);
    assert!((1..6).contains(&stopped.committed_steps), "committed {}", stopped.committed_steps);
    assert_no_staging(&run);
    let listing = run_sesa(&["runs", "--store", store.to_str().unwrap()], dir.path());
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert!(listing.contains("interrupted"), "{listing}");
    let output = run_sesa(&["resume", run.to_str().unwrap()], dir.path());
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(read_tables(&run), reference);
}

#[test]
fn a_failing_stage_keeps_earlier_steps_and_says_how_to_resume() {
    let dir = tempfile::tempdir().unwrap();
    let spec = write(
        dir.path(),
        "failing.yaml",
        "name: failing\nseed: 1\nsteps: 4\nstages:\n  numbers: {kind: numbers, rows: 5}\n  fail: {kind: fail, at_step: 3}\n",
    );
    let store = dir.path().join("runs");
    let output = run_sesa(&["run", spec.to_str().unwrap(), "--store", store.to_str().unwrap()], dir.path());
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("stage `fail` failed at step 3: told to fail at step 3"), "{stderr}");
    assert_eq!(stderr.matches("told to fail").count(), 1, "the cause is said once: {stderr}");
    assert!(stderr.contains("sesa resume"), "{stderr}");
    let run = only_run(&store);
    let manifest = manifest(&run);
    assert_eq!((manifest.status, manifest.committed_steps), (RunStatus::Failed, 2));
    assert!(manifest.error.unwrap().contains("told to fail"));
    assert_eq!(read_tables(&run).keys().filter(|(t, _)| t == "numbers").count(), 2);
    assert_no_staging(&run);
}

#[test]
fn resume_of_a_missing_run_says_where_it_looked() {
    let dir = tempfile::tempdir().unwrap();
    let output = run_sesa(&["resume", "runs/nope"], dir.path());
    assert_eq!(output.status.code(), Some(1));
    insta::assert_snapshot!(String::from_utf8_lossy(&output.stderr), @"error: opening run `runs/nope`: no run at `runs/nope` (no manifest.json); `sesa runs` lists the runs of a store");
}

#[test]
fn a_table_that_keeps_every_kth_step_deletes_the_others_and_readers_skip_them() {
    let dir = tempfile::tempdir().unwrap();
    let reference = read_tables(&run_to_completion(&dir.path().join("reference"), &[]));
    let run = run_to_completion(&dir.path().join("pruned"), &["--set", "stages.numbers.keep_every=4"]);
    let tables = read_tables(&run);
    let kept: Vec<u64> = tables.keys().filter(|(t, _)| t == "numbers").map(|(_, step)| *step).collect();
    assert_eq!(kept, vec![4, 6], "the last step and the multiples of 4");
    // Nothing else changes: the stages downstream read each step's numbers before they went.
    for (key, batch) in reference.iter().filter(|(key, _)| key.0 != "numbers" || kept.contains(&key.1)) {
        assert_eq!(tables.get(key), Some(batch), "{key:?}");
    }
    let root = sesa_engine::ArtifactStore::open(dir.path().join("pruned").to_str().unwrap()).unwrap();
    let id = run.file_name().unwrap().to_str().unwrap().to_string();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let read = runtime.block_on(sesa_engine::read_table(&root, &id, "numbers")).unwrap();
    assert_eq!(read.iter().map(|(step, _)| *step).collect::<Vec<_>>(), vec![4, 6]);
    assert_no_staging(&run);
}
