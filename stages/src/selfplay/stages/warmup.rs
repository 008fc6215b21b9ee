//! `warmup`: supervised fine-tuning on demonstrations (written from a generated world, or a
//! user's own), so that a small model follows the search protocol before self-play. The
//! trained weights are served from the next stage on and become a policy version.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use rand::seq::SliceRandom;
use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, Requirement, Stage, StageContext, StageError, TableSpec, Tables};

use super::{LoadOnce, elapsed_ms, failed, metrics_batch, metrics_table, role_named};
use crate::agent::Role;
use crate::data::datasets::{Question, load_questions};
use crate::data::world::World;
use crate::selfplay::demonstrations::{
    Demonstration, SkillShare, SolverThoughts, WalkBack, Writer, demonstration_skills, read_user_demonstrations,
};
use crate::selfplay::resources::{SelfPlay, Templates};
use crate::selfplay::rules::ValidityRules;
use crate::selfplay::training::{
    Published, Training, by_training, checkpoints_table, policy_versions_table, publish_version,
};
use sesa_engine::columns::{Columns, schema_of};
use sesa_models::train::{OptimizerConfig, StepReport, TrainSequence};

/// Demonstrations written from a generated world's questions.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorldDemonstrations {
    /// The world's `questions.jsonl` (questions with their `supporting_titles`: those without
    /// are skipped). Each gives the proposer a target, its answer and hop count; when the file
    /// sits in the directory `world` generated (with its `world.json`), the proposer's walk back
    /// goes wherever its searches lead, otherwise only along the question's own chain.
    pub questions: PathBuf,
    /// The last `held_out` questions of the file are never trained on: evaluate on them.
    #[serde(default)]
    pub held_out: usize,
    /// Roles to demonstrate: `solver`, `proposer` (both by default; one shared policy).
    #[serde(default = "both_roles")]
    pub roles: Vec<String>,
    /// Only questions of at most this many hops.
    #[serde(default)]
    pub max_hops: Option<u8>,
    /// The proposer's demonstrations of at most this many hops (`max_hops` by default): a
    /// proposer shown every depth while the solver is shown the shallow ones leaves the depth
    /// the solver reaches to self-play.
    #[serde(default)]
    pub proposer_max_hops: Option<u8>,
    /// Questions used at most (from the start of the file), before filtering.
    #[serde(default)]
    pub limit: Option<usize>,
    /// Questions the proposer's demonstrations use at most (`limit` by default), so that the
    /// proposer can be shown many targets at every depth while the solver is shown few: a
    /// world's question gives at most one proposer demonstration (one per target and depth), and
    /// SSP's rules drop many.
    #[serde(default)]
    pub proposer_limit: Option<usize>,
    /// The rules a proposer demonstration's question must pass (the propose stage's).
    #[serde(default)]
    pub rules: ValidityRules,
    /// Solver demonstrations with a skill in their prompt, so that a solver meets skills before
    /// self-play shows it any: `{relevant: 0.4, irrelevant: 0.2}` shows 40 % a skill of their
    /// own chain of relations (which they follow), 20 % one of another chain (which they
    /// ignore), the rest none. Unset: no skills, as in the paper.
    #[serde(default)]
    pub skills: Option<SkillShare>,
    /// Proposer demonstrations that write down, in a thought before each next search and
    /// before the question, the fact the last search read ("The birthplace of X is Mibri."), so
    /// that the question is composed from relations written in the trajectory rather than
    /// recalled from the passages. Off by default (the demonstrations SSP's warm start would
    /// write: searches, then the question).
    #[serde(default)]
    pub proposer_facts: bool,
    /// What the solver's thoughts say before each search: `plan` (the whole chain first, then
    /// the fact each search read and the next hop) or `remaining` (the question that remains,
    /// one hop shorter at each search, so that a deeper question is more of the same steps).
    #[serde(default)]
    pub solver_thoughts: SolverThoughts,
}

fn both_roles() -> Vec<String> {
    vec!["solver".into(), "proposer".into()]
}

