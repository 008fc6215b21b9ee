//! `propose`: target answers → proposer trajectories with search → questions, each checked by
//! the SSP validity rules, with the reason recorded for every rejection.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, Requirement, Stage, StageContext, StageError, TableSpec, Tables};

use super::{LoadOnce, elapsed_ms, failed, mean, metrics_batch, metrics_table, per_hops, play, with_trajectories};
use crate::agent::{Episode, Role, Trajectory, Written};
use crate::data::world::World;
use crate::selfplay::resources::{SelfPlay, Templates};
use crate::selfplay::rules::ValidityRules;
use sesa_engine::columns::{Columns, schema_of};

/// The config of `propose`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProposeConfig {
    /// Target answers with hop counts, JSON lines `{"answer": ..., "hops": n}` (a generated
    /// world's `targets.jsonl`). Step s takes the next `batch` of them, wrapping around.
    pub targets: PathBuf,
    /// Targets per step (SSP: 256).
    pub batch: usize,
    /// The rule-based validity checks.
    #[serde(default)]
    pub rules: ValidityRules,
    /// Only targets of at least this many hops (a one-hop question rarely needs SSP's two
    /// searches or reaches its ten words).
    #[serde(default)]
    pub min_hops: Option<u64>,
    /// Only targets of at most this many hops.
    #[serde(default)]
    pub max_hops: Option<u64>,
    /// Help for a proposer that stops walking before the searches its hop count needs.
    #[serde(default)]
    pub guidance: ProposerGuidance,
}

/// Help for a proposer that writes its question too early.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProposerGuidance {
    /// None: the question is checked as written.
    #[default]
    None,
    /// Where the proposer opens its question before the searches the rules need for the
    /// requested hops (`rules.searches_needed`), the opening is taken back and `<search>`
    /// written in its place: the proposer writes the next query itself, reads, and goes on.
    /// The written tag is trained as written; the proposal is recorded `guided`.
    Searches,
}

/// The proposer: writes a question for each target answer.
pub struct Propose {
    config: ProposeConfig,
    targets: LoadOnce<Vec<Target>>,
    /// The generated world the targets were drawn from, when they were: it tells what each
    /// question really asks.
    world: LoadOnce<Option<World>>,
}

#[derive(Debug, Deserialize)]
struct Target {
    answer: String,
    #[serde(default = "two")]
    hops: u64,
}

fn two() -> u64 {
    2
}

/// A checked proposal.
struct Proposal {
    target: Target,
    trajectory: Trajectory,
    question: Option<String>,
    verdict: Result<String, String>,
    /// What the question asks in the targets' world (answer, hops), when it reads as that
    /// world's questions do.
    asks: Option<(String, u64)>,
}

impl Proposal {
    /// Whether the question asks, in the targets' world, for its target at the requested depth.
    fn right(&self) -> bool {
        self.asks.as_ref().is_some_and(|(answer, hops)| *answer == self.target.answer && *hops == self.target.hops)
    }
}

fn proposals_batch(proposals: &[Proposal]) -> Result<RecordBatch, ArrowError> {
    let columns = Columns::default()
        .u64("item", 0..proposals.len() as u64)
        .str("target", proposals.iter().map(|p| p.target.answer.as_str()))
        .u64("hops", proposals.iter().map(|p| p.target.hops))
        .opt_str("question", proposals.iter().map(|p| p.verdict.as_ref().ok().map(String::as_str)))
        .opt_str("raw_question", proposals.iter().map(|p| p.question.as_deref()))
        .bool("valid", proposals.iter().map(|p| p.verdict.is_ok()))
        .opt_str("world_answer", proposals.iter().map(|p| p.asks.as_ref().map(|(answer, _)| answer.as_str())))
        .opt_u64("world_hops", proposals.iter().map(|p| p.asks.as_ref().map(|(_, hops)| *hops)))
        .str("reason", proposals.iter().map(|p| p.verdict.as_ref().err().map_or("", String::as_str)))
        .bool("guided", proposals.iter().map(|p| p.trajectory.searches_written > 0))
        .u64("written_searches", proposals.iter().map(|p| p.trajectory.searches_written as u64))
        .str(
            "materials",
            proposals.iter().map(|p| materials(&p.trajectory.response)).collect::<Vec<_>>().iter().map(String::as_str),
        );
    let trajectories: Vec<Trajectory> = proposals.iter().map(|p| p.trajectory.clone()).collect();
    with_trajectories(columns, &trajectories).finish()
}

/// Target answers from a JSON-lines file, with the line of any bad one, less those outside
/// `hops` (inclusive).
fn load_targets(path: &std::path::Path, hops: (u64, u64)) -> Result<Vec<Target>, StageError> {
    let text = std::fs::read_to_string(path).map_err(|e| failed(&format!("reading {}", path.display()), e))?;
    let targets: Vec<Target> = text
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(n, line)| serde_json::from_str(line).map_err(|e| failed(&format!("{}:{}", path.display(), n + 1), e)))
        .collect::<Result<Vec<Target>, _>>()?
        .into_iter()
        .filter(|t| (hops.0..=hops.1).contains(&t.hops))
        .collect();
    if targets.is_empty() {
        return Err(failed(
            &path.display().to_string(),
            format!("no target answers of {} to {} hops (min_hops, max_hops)", hops.0, hops.1),
        ));
    }
    Ok(targets)
}

/// Everything the proposer retrieved: the contents of its `<information>` blocks.
pub fn materials(response: &str) -> String {
    let mut blocks = Vec::new();
    let mut rest = response;
    while let Some(start) = rest.find("<information>") {
        let after = &rest[start + "<information>".len()..];
        let Some(end) = after.find("</information>") else {
            break;
        };
        blocks.push(after[..end].trim());
        rest = &after[end + "</information>".len()..];
    }
    blocks.join("\n\n")
}

