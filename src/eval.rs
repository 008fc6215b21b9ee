//! `sesa eval`: greedy evaluation of a run's policy (or of a spec's initial one) on question
//! sets. It derives a one-step spec holding one `evaluate` stage and runs it as a new run of
//! the same name, so the evaluation has what every run has (progress, resume, Parquet tables)
//! and `sesa report` finds it beside the run it evaluates. A run's trained policy is exported
//! once and named in the derived spec with its version; with memory on, its last bank primes
//! the evaluation's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_yaml::{Mapping, Value};
use sesa_engine::columns::Reader;
use sesa_engine::{ArtifactStore, Progress, Registry, Run, StageError, pipeline_from_text, read_table};
use sesa_models::cache::sesa_home;
use sesa_stages::memory::SkillFile;
use sesa_stages::sections::ModelSection;
use sesa_stages::selfplay::LoopResources;
use sesa_stages::selfplay::training::TrainedModel;

/// What `sesa eval` was asked.
pub struct EvalRequest<'a> {
    /// A run location or a spec file.
    pub target: &'a str,
    /// `NAME=QUESTIONS[,CORPUS]`.
    pub benchmarks: &'a [String],
    /// `base`, `memory_off` or `memory_on`.
    pub mode: &'a str,
    /// The run's policy version (the last when `None`).
    pub version: Option<u64>,
    /// A seeded sample per benchmark.
    pub sample: Option<usize>,
    /// The sample's seed.
    pub sample_seed: u64,
    /// At most this many questions per benchmark.
    pub limit: Option<usize>,
    /// Where the evaluation run is kept (default: the evaluated run's store, or `runs`).
    pub store: Option<&'a str>,
    /// `--set` overrides of the derived spec.
    pub overrides: &'a [String],
}

/// Parses `NAME=QUESTIONS[,CORPUS]` into the `evaluate` stage's benchmark config.
fn benchmark(argument: &str, sample: Option<usize>, sample_seed: u64, limit: Option<usize>) -> Result<(String, Value)> {
    let Some((name, files)) = argument.split_once('=').filter(|(n, f)| !n.is_empty() && !f.is_empty()) else {
        bail!("--benchmark `{argument}`: expected NAME=QUESTIONS[,CORPUS], e.g. hotpotqa=data/hotpotqa/dev.jsonl")
    };
    let (questions, corpus) = match files.split_once(',') {
        Some((questions, corpus)) => (questions, Some(corpus)),
        None => (files, None),
    };
    for file in std::iter::once(questions).chain(corpus) {
        if !Path::new(file).exists() {
            bail!("--benchmark `{argument}`: {file} does not exist");
        }
    }
    let mut config = Mapping::new();
    config.insert("questions".into(), questions.into());
    if let Some(corpus) = corpus {
        config.insert("corpus".into(), corpus.into());
    }
    if let Some(sample) = sample {
        config.insert("sample".into(), (sample as u64).into());
        config.insert("sample_seed".into(), sample_seed.into());
    }
    if let Some(limit) = limit {
        config.insert("limit".into(), (limit as u64).into());
    }
    Ok((name.to_string(), Value::Mapping(config)))
}

/// Where a run's exported policies and banks are kept: `$SESA_HOME/exports/<run-id>`.
fn export_dir(run_id: &str) -> PathBuf {
    sesa_home().join("exports").join(run_id)
}

/// The evaluated run's trained policy as a Hugging Face directory, exported once (so a resumed
/// evaluation finds it); `None` when the run trained nothing in process (the policy its
/// `model:` serves is then the one evaluated).
async fn trained_policy(root: &ArtifactStore, run: &Run, version: Option<u64>) -> Result<Option<(u64, PathBuf)>> {
    let Some(ModelSection::Candle(_)) = run.pipeline().spec().section::<ModelSection>().as_deref() else {
        return Ok(None);
    };
    let mut versions = Vec::new();
    for (_, batch) in read_table(root, run.id(), "policy_versions").await? {
        let reader = Reader::new("policy_versions", &batch);
        let models = reader.str("model")?;
        let numbers = reader.u64("version")?;
        versions.extend(models.iter().zip(numbers).filter(|(m, _)| **m == TrainedModel::Model.key()).map(|(_, v)| v));
    }
    match version {
        None if versions.is_empty() => return Ok(None),
        Some(version) if !versions.contains(&version) => {
            let made: Vec<String> = versions.iter().map(u64::to_string).collect();
            let made = if made.is_empty() { "none".into() } else { made.join(", ") };
            bail!("run {} has no policy version {version} (its versions: {made})", run.id());
        }
        _ => {}
    }
    let staging = export_dir(run.id()).join("policy.partial");
    let version = crate::export::export_policy(root, run, TrainedModel::Model, version, &staging).await?;
    let out = export_dir(run.id()).join(format!("policy-v{version}"));
    if out.join("config.json").exists() {
        std::fs::remove_dir_all(&staging).ok();
    } else {
        std::fs::rename(&staging, &out).with_context(|| format!("moving the export to {}", out.display()))?;
    }
    Ok(Some((version, out)))
}