/// The config of `warmup`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WarmupConfig {
    /// Demonstrations written from a generated world.
    #[serde(default)]
    pub world: Option<WorldDemonstrations>,
    /// A user's demonstrations: JSONL or Parquet rows with `prompt_ids`, `token_ids` and
    /// `loss_mask` (the `rollouts` table's layout: filter an earlier run's in DuckDB).
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// Passes over the demonstrations.
    #[serde(default = "super::one")]
    pub epochs: usize,
    /// Demonstrations per optimizer step (their gradients accumulate).
    #[serde(default = "super::four")]
    pub batch: usize,
    /// AdamW and the learning-rate schedule.
    pub optimizer: OptimizerConfig,
    /// Checkpoints kept: the latest and those of steps that are multiples of this (a full
    /// SmolLM2 checkpoint is 1.6 GB); every one by default.
    #[serde(default)]
    pub keep_every: Option<u64>,
}

impl WarmupConfig {
    /// The roles whose policies it trains: those its world demonstrates, and the solver for a
    /// user's file (rollouts).
    pub fn trained_roles(&self) -> Vec<Role> {
        let mut roles: Vec<Role> = self.world.iter().flat_map(|w| &w.roles).map(|name| role_named(name)).collect();
        if self.file.is_some() {
            roles.push(Role::Solver);
        }
        roles
    }
}

/// The supervised warm start.
pub struct Warmup {
    config: WarmupConfig,
    demonstrations: LoadOnce<Vec<Demonstration>>,
}

/// A row of `train_steps`: one micro-batch.
struct TrainRow {
    role: String,
    epoch: u64,
    optimizer_step: u64,
    micro_batch: u64,
    loss: f64,
    tokens: u64,
    trained_tokens: u64,
    grad_norm: f64,
    lr: f64,
    wall_ms: f64,
}

/// The `train_steps` table: one row per micro-batch of a training stage; `loss` is the mean
/// over its trained tokens, `grad_norm` (before clipping) and `lr` are its optimizer step's.
fn train_steps_batch(stage: &str, rows: &[TrainRow]) -> Result<RecordBatch, ArrowError> {
    Columns::default()
        .str("stage", rows.iter().map(|_| stage))
        .str("role", rows.iter().map(|r| r.role.as_str()))
        .u64("epoch", rows.iter().map(|r| r.epoch))
        .u64("optimizer_step", rows.iter().map(|r| r.optimizer_step))
        .u64("micro_batch", rows.iter().map(|r| r.micro_batch))
        .f64("loss", rows.iter().map(|r| r.loss))
        .u64("tokens", rows.iter().map(|r| r.tokens))
        .u64("trained_tokens", rows.iter().map(|r| r.trained_tokens))
        .f64("grad_norm", rows.iter().map(|r| r.grad_norm))
        .f64("lr", rows.iter().map(|r| r.lr))
        .f64("wall_ms", rows.iter().map(|r| r.wall_ms))
        .finish()
}

/// The `train_steps` table's spec.
pub fn train_steps_table() -> TableSpec {
    TableSpec::new("train_steps", schema_of(|| train_steps_batch("", &[])))
}

