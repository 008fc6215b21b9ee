//! `evaluate`: the solver's greedy answers on question sets, with the policy version being
//! served (or the initial policy in `base` mode) and, in `memory_on` mode, the skills of the
//! bank at this step. Exact match and F1 per question, per benchmark and, when questions say
//! their hop count, per hop count; with a judge, the paper's judge accuracy (exact match first,
//! the judge for the rest). Exact match is never reported as accuracy.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, Requirement, Stage, StageContext, StageError, TableSpec, Tables};

use super::solve::{Retrieval, retrieve};
use super::verify::judge_answers;
use super::{LoadOnce, elapsed_ms, failed, mean, metrics_batch, metrics_table};
use crate::agent::{AgentRun, Episode, PromptTemplate, Role};
use crate::data::datasets::{Question, load_questions};
use crate::data::metrics::{exact_match, f1_score};
use crate::search::{Bm25Index, Search};
use crate::sections::WorldSection;
use crate::sections::bm25_requirements;
use crate::selfplay::resources::{SelfPlay, SkillMemory, Templates};
use sesa_engine::columns::{Columns, schema_of};
use sesa_models::policy::{Policy, Sampling};

/// One question set.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BenchmarkConfig {
    /// FlashRAG JSONL (`id`, `question`, `golden_answers`; `hops` when known) or verl Parquet.
    /// Defaults to the `world`'s questions.
    #[serde(default)]
    pub questions: Option<PathBuf>,
    /// A generated world to evaluate on (another seed than the one trained on: a world never
    /// seen), generated into its `dir` on first use; its questions and corpus are then the
    /// defaults of `questions` and `corpus`.
    #[serde(default)]
    pub world: Option<WorldSection>,
    /// Only the last `last` questions of the file (a held-out split: see `warmup`).
    #[serde(default)]
    pub last: Option<usize>,
    /// A seeded random sample of this many questions (after `last`), kept in file order: the
    /// paper evaluates 500 per benchmark (all of a smaller one, such as Bamboogle's 125).
    #[serde(default)]
    pub sample: Option<usize>,
    /// The seed of `sample`: the same seed picks the same questions at every step and in every
    /// run, so evaluations compare question for question.
    #[serde(default)]
    pub sample_seed: u64,
    /// At most this many questions (after `last` and `sample`).
    #[serde(default)]
    pub limit: Option<usize>,
    /// Search this corpus (Search-R1 JSONL) instead of the spec's search backend; its BM25
    /// index is built at `index` on first use.
    #[serde(default)]
    pub corpus: Option<PathBuf>,
    /// Where the corpus's index lives (default: `<corpus>.index`).
    #[serde(default)]
    pub index: Option<PathBuf>,
}

/// Which policy answers, and whether it sees skills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EvalMode {
    /// The initial policy (the spec's `model:`, never updated), no skills: the paper's base.
    Base,
    /// The policy being served, no skills in the prompt (SESA-Off; SSP).
    MemoryOff,
    /// The policy being served with the top-k skills of the bank at this step (SESA-On).
    MemoryOn,
}

impl EvalMode {
    /// The mode's name in the `evals` table.
    pub fn name(self) -> &'static str {
        match self {
            EvalMode::Base => "base",
            EvalMode::MemoryOff => "memory_off",
            EvalMode::MemoryOn => "memory_on",
        }
    }
}

/// The config of `evaluate`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvaluateConfig {
    /// Named question sets.
    pub benchmarks: BTreeMap<String, BenchmarkConfig>,
    /// Skills in the prompt or not.
    #[serde(default = "memory_off")]
    pub mode: EvalMode,
    /// Judge the answers that miss exactly (the paper's accuracy): `true` needs a `judge:`
    /// section and `prompts.judge`; by default the judge rules whenever the spec names one.
    #[serde(default)]
    pub judge: Option<bool>,
    /// Episodes in flight at once: each holds its KV cache (45 KiB per token for SmolLM2), so
    /// this bounds memory however many questions a benchmark has.
    #[serde(default = "concurrency")]
    pub concurrency: usize,
}

fn concurrency() -> usize {
    64
}

fn memory_off() -> EvalMode {
    EvalMode::MemoryOff
}

/// Greedy evaluation of the solver.
pub struct Evaluate {
    config: EvaluateConfig,
    /// Each benchmark's questions and search tool, read and opened on the first run.
    benchmarks: LoadOnce<Vec<LoadedBenchmark>>,
}

/// A benchmark's name, questions and search tool.
type LoadedBenchmark = (String, Vec<Question>, Arc<dyn Search>);