/// Points the `model:` of `spec` (the run's resolved spec) at the run's trained policy, exported
/// once by [`trained_policy`]; returns that policy in words. A `version` of a run that trained
/// nothing in process is refused: its `model:` serves whatever policy it serves.
pub(crate) async fn serve_trained_policy(
    root: &ArtifactStore,
    run: &Run,
    version: Option<u64>,
    spec: &mut Mapping,
) -> Result<String> {
    match trained_policy(root, run, version).await? {
        Some((version, dir)) => {
            let model = spec.get_mut("model").and_then(Value::as_mapping_mut).context("the run has no `model:`")?;
            model.insert("model".into(), dir.to_string_lossy().into_owned().into());
            model.insert("policy_version".into(), version.into());
            Ok(format!("policy version {version}"))
        }
        None if version.is_some() => {
            bail!(
                "run {} trained no policy in process, so it has no version to load; its `model:` serves its policy",
                run.id()
            )
        }
        None => Ok("the policy its `model:` serves".into()),
    }
}

/// The evaluated run's last bank as a skill file, for a `priming` stage.
async fn last_bank(run_location: &str, run_id: &str) -> Result<(u64, PathBuf)> {
    let (version, skills) = crate::skills::bank_at(run_location, None).await?;
    let path = export_dir(run_id).join(format!("bank-v{version}.json"));
    std::fs::create_dir_all(export_dir(run_id))?;
    let file = SkillFile { version, skills };
    let partial = path.with_extension("partial");
    std::fs::write(&partial, serde_json::to_string_pretty(&file)? + "\n")?;
    std::fs::rename(&partial, &path)?;
    Ok((version, path))
}

/// Turns the evaluated spec into the evaluation's: one step, one `evaluate` stage (after a
/// `priming` of the run's last bank with memory on), the run's trained policy and its version.
/// Returns what is evaluated, in words: the policy and the skills.
async fn derive(
    request: &EvalRequest<'_>,
    source: Option<&(ArtifactStore, Run)>,
    doc: &mut Value,
) -> Result<(String, String)> {
    let map = doc.as_mapping_mut().context("the spec is not a mapping")?;
    let mut stages = Mapping::new();
    let mut evaluate = Mapping::new();
    evaluate.insert("kind".into(), "evaluate".into());
    evaluate.insert("schedule".into(), "once".into());
    evaluate.insert("mode".into(), request.mode.into());
    let mut benchmarks = Mapping::new();
    for argument in request.benchmarks {
        let (name, config) = benchmark(argument, request.sample, request.sample_seed, request.limit)?;
        benchmarks.insert(name.into(), config);
    }
    evaluate.insert("benchmarks".into(), Value::Mapping(benchmarks));
    let mut policy = String::from("the initial policy");
    let mut bank = String::from("no skills");
    if request.mode == "memory_on" {
        let priming = match source {
            Some((_, run)) => {
                let (version, path) = last_bank(request.target, run.id()).await?;
                bank = format!("the bank at version {version}");
                Some(Value::String(path.to_string_lossy().into_owned()))
            }
            None => map
                .get("stages")
                .and_then(|s| s.as_mapping())
                .and_then(|s| s.values().find(|v| v.get("kind") == Some(&Value::from("priming"))))
                .and_then(|p| p.get("skills").cloned()),
        };
        let Some(skills) = priming else {
            bail!("mode memory_on: {} primes no skill bank (no `priming` stage)", request.target)
        };
        let mut stage = Mapping::new();
        stage.insert("kind".into(), "priming".into());
        stage.insert("schedule".into(), "once".into());
        stage.insert("skills".into(), skills);
        stages.insert("priming".into(), Value::Mapping(stage));
        evaluate.insert("after".into(), Value::Sequence(vec!["priming".into()]));
    } else {
        map.remove("memory");
    }
    if request.mode == "memory_on" && source.is_none() {
        bank = "its primed bank".into();
    }
    if let (Some((root, run)), false) = (source, request.mode == "base") {
        policy = serve_trained_policy(root, run, request.version, map).await?;
    }
    stages.insert("evaluate".into(), Value::Mapping(evaluate));
    map.insert("stages".into(), Value::Mapping(stages));
    map.insert("steps".into(), 1u64.into());
    Ok((policy, bank))
}