impl WorldDemonstrations {
    /// What is wrong with it, its keys under `at` (`world`).
    pub(super) fn problems(&self, at: &str) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        for role in &self.roles {
            if role != "solver" && role != "proposer" {
                problems.push(ConfigProblem::new(
                    format!("{at}.roles"),
                    format!("`{role}` is neither `solver` nor `proposer`"),
                ));
            }
        }
        if let Some(problem) = self.skills.as_ref().and_then(SkillShare::problem) {
            problems.push(ConfigProblem::new(format!("{at}.skills"), problem));
        }
        problems
    }

    /// Its questions file must exist (its key under `at`).
    pub(super) fn requirement(&self, at: &str) -> Requirement {
        Requirement::path(
            format!("{at}.questions"),
            &self.questions,
            "name a generated world's `questions.jsonl` (a `world:` section generates it on first use, as does \
             `sesa world generate`)",
        )
    }

    /// Writes the demonstrations (searching the run's search tool), each tokenized by the
    /// policy of the role it demonstrates.
    pub(super) async fn write(&self, selfplay: &SelfPlay) -> Result<Vec<Demonstration>, StageError> {
        let mut demonstrations = Vec::new();
        let questions = load_questions(&self.questions).map_err(|e| StageError::Failed(e.to_string()))?;
        let trainable = questions.len().saturating_sub(self.held_out);
        let used = self.limit.unwrap_or(usize::MAX).min(trainable);
        let proposed = self.proposer_limit.or(self.limit).unwrap_or(usize::MAX).min(trainable);
        // Each role's demonstrations are tokenized by the policy that plays it.
        let writer = |role| Writer {
            policy: selfplay.policy_of(role).as_ref(),
            search: selfplay.search.as_ref(),
            top_k: selfplay.top_k,
        };
        let (solver_writer, proposer_writer) = (writer(Role::Solver), writer(Role::Proposer));
        let wants = |role: &str| self.roles.iter().any(|r| r == role);
        let proposer =
            if wants("proposer") { Some(Templates::require(&selfplay.templates.proposer, "proposer")?) } else { None };
        let within = |limit: Option<u8>, q: &Question| limit.is_none_or(|m| q.supporting_titles.len() <= m as usize);
        let proposer_hops = self.proposer_max_hops.or(self.max_hops);
        let solved: Vec<&Question> =
            questions[..used].iter().filter(|q| wants("solver") && within(self.max_hops, q)).collect();
        let blocks = match &self.skills {
            Some(share) => demonstration_skills(&solved, share),
            None => vec![String::new(); solved.len()],
        };
        for (question, skills) in solved.iter().zip(&blocks) {
            let template = &selfplay.templates.solver;
            demonstrations.extend(
                solver_writer
                    .solver(template, question, skills, self.solver_thoughts)
                    .await
                    .map_err(StageError::Failed)?,
            );
        }
        // A generated world's facts let the proposer's walk back go wherever its searches
        // lead; the world is regenerated from the stamp beside its questions (only when the
        // proposer is demonstrated).
        let graph = proposer.and_then(|_| World::holding(&self.questions));
        let mut targets = HashSet::new();
        for question in &questions[..proposed] {
            let Some(template) = proposer.filter(|_| within(proposer_hops, question)) else { continue };
            let Some(answer) = question.golden_answers.first() else { continue };
            let hops = question.supporting_titles.len();
            // One demonstration per target: the same walk through the world would write the
            // same one again.
            if graph.is_some() && !targets.insert((answer, hops)) {
                continue;
            }
            let walk: &dyn WalkBack = match &graph {
                Some(world) => world,
                None => question,
            };
            demonstrations.extend(
                proposer_writer
                    .proposer(template, &self.rules, answer, hops, walk, self.proposer_facts)
                    .await
                    .map_err(StageError::Failed)?,
            );
        }
        Ok(demonstrations)
    }
}

impl Warmup {
    async fn demonstrations(&self, selfplay: &SelfPlay) -> Result<Vec<Demonstration>, StageError> {
        let mut demonstrations = Vec::new();
        if let Some(world) = &self.config.world {
            demonstrations = world.write(selfplay).await?;
        }
        if let Some(file) = &self.config.file {
            demonstrations.extend(read_user_demonstrations(file).map_err(StageError::Failed)?);
        }
        if demonstrations.is_empty() {
            return Err(StageError::Failed(
                "no demonstrations: every world question missed a search, or the file is empty".into(),
            ));
        }
        Ok(demonstrations)
    }
}

/// What training one model on its demonstrations made.
struct Trained {
    rows: Vec<TrainRow>,
    optimizer_steps: usize,
    published: Published,
    version: u64,
}