impl Propose {
    /// The `proposals` table, as the stages that read it declare it.
    pub fn proposals_table() -> TableSpec {
        TableSpec::new("proposals", schema_of(|| proposals_batch(&[])))
    }
}

impl Stage for Propose {
    const KIND: &'static str = "propose";
    const ABOUT: &'static str =
        "proposer trajectories with search: a question for each target answer, checked by the SSP rules";
    type Config = ProposeConfig;

    fn new(config: ProposeConfig) -> Result<Self, Vec<ConfigProblem>> {
        let mut problems = Vec::new();
        problems.extend(ConfigProblem::size("batch", config.batch, 1..=100_000));
        if config.rules.min_chars > config.rules.max_chars {
            problems.push(ConfigProblem::new("rules.min_chars", "cannot exceed rules.max_chars"));
        }
        if let (Some(min), Some(max)) = (config.min_hops, config.max_hops)
            && min > max
        {
            problems.push(ConfigProblem::new("min_hops", format!("{min} exceeds max_hops ({max})")));
        }
        if problems.is_empty() {
            Ok(Propose { config, targets: LoadOnce::default(), world: LoadOnce::default() })
        } else {
            Err(problems)
        }
    }

    fn outputs(&self) -> Vec<TableSpec> {
        vec![Propose::proposals_table(), metrics_table()]
    }

    fn requirements(&self) -> Vec<Requirement> {
        let targets = self.config.targets.display();
        vec![Requirement::path(
            "targets",
            &self.config.targets,
            format!(
                "write it from question sets with `sesa data targets QUESTIONS.jsonl … --out {targets}` (their \
                 answers, each with a hop count), or name a generated world's `targets.jsonl` with a `world:` section"
            ),
        )]
    }

    async fn run(&self, cx: &StageContext, _inputs: Tables) -> Result<Tables, StageError> {
        let clock = Instant::now();
        let selfplay = cx.resource::<SelfPlay>()?;
        let template = Templates::require(&selfplay.templates.proposer, "proposer")?;
        let hops = (self.config.min_hops.unwrap_or(0), self.config.max_hops.unwrap_or(u64::MAX));
        let all = self.targets.get(|| load_targets(&self.config.targets, hops))?;
        let world = self.world.get(|| Ok(World::holding(&self.config.targets)))?;
        let start = (cx.step() - 1) as usize * self.config.batch;
        let targets: Vec<Target> = (0..self.config.batch)
            .map(|i| {
                let t = &all[(start + i) % all.len()];
                Target { answer: t.answer.clone(), hops: t.hops }
            })
            .collect();
        let episodes: Vec<Episode> =
            targets
                .iter()
                .enumerate()
                .map(|(i, target)| Episode {
                    prompt: selfplay.policy_of(Role::Proposer).render_chat(&template.render(&BTreeMap::from([
                        ("answer", target.answer.clone()),
                        ("hops", target.hops.to_string()),
                    ]))),
                    seed: cx.seed(i as u64),
                    written: (self.config.guidance == ProposerGuidance::Searches).then(|| Written {
                        searches: self.config.rules.searches_needed(target.hops),
                        ..Written::default()
                    }),
                })
                .collect();
        let (trajectories, generation_ms, search_ms) = play(cx, &selfplay, Role::Proposer, &episodes).await?;
        let proposals: Vec<Proposal> = targets
            .into_iter()
            .zip(trajectories)
            .map(|(target, trajectory)| {
                let question = trajectory.outcome.final_text().map(str::to_string);
                let verdict = self.config.rules.check(
                    question.as_deref(),
                    &target.answer,
                    target.hops,
                    &trajectory.queries(),
                    &materials(&trajectory.response),
                );
                let asks = question.as_deref().zip(Option::as_ref(&world)).and_then(|(q, world)| world.answer_to(q));
                Proposal { target, trajectory, question, verdict, asks }
            })
            .collect();
        let valid = |p: &Proposal| f64::from(p.verdict.is_ok() as u8);
        let mut metrics = vec![
            ("proposals".to_string(), proposals.len() as f64),
            ("valid_rate".into(), mean(proposals.iter().map(valid))),
        ];
        metrics.extend(per_hops("valid_rate", proposals.iter().map(|p| (p.target.hops, valid(p)))));
        // Only where the targets' world can tell: the share of questions that ask for their
        // target at the requested depth, whatever the rules and the verifier said.
        if world.is_some() {
            let right = |p: &Proposal| f64::from(p.right() as u8);
            metrics.push(("right_rate".into(), mean(proposals.iter().map(right))));
            metrics.extend(per_hops("right_rate", proposals.iter().map(|p| (p.target.hops, right(p)))));
        }
        // Searches of the valid proposals by requested hops: whether the proposer walks as far
        // as it is asked.
        let searched = proposals.iter().filter(|p| p.verdict.is_ok());
        metrics.extend(per_hops("searches", searched.map(|p| (p.target.hops, p.trajectory.queries().len() as f64))));
        if self.config.guidance != ProposerGuidance::None {
            let written = |p: &Proposal| p.trajectory.searches_written as f64;
            metrics.extend(per_hops("written_searches", proposals.iter().map(|p| (p.target.hops, written(p)))));
        }
        metrics.extend([
            ("tokens".into(), proposals.iter().map(|p| p.trajectory.generated_tokens() as f64).sum()),
            ("generation_ms".into(), generation_ms),
            ("search_ms".into(), search_ms),
            ("wall_ms".into(), elapsed_ms(clock)),
        ]);
        Ok(Tables::new()
            .with("proposals", proposals_batch(&proposals)?)
            .with("step_metrics", metrics_batch(cx.stage_name(), &metrics)?))
    }
}