struct EvalRow {
    benchmark: String,
    question: Question,
    prediction: Option<String>,
    em: f64,
    f1: f64,
    /// The judge's verdict on an answer that missed exactly; `None` when not asked.
    judged: Option<bool>,
    /// 1 or 0 when this benchmark is judged, `None` when no judge rules.
    accuracy: Option<f64>,
    turns: u64,
    searches: u64,
    tokens: u64,
    outcome: String,
    policy_version: u64,
    bank_version: u64,
    /// The skills in its prompt (none with memory off, or none similar enough).
    skill_ids: Vec<String>,
}

/// The `evals` table: one row per question evaluated.
fn evals_batch(mode: &str, rows: &[EvalRow]) -> Result<RecordBatch, ArrowError> {
    Columns::default()
        .str("mode", rows.iter().map(|_| mode))
        .str("benchmark", rows.iter().map(|r| r.benchmark.as_str()))
        .str("question_id", rows.iter().map(|r| r.question.id.as_str()))
        .str("question", rows.iter().map(|r| r.question.question.as_str()))
        .strs("golden_answers", rows.iter().map(|r| r.question.golden_answers.iter().map(String::as_str)))
        .u64("hops", rows.iter().map(|r| u64::from(r.question.hops.unwrap_or(0))))
        .opt_str("prediction", rows.iter().map(|r| r.prediction.as_deref()))
        .f64("em", rows.iter().map(|r| r.em))
        .f64("f1", rows.iter().map(|r| r.f1))
        .opt_bool("judged", rows.iter().map(|r| r.judged))
        .opt_f64("accuracy", rows.iter().map(|r| r.accuracy))
        .u64("turns", rows.iter().map(|r| r.turns))
        .u64("searches", rows.iter().map(|r| r.searches))
        .u64("tokens", rows.iter().map(|r| r.tokens))
        .str("outcome", rows.iter().map(|r| r.outcome.as_str()))
        .u64("policy_version", rows.iter().map(|r| r.policy_version))
        .u64("bank_version", rows.iter().map(|r| r.bank_version))
        .strs("skill_ids", rows.iter().map(|r| r.skill_ids.iter().map(String::as_str)))
        .finish()
}

impl Evaluate {
    /// The `evals` table's spec.
    pub fn evals_table() -> TableSpec {
        TableSpec::new("evals", schema_of(|| evals_batch("", &[])))
    }

    fn questions(config: &BenchmarkConfig) -> Result<Vec<Question>, StageError> {
        if let Some(world) = &config.world {
            world.ensure().map_err(|e| failed("generating the benchmark's world", e))?;
        }
        let path = match (&config.questions, &config.world) {
            (Some(path), _) => path.clone(),
            (None, Some(world)) => world.dir.join("questions.jsonl"),
            (None, None) => return Err(StageError::Failed("a benchmark needs `questions:` or `world:`".into())),
        };
        let mut questions = load_questions(&path).map_err(|e| StageError::Failed(e.to_string()))?;
        if let Some(last) = config.last {
            questions.drain(..questions.len().saturating_sub(last));
        }
        if let Some(size) = config.sample.filter(|&size| size < questions.len()) {
            let mut rng = ChaCha8Rng::seed_from_u64(config.sample_seed);
            let mut picked = rand::seq::index::sample(&mut rng, questions.len(), size).into_vec();
            picked.sort_unstable();
            let mut all: Vec<Option<Question>> = questions.into_iter().map(Some).collect();
            questions = picked.into_iter().filter_map(|i| all[i].take()).collect();
        }
        if let Some(limit) = config.limit {
            questions.truncate(limit);
        }
        Ok(questions)
    }

    fn search(config: &BenchmarkConfig, selfplay: &SelfPlay) -> Result<Arc<dyn Search>, StageError> {
        let Some((corpus, index)) = config.corpus_and_index() else { return Ok(selfplay.search.clone()) };
        let index = Bm25Index::open_or_build(&corpus, &index).map_err(|e| failed("the benchmark's index", e))?;
        Ok(Arc::new(Arc::new(index)))
    }
}

impl BenchmarkConfig {
    /// The corpus searched instead of the spec's backend (`corpus`, else the world's), and where
    /// its index lives (`index`, else the corpus's path with the extension `.index`).
    fn corpus_and_index(&self) -> Option<(PathBuf, PathBuf)> {
        let world_corpus = self.world.as_ref().map(|w| w.dir.join("corpus.jsonl"));
        let corpus = self.corpus.clone().or(world_corpus)?;
        let index = self.index.clone().unwrap_or_else(|| corpus.with_extension("index"));
        Some((corpus, index))
    }
}