impl Warmup {
    /// Trains `training`'s model on `demonstrations` (shuffled by the step's seed in stream
    /// `stream`) and publishes the new version.
    async fn train(
        &self,
        cx: &StageContext,
        selfplay: &Arc<SelfPlay>,
        training: &Arc<Training>,
        demonstrations: Vec<Demonstration>,
        stream: u64,
    ) -> Result<Trained, StageError> {
        let roles: Vec<&'static str> = demonstrations.iter().map(|d| d.role).collect();
        let sequences: Vec<TrainSequence> = demonstrations.into_iter().map(|d| d.sequence).collect();
        // The order of each epoch: shuffled by the step's seed, then each optimizer step's
        // demonstrations grouped by role (its micro-batches then mostly hold one role).
        let mut batches: Vec<(u64, Vec<usize>)> = Vec::new();
        for epoch in 0..self.config.epochs as u64 {
            let mut order: Vec<usize> = (0..roles.len()).collect();
            order.shuffle(&mut cx.rng(stream << 32 | epoch));
            for chunk in order.chunks(self.config.batch) {
                let mut chunk = chunk.to_vec();
                chunk.sort_by_key(|&i| roles[i]);
                batches.push((epoch, chunk));
            }
        }
        let mut state = training.take().await?;
        state.optimizer_for(cx.stage_name());
        let parent = state.version;
        let optimizer = self.config.optimizer.clone();
        let mut progress = cx.progress(batches.len() as u64);
        let total = batches.len() as u64;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let worker = tokio::task::spawn_blocking(move || {
            let mut state = state;
            // The schedule spans this run's optimizer steps, after those the trainer took before.
            let last = state.trainer.adam.step + total;
            let mut reports: Vec<(u64, Vec<usize>, StepReport)> = Vec::new();
            for (epoch, chunk) in batches {
                let batch: Vec<_> = chunk.iter().map(|&i| sequences[i].clone()).collect();
                match state.trainer.supervised_step(&batch, &optimizer, last) {
                    Ok(report) => reports.push((epoch, chunk, report)),
                    Err(e) => return (state, Err(e.to_string())),
                }
                let _ = tx.send(());
            }
            (state, Ok(reports))
        });
        while rx.recv().await.is_some() {
            progress.inc(1);
        }
        let (mut state, reports) = worker.await.map_err(|e| failed("the training thread", e))?;
        let reports = match reports {
            Ok(reports) => reports,
            Err(e) => {
                training.put(state).await;
                return Err(failed("training", e));
            }
        };
        let mut rows = Vec::new();
        for (epoch, chunk, report) in &reports {
            for (m, micro) in report.micro_batches.iter().enumerate() {
                let mut held: Vec<&str> = chunk[micro.sequences.clone()].iter().map(|&i| roles[i]).collect();
                held.dedup();
                rows.push(TrainRow {
                    role: held.join("+"),
                    epoch: *epoch,
                    optimizer_step: report.optimizer_step,
                    micro_batch: m as u64,
                    loss: micro.loss / micro.scored.max(1) as f64,
                    tokens: micro.tokens as u64,
                    trained_tokens: micro.scored as u64,
                    grad_norm: report.grad_norm,
                    lr: report.lr,
                    wall_ms: micro.wall_ms,
                });
            }
        }
        state.tokens_trained += rows.iter().map(|r| r.tokens).sum::<u64>();
        let (state, published) = publish_version(cx, selfplay, training, state, parent).await?;
        let version = state.version;
        training.put(state).await;
        Ok(Trained { rows, optimizer_steps: reports.len(), published, version })
    }
}

impl Stage for Warmup {
    const KIND: &'static str = "warmup";
    const ABOUT: &'static str =
        "supervised fine-tuning on demonstrations (a generated world's, or a file of trajectories)";
    type Config = WarmupConfig;