/// Runs the evaluation and prints each benchmark's numbers.
pub async fn eval(request: EvalRequest<'_>, registry: &Registry, progress: &Progress) -> Result<u8> {
    if request.benchmarks.is_empty() {
        bail!("name at least one question set: --benchmark NAME=QUESTIONS[,CORPUS]");
    }
    let is_spec = Path::new(request.target).is_file();
    let (mut doc, store, source) = if is_spec {
        let pipeline = sesa_engine::load_pipeline(Path::new(request.target), &[], registry)?;
        (pipeline.spec().resolved.clone(), request.store.unwrap_or("runs").to_string(), None)
    } else {
        let (root_location, run_id) = crate::support::split_run_location(request.target)?;
        let root = ArtifactStore::open(&root_location)?;
        let run = Run::inspect(&root, &run_id, registry)
            .await
            .with_context(|| format!("`{}` is neither a spec file nor a run", request.target))?;
        let store = request.store.unwrap_or(&root_location).to_string();
        (run.pipeline().spec().resolved.clone(), store, Some((root, run)))
    };
    let (policy, bank) = derive(&request, source.as_ref(), &mut doc).await?;
    let text = serde_yaml::to_string(&doc)?;
    let label = format!("evaluation of {}", request.target);
    let pipeline = pipeline_from_text(&text, &label, request.overrides, registry)?;
    crate::preflight::check(pipeline.spec()).await?;
    let root = ArtifactStore::open(&store)?;
    let resources = LoopResources::open(pipeline.spec())
        .await
        .context("opening the evaluation's models and search")?
        .context("the spec has no `model:` section: nothing to evaluate")?;
    let run =
        Run::create(&root, pipeline, crate::support::code_version()).await.context("creating the evaluation run")?;
    eprintln!("evaluating {} ({policy}, {bank}; mode {}) → {}", request.target, request.mode, run.location());
    let location = run.location();
    let run = run.with_resources(|r| resources.install(r));
    let code = crate::execute::execute(run, progress).await?;
    if code == 0 {
        print_results(&root, &crate::support::split_run_location(&location)?.1).await?;
    }
    Ok(code)
}

/// Per benchmark: questions, exact match, F1 and (when judged) accuracy, in percent.
async fn print_results(root: &ArtifactStore, run_id: &str) -> Result<()> {
    #[derive(Default)]
    struct Sums {
        n: u64,
        em: f64,
        f1: f64,
        judged: Option<f64>,
    }
    let mut by_benchmark: BTreeMap<String, Sums> = BTreeMap::new();
    for (_, batch) in read_table(root, run_id, "evals").await? {
        let reader = Reader::new("evals", &batch);
        let rows = (|| -> Result<_, StageError> {
            Ok((reader.str("benchmark")?, reader.f64("em")?, reader.f64("f1")?, reader.opt_f64("accuracy")?))
        })()?;
        for (((benchmark, em), f1), accuracy) in rows.0.into_iter().zip(rows.1).zip(rows.2).zip(rows.3) {
            let sums = by_benchmark.entry(benchmark.to_string()).or_default();
            sums.n += 1;
            sums.em += em;
            sums.f1 += f1;
            if let Some(accuracy) = accuracy {
                *sums.judged.get_or_insert(0.0) += accuracy;
            }
        }
    }
    println!("{:<20} {:>9} {:>7} {:>7} {:>9}", "benchmark", "questions", "EM %", "F1 %", "judge %");
    for (name, sums) in &by_benchmark {
        let n = sums.n.max(1) as f64;
        let judged = sums.judged.map_or("-".to_string(), |a| format!("{:.1}", 100.0 * a / n));
        println!("{name:<20} {:>9} {:>7.1} {:>7.1} {judged:>9}", sums.n, 100.0 * sums.em / n, 100.0 * sums.f1 / n);
    }
    Ok(())
}