/// The judge's verdict on each answer that missed exactly (an unanswered question stays
/// wrong); `accuracy` becomes 1 where it says correct.
async fn judge_misses(
    judge: &dyn Policy,
    template: &PromptTemplate,
    rows: &mut [EvalRow],
    cx: &StageContext,
) -> Result<(), StageError> {
    let misses: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].em == 0.0 && rows[i].prediction.is_some()).collect();
    let asks: Vec<(String, String, String)> = misses
        .iter()
        .map(|&i| {
            let row = &rows[i];
            (
                row.question.question.clone(),
                row.question.golden_answers.join(" | "),
                row.prediction.clone().unwrap_or_default(),
            )
        })
        .collect();
    let verdicts = judge_answers(judge, template, &asks, |k| cx.seed(misses[k] as u64)).await?;
    for (&i, verdict) in misses.iter().zip(verdicts) {
        rows[i].judged = Some(verdict);
        rows[i].accuracy = Some(f64::from(u8::from(verdict)));
    }
    Ok(())
}

impl Stage for Evaluate {
    const KIND: &'static str = "evaluate";
    const ABOUT: &'static str =
        "the solver's greedy answers on question sets (exact match, F1, judge accuracy): base, memory off or on";
    type Config = EvaluateConfig;

    fn new(config: EvaluateConfig) -> Result<Self, Vec<ConfigProblem>> {
        if config.benchmarks.is_empty() {
            return Err(vec![ConfigProblem::new("benchmarks", "name at least one question set")]);
        }
        if let Some(problem) = ConfigProblem::size("concurrency", config.concurrency, 1..=4_096) {
            return Err(vec![problem]);
        }
        let missing: Vec<ConfigProblem> = config
            .benchmarks
            .iter()
            .filter(|(_, b)| b.questions.is_none() && b.world.is_none())
            .map(|(name, _)| ConfigProblem::new(format!("benchmarks.{name}"), "give `questions:` or `world:`"))
            .collect();
        if !missing.is_empty() {
            return Err(missing);
        }
        Ok(Evaluate { config, benchmarks: LoadOnce::default() })
    }

    fn outputs(&self) -> Vec<TableSpec> {
        vec![Evaluate::evals_table(), metrics_table()]
    }

    fn requirements(&self) -> Vec<Requirement> {
        let mut requirements = Vec::new();
        for (name, benchmark) in &self.config.benchmarks {
            let key = |k: &str| format!("benchmarks.{name}.{k}");
            if let Some(questions) = &benchmark.questions {
                requirements.push(Requirement::path(
                    key("questions"),
                    questions,
                    "name a question set: FlashRAG JSONL (`id`, `question`, `golden_answers`) or verl Parquet",
                ));
            }
            if let Some((corpus, index)) = benchmark.corpus_and_index() {
                requirements.extend(bm25_requirements(&key("index"), &index, &key("corpus"), Some(&corpus)));
            }
        }
        requirements
    }

    fn provides(&self) -> Vec<PathBuf> {
        let worlds = self.config.benchmarks.values().filter_map(|b| b.world.as_ref()).map(|w| w.dir.clone());
        let indexes = self.config.benchmarks.values().filter_map(|b| b.corpus_and_index()).map(|(_, index)| index);
        worlds.chain(indexes).collect()
    }