    fn new(config: WarmupConfig) -> Result<Self, Vec<ConfigProblem>> {
        let mut problems: Vec<ConfigProblem> = config
            .optimizer
            .problems()
            .into_iter()
            .map(|(key, message)| ConfigProblem::new(format!("optimizer.{key}"), message))
            .collect();
        if config.world.is_none() && config.file.is_none() {
            problems
                .push(ConfigProblem::new("world", "give `world:` or `file:` (or both): there is nothing to train on"));
        }
        problems.extend(config.world.iter().flat_map(|w| w.problems("world")));
        if let Some(every) = config.keep_every {
            problems.extend(ConfigProblem::size("keep_every", every, 1..=u64::MAX));
        }
        problems.extend(ConfigProblem::size("epochs", config.epochs, 1..=1_000));
        problems.extend(ConfigProblem::size("batch", config.batch, 1..=100_000));
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Warmup { config, demonstrations: LoadOnce::default() })
    }

    fn outputs(&self) -> Vec<TableSpec> {
        let checkpoints = match self.config.keep_every {
            Some(every) => checkpoints_table().keep_last_and_every(every),
            None => checkpoints_table(),
        };
        vec![train_steps_table(), policy_versions_table(), checkpoints, metrics_table()]
    }

    fn requirements(&self) -> Vec<Requirement> {
        let world = self.config.world.iter().map(|world| world.requirement("world"));
        let file = self.config.file.iter().map(|file| {
            Requirement::path(
                "file",
                file,
                "name a JSONL or Parquet file of demonstrations (rows of an earlier run's `rollouts` table)",
            )
        });
        world.chain(file).collect()
    }

    async fn run(&self, cx: &StageContext, _inputs: Tables) -> Result<Tables, StageError> {
        let clock = Instant::now();
        let selfplay = cx.resource::<SelfPlay>()?;
        let demonstrations = self.demonstrations.get_async(self.demonstrations(&selfplay)).await?;
        // Training time only: writing the demonstrations (searches, tokenizing) is not training.
        let training_clock = Instant::now();
        // The demonstrations of each model trained: the shared one, or the proposer's own too.
        let groups = by_training(cx, &selfplay, Self::KIND, demonstrations.iter().map(|d| (d.played_by(), d.clone())))?;
        let (mut rows, mut published, mut optimizer_steps) = (Vec::new(), Vec::new(), 0);
        let mut metrics = Vec::new();
        for (g, (training, group)) in groups.into_iter().enumerate() {
            let trained = self.train(cx, &selfplay, &training, group, g as u64).await?;
            optimizer_steps += trained.optimizer_steps;
            rows.extend(trained.rows);
            metrics.push((training.model.version_metric().to_string(), trained.version as f64));
            published.push(trained.published);
        }
        let train_ms = elapsed_ms(training_clock);
        let published = Published::merge(published)?;
        let count = |role: &str| demonstrations.iter().filter(|d| d.role == role).count() as f64;
        let last_loss = rows.iter().rev().take(8).map(|r| r.loss).sum::<f64>() / rows.len().clamp(1, 8) as f64;
        let tokens: u64 = rows.iter().map(|r| r.tokens).sum();
        let mut all = vec![
            ("demonstrations".to_string(), demonstrations.len() as f64),
            ("solver_demonstrations".into(), count("solver")),
            ("proposer_demonstrations".into(), count("proposer")),
            ("user_demonstrations".into(), count("user")),
            ("optimizer_steps".into(), optimizer_steps as f64),
            ("tokens".into(), tokens as f64),
            ("trained_tokens".into(), rows.iter().map(|r| r.trained_tokens as f64).sum()),
            ("first_loss".into(), rows.first().map_or(0.0, |r| r.loss)),
            ("last_loss".into(), last_loss),
            ("train_ms".into(), train_ms),
            ("serve_ms".into(), published.serve_ms),
            ("checkpoint_ms".into(), published.checkpoint_ms),
        ];
        all.extend(metrics);
        // Demonstrations per role and hop count: the depths each role was shown.
        let mut shown: std::collections::BTreeMap<(&str, u8), f64> = std::collections::BTreeMap::new();
        for d in demonstrations.iter() {
            *shown.entry((d.role, d.hops)).or_default() += 1.0;
        }
        all.extend(shown.into_iter().map(|((role, hops), n)| (format!("{role}_demonstrations_h{hops}"), n)));
        all.push(("wall_ms".into(), elapsed_ms(clock)));
        Ok(Tables::new()
            .with("train_steps", train_steps_batch(cx.stage_name(), &rows)?)
            .with("policy_versions", published.policy_versions)
            .with("checkpoints", published.checkpoints)
            .with("step_metrics", metrics_batch(cx.stage_name(), &all)?))
    }
}