    async fn run(&self, cx: &StageContext, _inputs: Tables) -> Result<Tables, StageError> {
        let clock = Instant::now();
        let selfplay = cx.resource::<SelfPlay>()?;
        let memory = match self.config.mode {
            EvalMode::MemoryOn => Some(
                cx.resource::<SkillMemory>()
                    .map_err(|_| StageError::Failed("mode `memory_on` needs a `memory:` section in the spec".into()))?,
            ),
            EvalMode::MemoryOff | EvalMode::Base => None,
        };
        let policy = match self.config.mode {
            EvalMode::Base => selfplay.initial.get(&selfplay.policy).await?,
            EvalMode::MemoryOff | EvalMode::MemoryOn => selfplay.policy.clone(),
        };
        let judge = match self.config.judge {
            Some(false) => None,
            Some(true) if selfplay.judge.is_none() => {
                return Err(StageError::Failed("`judge: true` needs a `judge:` section in the spec".into()));
            }
            _ => match &selfplay.judge {
                Some(judge) => Some((judge.as_ref(), Templates::require(&selfplay.templates.judge, "judge")?)),
                None => None,
            },
        };
        let mut rows = Vec::new();
        let mut metrics: Vec<(String, f64)> = Vec::new();
        // Where the episodes' wall time went, over every benchmark.
        let (mut generation, mut search_time) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
        let benchmarks = self.benchmarks.get(|| {
            // Two evaluations of one benchmark (memory on and off) start together: one of them
            // generates its world and builds its index while the other waits, then finds both.
            static PREPARING: std::sync::Mutex<()> = std::sync::Mutex::new(());
            let _preparing = PREPARING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            self.config
                .benchmarks
                .iter()
                .map(|(name, b)| Ok((name.clone(), Self::questions(b)?, Self::search(b, &selfplay)?)))
                .collect()
        })?;
        for (name, questions, search) in benchmarks.iter() {
            let texts: Vec<&str> = questions.iter().map(|q| q.question.as_str()).collect();
            let retrieval = match &memory {
                Some(memory) => retrieve(memory, &texts)?,
                None => Retrieval::none(texts.len()),
            };
            let episodes: Vec<Episode> =
                questions
                    .iter()
                    .zip(&retrieval.shown)
                    .map(|(q, shown)| Episode {
                        prompt: policy.render_chat(&selfplay.templates.solver.render(&BTreeMap::from([
                            ("question", q.question.clone()),
                            ("skills", shown.block.clone()),
                        ]))),
                        seed: 0,
                        // Evaluation is never guided; only a skill shown as a plan writes.
                        written: shown.plan.clone(),
                    })
                    .collect();
            let agent = AgentRun {
                role: Role::Solver,
                policy: policy.as_ref(),
                search: search.as_ref(),
                top_k: selfplay.top_k,
                limits: selfplay.agent.limits(),
                sampling: Sampling::GREEDY,
            };
            let mut progress = cx.progress(episodes.len() as u64);
            let (trajectories, busy) = agent
                .run_at_most(&episodes, self.config.concurrency, || progress.inc(1))
                .await
                .map_err(|e| failed(&format!("benchmark `{name}`"), e))?;
            generation += busy.generation;
            search_time += busy.search;
            let start = rows.len();
            for ((question, trajectory), shown) in questions.iter().zip(trajectories).zip(&retrieval.shown) {
                let prediction = trajectory.outcome.final_text().map(str::to_string);
                let answer = prediction.as_deref().unwrap_or_default();
                let em = if prediction.is_some() { exact_match(answer, &question.golden_answers) } else { 0.0 };
                rows.push(EvalRow {
                    benchmark: name.clone(),
                    em,
                    f1: if prediction.is_some() { f1_score(answer, &question.golden_answers) } else { 0.0 },
                    judged: None,
                    accuracy: judge.is_some().then_some(em),
                    prediction,
                    turns: trajectory.turns.len() as u64,
                    searches: trajectory.queries().len() as u64,
                    tokens: trajectory.generated_tokens() as u64,
                    outcome: super::outcome_name(&trajectory.outcome),
                    policy_version: trajectory.policy_version,
                    bank_version: retrieval.version,
                    skill_ids: shown.skills.iter().map(|(id, _, _)| id.clone()).collect(),
                    question: question.clone(),
                });
            }
            if let Some((judge, template)) = judge {
                judge_misses(judge, template, &mut rows[start..], cx).await?;
            }
            let these = &rows[start..];
            metrics.push((format!("{name}/em"), mean(these.iter().map(|r| r.em))));
            metrics.push((format!("{name}/f1"), mean(these.iter().map(|r| r.f1))));
            if judge.is_some() {
                metrics.push((format!("{name}/accuracy"), mean(these.iter().filter_map(|r| r.accuracy))));
            }
            metrics.push((
                format!("{name}/answered"),
                mean(these.iter().map(|r| f64::from(u8::from(r.prediction.is_some())))),
            ));
            metrics.push((format!("{name}/questions"), these.len() as f64));
            let mut hops: Vec<u8> = these.iter().filter_map(|r| r.question.hops).collect();
            hops.sort_unstable();
            hops.dedup();
            for h in hops {
                let at = these.iter().filter(|r| r.question.hops == Some(h));
                metrics.push((format!("{name}/hops{h}/em"), mean(at.map(|r| r.em))));
            }
        }
        // The unweighted mean over benchmarks, as the paper averages its seven.
        for metric in ["em", "f1", "accuracy"] {
            let suffix = format!("/{metric}");
            let values: Vec<f64> = metrics
                .iter()
                .filter(|(m, _)| m.ends_with(&suffix) && m.matches('/').count() == 1)
                .map(|(_, v)| *v)
                .collect();
            if !values.is_empty() {
                metrics.push((format!("average/{metric}"), mean(values)));
            }
        }
        metrics.push(("generation_ms".into(), generation.as_secs_f64() * 1e3));
        metrics.push(("search_ms".into(), search_time.as_secs_f64() * 1e3));
        metrics.push(("wall_ms".into(), elapsed_ms(clock)));
        let metric_rows: Vec<(&str, f64)> = metrics.iter().map(|(m, v)| (m.as_str(), *v)).collect();
        Ok(Tables::new()
            .with("evals", evals_batch(self.config.mode.name(), &rows)?)
            .with("step_metrics", metrics_batch(cx.stage_name(), &metric_rows)?))
    }
}
