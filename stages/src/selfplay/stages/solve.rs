//! `solve`: `n_rollouts` solver trajectories per question. With a skill memory, the top-k skills
//! retrieved for the question are in the solver's prompt and recorded; this is the only stage
//! that retrieves skills.
//!
//! With `guidance: hint`, a question whose every rollout failed gets one more rollout whose
//! prompt carries a hint from how the question was built (`verifications.path`: the entities
//! the proposer's searches walked through, or a generated world's supporting chain), in the
//! order a solver meets them. The guided rollout is recorded under the unhinted prompt
//! (`guided: true`, the hint in `hint`), so the update trains its tokens as the answer to the
//! question alone: privileged-context self-distillation, with its sampling log-probabilities
//! (under the hint) kept for the off-policy correction. With `guidance: plan`, the extra
//! rollout keeps the bare prompt and its response opens with a written plan of the question's
//! chain, which the solver then carries out: the depth a small solver never plans on its own
//! is written for it, and a success trains the plan (`loss_mask` 2) under the bare prompt.
//! With `guidance: probe`, the extra rollout searches once more than any of its group did: one
//! more hop is opened in its plan (" Then the"), " Next, the" written where a later thought
//! closes before that, and `<search>` in place of an answer's tag. Nothing about the question
//! is written, so it works on any question, and set against its group it is meant as a
//! contrast at the depth decision itself.

use std::collections::BTreeMap;
use std::time::Instant;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, Stage, StageContext, StageError, TableSpec, Tables};

use super::{elapsed_ms, failed, metrics_batch, metrics_table, play, skill_events_table, with_trajectories};
use crate::agent::{Episode, Role, Trajectory, Written};
use crate::data::world::World;
use crate::memory::{ChainReader, SkillEvent, SkillEventKind, UsageRule, cosine, events_batch};
use crate::sections::{RetrieveBy, ShowSkills};
use crate::selfplay::demonstrations::{NEXT_HOP, plan_thought};
use crate::selfplay::resources::{SelfPlay, SkillMemory};
use crate::selfplay::rules::solver_reward;
use sesa_engine::columns::{Columns, Reader, schema_of};

/// The config of `solve`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SolveConfig {
    /// Trajectories per question: the GRPO group (SSP: 5).
    pub n_rollouts: usize,
    /// The first step whose solver sees skills. Later than 1, the steps before it are bootstrap
    /// mining: self-play without memory whose failures the first consolidation distils into
    /// the initial bank (with `consolidate` scheduled at that step).
    #[serde(default = "first_step")]
    pub skills_from_step: u64,
    /// Help for a group that never succeeds (its GRPO advantages are all 0: it teaches
    /// nothing). Never applied by `evaluate`.
    #[serde(default)]
    pub guidance: Guidance,
    /// Guided rollouts a group that never succeeded gets (with `guidance` other than `none`):
    /// more of them give a group more chances at the success that carries its gradient.
    #[serde(default = "super::one")]
    pub guided_rollouts: usize,
    /// Which groups `guidance` helps: `failed` (the default), those whose rollouts all failed;
    /// `all`, every group, so that plans are also written for the depths the solver already
    /// answers ("I need the founder of X." and no step further) and the written tokens teach
    /// each question's own depth, not only to go on searching.
    #[serde(default)]
    pub guided_groups: GuidedGroups,
    /// Only questions at least this many hops deep are guided (the chain the generated world's
    /// grammar reads in the question, as a plan is written from, else the depth
    /// `verifications.hops` records; a question of unknown depth is guided). The default,
    /// 1, guides every depth; with solver demonstrations of one and two hops, `3` leaves the
    /// depths the solver was shown to learn unguided and guides only those it never saw.
    #[serde(default = "super::one")]
    pub guided_min_hops: usize,
}

/// Which groups get guided rollouts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GuidedGroups {
    /// Groups whose rollouts all failed: the only ones without a GRPO gradient.
    #[default]
    Failed,
    /// Every group.
    All,
}

/// What a group whose rollouts all failed gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Guidance {
    /// Nothing.
    #[default]
    None,
    /// One more rollout with the question's construction path as a hint in its prompt,
    /// trained as if the prompt had no hint (questions with a path: the proposer's, or a
    /// generated world's substitutes).
    Hint,
    /// One more rollout whose response opens with the plan a solver's demonstration opens
    /// with, written from the question's own chain ("I need the spouse of X, then the
    /// birthplace of it, then the country of it."); the solver carries it out under its own
    /// prompt. The plan's tokens are trained as written, the rest as sampled. Questions in the
    /// generated world's grammar only (the chain is read from the question's text).
    Plan,
    /// One more rollout that searches at least once more than any rollout of its group did
    /// ([`probe`]: one more hop opened in its plan, the next hop opened in later thoughts, and
    /// `<search>` in place of an early answer, all trained as written); the solver names each
    /// relation, writes the queries and goes on. It writes nothing about the question (any
    /// question, any world). Beside its group it shows what one more search was worth: a deep
    /// question's probe may find the answer the group stopped short of, and with
    /// `reward.excess_search_cost` a shallow question's probe earns less than the rollouts that
    /// stopped. A group whose rollouts used every search the turn limit allows gets none.
    Probe,
}

/// What a plan-guided rollout of `question` has written, or `None` when the question is not in
/// the generated world's grammar: the plan of its chain, the first thought of a solver's
/// demonstration; and in the thought of each turn that has read a hop short of the end, the
/// step on to the next relation (" Next, the country of"), where a solver shown only two hops
/// closes the thought and answers instead. The demonstrations' later thoughts read the same:
/// "The birthplace of Orla Veny is Dunmere. Next, the country of Dunmere."
pub fn plan(question: &str) -> Option<Written> {
    let (start, relations) = World::read_question(question)?;
    Some(plan_of(&start, &relations))
}

/// What a plan of the chain from `start` along `relations` writes (see [`plan`]).
fn plan_of(start: &str, relations: &[impl AsRef<str>]) -> Written {
    let opening = format!("<think>{}</think>\n", plan_thought(start, relations));
    // Turn k has read k results; relation k follows.
    let in_thought =
        (0..relations.len()).map(|k| (k > 0).then(|| format!(" {NEXT_HOP} {} of", relations[k].as_ref()))).collect();
    Written { opening, in_thought, searches: 0 }
}

/// What a probe of `searches` searches has written: one more hop opened in the plan of its
/// first thought (" Then the", where it closes without one), and wherever a later thought
/// closes before that many searches, the step on to a next hop (" Next, the"), each relation
/// and entity left to the solver; where it opens its answer all the same, `<search>` in its
/// place. The tag alone is not enough: after a thought that has concluded ("The birthplace of
/// X is C."), a solver sent to search again repeats its last query; and a plan of two hops is
/// carried out as planned, the next hop named after its second relation again.
fn probe(searches: usize) -> Written {
    let in_thought = (0..searches).map(|turn| Some(format!(" {}", if turn == 0 { PLAN_ONE_MORE } else { NEXT_HOP })));
    Written { opening: String::new(), in_thought: in_thought.collect(), searches }
}

/// How a probe opens one more hop in a plan that has closed.
const PLAN_ONE_MORE: &str = "Then the";

/// The help a guided rollout gets.
#[derive(Clone)]
enum Help {
    /// Appended to the question in its prompt.
    Hint(String),
    /// Written into its response.
    Plan(Written),
    /// A search opened for it until it has made this many.
    Probe(usize),
}

impl Help {
    /// As the `hint` column records it.
    fn recorded(self) -> String {
        match self {
            Help::Hint(hint) => hint,
            Help::Plan(written) => written.opening,
            Help::Probe(searches) => format!("probe: {searches} searches"),
        }
    }
}

/// The hint of a question from the path it was built along (searches, in the order a solver
/// makes them), or `None` when the path holds nothing but the answer: entries holding the
/// answer would give it away and are left out. It follows the question in the user's message,
/// where a small model reads it (in the system message, beside skills, SmolLM2-135M ignored it).
pub fn hint(path: &[String], target: &str) -> Option<String> {
    let target = target.to_lowercase();
    let path: Vec<&str> =
        path.iter().map(|s| s.trim()).filter(|s| !s.is_empty() && !s.to_lowercase().contains(&target)).collect();
    if path.is_empty() {
        return None;
    }
    Some(format!("\nHint: search {}, one at a time, then answer from the last.", path.join(", then ")))
}

fn first_step() -> u64 {
    1
}

/// The solver.
pub struct Solve {
    config: SolveConfig,
}

/// One solver trajectory with what it was asked.
pub(super) struct Rollout {
    item: u64,
    rollout: u64,
    question: String,
    target: String,
    source: String,
    skill_ids: Vec<String>,
    /// For a guided rollout, the hint its prompt carried (recorded under the unhinted prompt)
    /// or the plan its response opened with.
    hint: Option<String>,
    trajectory: Trajectory,
}

fn rollouts_batch(rows: &[Rollout]) -> Result<RecordBatch, ArrowError> {
    let answers: Vec<Option<&str>> = rows.iter().map(|r| r.trajectory.outcome.final_text()).collect();
    let columns = Columns::default()
        .u64("item", rows.iter().map(|r| r.item))
        .u64("rollout", rows.iter().map(|r| r.rollout))
        .str("question", rows.iter().map(|r| r.question.as_str()))
        .str("target", rows.iter().map(|r| r.target.as_str()))
        .str("source", rows.iter().map(|r| r.source.as_str()))
        .strs("skill_ids", rows.iter().map(|r| r.skill_ids.iter().map(String::as_str)))
        .opt_str("answer", answers)
        .bool("guided", rows.iter().map(|r| r.hint.is_some()))
        .opt_str("hint", rows.iter().map(|r| r.hint.as_deref()));
    let trajectories: Vec<Trajectory> = rows.iter().map(|r| r.trajectory.clone()).collect();
    with_trajectories(columns, &trajectories).finish()
}

impl Solve {
    /// The `rollouts` table, as the stages that read it declare it.
    pub fn rollouts_table() -> TableSpec {
        TableSpec::new("rollouts", schema_of(|| rollouts_batch(&[])))
    }
}

/// What a solver is shown for one question under its memory's rules, as `solve`, `evaluate`
/// and `sesa ask` show it with memory on.
#[derive(Clone, Default)]
pub struct Shown {
    /// The skills block of its prompt (empty under `show: plan`, or when none was retrieved).
    pub block: String,
    /// Under `show: plan`, what the plan writes into its response.
    pub plan: Option<Written>,
    /// (skill id, description, similarity) of each skill shown or read into the plan.
    pub skills: Vec<(String, String, f32)>,
}

/// The skills retrieved for a batch of questions.
pub(super) struct Retrieval {
    /// Per question, what it is shown.
    pub(super) shown: Vec<Shown>,
    /// The bank version retrieved from (0 without memory).
    pub(super) version: u64,
}

impl Retrieval {
    pub(super) fn none(questions: usize) -> Retrieval {
        Retrieval { shown: vec![Shown::default(); questions], version: 0 }
    }
}

impl SkillMemory {
    /// What the solver is shown for `question` (for `sesa ask`: one question at a time). Beside
    /// `retrieve`, not in `resources`, so that the one retrieval stays private to this module.
    pub fn shown(&self, question: &str) -> Result<Shown, StageError> {
        Ok(retrieve(self, &[question])?.shown.pop().unwrap_or_default())
    }
}

/// The top-k skills of the bank for each question, less those under the memory's
/// `min_similarity`: one embedding batch, then exact top-k. By `pattern`, the questions'
/// patterns are compared with the skills' triggers (embedded once each, then cached). Under
/// `show: plan`, the skills each question's plan is read from, and the plan.
pub(super) fn retrieve(memory: &SkillMemory, questions: &[&str]) -> Result<Retrieval, StageError> {
    let plans = memory.show == ShowSkills::Plan;
    // A plan is read from templates, so its skills are compared with the question's pattern.
    let by_pattern = plans || memory.retrieve_by == RetrieveBy::Pattern;
    let keys: Vec<String> =
        questions.iter().map(|q| if by_pattern { crate::memory::question_pattern(q) } else { q.to_string() }).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let vectors = memory.embedder.embed(&keys).map_err(|e| failed("embedding questions", e))?;
    let bank = memory.bank.lock().expect("bank lock");
    let triggers = if by_pattern {
        let texts: Vec<&str> = bank.skills().iter().map(|s| s.text.trigger.as_str()).collect();
        Some(memory.embedder.embed(&texts).map_err(|e| failed("embedding skill triggers", e))?)
    } else {
        None
    };
    let texts: Vec<&crate::memory::SkillText> =
        if plans { bank.skills().iter().map(|s| &s.text).collect() } else { Vec::new() };
    let reader = plans.then(|| ChainReader::new(&texts));
    let mut retrieval = Retrieval::none(questions.len());
    retrieval.version = bank.version();
    for (k, vector) in vectors.iter().enumerate() {
        let top: Vec<(&crate::memory::Skill, f32)> = match (&reader, &triggers) {
            // Every skill a plan is read from, with its trigger's cosine to the pattern; `top_k`
            // and `min_similarity` do not apply (a template matches or not).
            (Some(reader), Some(triggers)) => {
                let composed = reader.read(questions[k]);
                let skills = composed.iter().flat_map(|c| &c.skills);
                let top = skills.map(|&i| (&bank.skills()[i], cosine(&triggers[i], vector))).collect();
                retrieval.shown[k].plan = composed.map(|c| plan_of(&c.start, &c.relations));
                top
            }
            _ => {
                let mut top = match &triggers {
                    Some(triggers) => bank.top_k_among(triggers, vector, memory.top_k),
                    None => bank.top_k(vector, memory.top_k),
                };
                top.retain(|&(_, similarity)| memory.min_similarity.is_none_or(|least| similarity >= least));
                let skills: Vec<&crate::memory::Skill> = top.iter().map(|(s, _)| *s).collect();
                retrieval.shown[k].block = crate::memory::prompt_block(&skills);
                top
            }
        };
        retrieval.shown[k].skills =
            top.iter().map(|(s, similarity)| (s.id.clone(), s.text.description.clone(), *similarity)).collect();
    }
    Ok(retrieval)
}

impl Stage for Solve {
    const KIND: &'static str = "solve";
    const ABOUT: &'static str =
        "solver trajectories per question, with the top-k retrieved skills in the prompt when memory is on";
    type Config = SolveConfig;

    fn new(config: SolveConfig) -> Result<Self, Vec<ConfigProblem>> {
        let mut problems = Vec::new();
        problems.extend(ConfigProblem::size("n_rollouts", config.n_rollouts, 1..=4_096));
        problems.extend(ConfigProblem::size("guided_rollouts", config.guided_rollouts, 1..=4_096));
        problems.extend(ConfigProblem::size("guided_min_hops", config.guided_min_hops, 1..=64));
        if config.guided_min_hops > 1 && config.guidance == Guidance::None {
            problems.push(ConfigProblem::new(
                "guided_min_hops",
                "chooses the questions `guidance` helps, and `guidance` is `none`: set `guidance: plan`, `hint` or `probe`, or remove the key",
            ));
        }
        if config.guided_groups == GuidedGroups::All && config.guidance == Guidance::None {
            problems.push(ConfigProblem::new(
                "guided_groups",
                "`all` chooses the groups `guidance` helps, and `guidance` is `none`: set `guidance: plan`, `hint` or `probe`, or remove the key",
            ));
        }
        if problems.is_empty() { Ok(Solve { config }) } else { Err(problems) }
    }

    fn inputs(&self) -> Vec<TableSpec> {
        vec![super::verify::Verify::verifications_table()]
    }

    fn outputs(&self) -> Vec<TableSpec> {
        vec![Solve::rollouts_table(), skill_events_table(), metrics_table()]
    }

    async fn run(&self, cx: &StageContext, inputs: Tables) -> Result<Tables, StageError> {
        let clock = Instant::now();
        let selfplay = cx.resource::<SelfPlay>()?;
        let memory = cx.resource::<SkillMemory>().ok().filter(|_| cx.step() >= self.config.skills_from_step);
        let batch = inputs.get("verifications")?;
        let verifications = Reader::new("verifications", batch);
        let items = verifications.u64("item")?;
        let questions = verifications.opt_str("solver_question")?;
        let targets = verifications.str("solver_target")?;
        let sources = verifications.str("source")?;
        let asked: Vec<usize> = (0..verifications.rows()).filter(|&i| questions[i].is_some()).collect();

        // Retrieval: one embedding batch, then top-k per question.
        let texts: Vec<&str> = asked.iter().map(|&i| questions[i].unwrap_or_default()).collect();
        let retrieval = match &memory {
            Some(memory) => retrieve(memory, &texts)?,
            None => Retrieval::none(texts.len()),
        };
        let version = retrieval.version;
        let retrieved: Vec<Vec<String>> =
            retrieval.shown.iter().map(|s| s.skills.iter().map(|(id, _, _)| id.clone()).collect()).collect();
        let mut events = Vec::new();
        for (k, shown) in retrieval.shown.iter().enumerate() {
            for (id, description, similarity) in &shown.skills {
                events.push(SkillEvent {
                    similarity: Some(*similarity),
                    question_id: Some(format!("s{}-{}", cx.step(), items[asked[k]])),
                    ..SkillEvent::new(
                        SkillEventKind::Retrieved,
                        id.clone(),
                        description.clone(),
                        if shown.plan.is_some() { "written as the solver's plan" } else { "in the solver's prompt" }
                            .into(),
                    )
                });
            }
        }

        let template = &selfplay.templates.solver;
        let render = |question: &str, block: String| {
            selfplay
                .policy
                .render_chat(&template.render(&BTreeMap::from([("question", question.to_string()), ("skills", block)])))
        };
        // Counterfactual usage: a group's odd-numbered rollouts are answered without the
        // question's skills, the contrast that credits them.
        let counterfactual =
            memory.as_ref().is_some_and(|m| m.bank.lock().expect("bank lock").usage() == UsageRule::Counterfactual);
        let n_rollouts = self.config.n_rollouts as u64;
        let shown = |k: usize, rollout: u64| {
            if counterfactual && rollout < n_rollouts && rollout % 2 == 1 { &[][..] } else { &retrieved[k][..] }
        };
        let mut episodes = Vec::new();
        let mut rows = Vec::new();
        for (k, &i) in asked.iter().enumerate() {
            let question = questions[i].unwrap_or_default();
            let (with, without) = (render(question, retrieval.shown[k].block.clone()), render(question, String::new()));
            for rollout in 0..n_rollouts {
                let bare = shown(k, rollout).is_empty() && !retrieved[k].is_empty();
                episodes.push(Episode {
                    prompt: if bare { &without } else { &with }.clone(),
                    seed: cx.seed((items[i] << 20) | rollout),
                    written: if bare { None } else { retrieval.shown[k].plan.clone() },
                });
                rows.push((k, i, rollout));
            }
        }
        let (trajectories, mut generation_ms, mut search_ms) = play(cx, &selfplay, Role::Solver, &episodes).await?;
        let record = |(k, i, rollout): (usize, usize, u64), hint: Option<String>, trajectory| Rollout {
            item: items[i],
            rollout,
            question: questions[i].unwrap_or_default().to_string(),
            target: targets[i].to_string(),
            source: sources[i].to_string(),
            skill_ids: shown(k, rollout).to_vec(),
            hint,
            trajectory,
        };
        let mut rollouts: Vec<Rollout> =
            rows.into_iter().zip(trajectories).map(|(row, t)| record(row, None, t)).collect();
        if self.config.guidance != Guidance::None {
            let paths = verifications.strs("path")?;
            let depths = verifications.opt_u64("hops")?;
            let mut guided = Vec::new();
            for (k, &i) in asked.iter().enumerate() {
                let group = &rollouts[k * self.config.n_rollouts..(k + 1) * self.config.n_rollouts];
                let question = questions[i].unwrap_or_default();
                let depth = World::read_question(question).map(|(_, chain)| chain.len() as u64).or(depths[i]);
                let deep_enough = depth.is_none_or(|hops| hops >= self.config.guided_min_hops as u64);
                let guide = deep_enough
                    && match self.config.guided_groups {
                        GuidedGroups::All => true,
                        GuidedGroups::Failed => {
                            let golds = [targets[i].to_string()];
                            group.iter().all(|r| {
                                solver_reward(&r.trajectory.response, r.trajectory.outcome.final_text(), &golds, None)
                                    == 0.0
                            })
                        }
                    };
                if !guide {
                    continue;
                }
                let help = match self.config.guidance {
                    Guidance::Hint => hint(&paths[i], targets[i]).map(Help::Hint),
                    Guidance::Probe => {
                        let most = group.iter().map(|r| r.trajectory.queries().len()).max().unwrap_or(0);
                        // A search asked for on the last turn is not run.
                        (most + 1 < selfplay.agent.limits().max_turns).then_some(Help::Probe(most + 1))
                    }
                    Guidance::Plan | Guidance::None => plan(question).map(Help::Plan),
                };
                if let Some(help) = help {
                    // Rollout numbers go on from the group's own; the first guided one's seed is
                    // what it was when a group got only one.
                    let first = self.config.n_rollouts as u64;
                    for rollout in first..first + self.config.guided_rollouts as u64 {
                        guided.push((k, i, rollout, help.clone()));
                    }
                }
            }
            let episodes: Vec<Episode> = guided
                .iter()
                .map(|(k, i, rollout, help)| {
                    let question = questions[*i].unwrap_or_default();
                    let seed = cx.seed((items[*i] << 20) | rollout);
                    match help {
                        Help::Hint(hint) => {
                            Episode::new(render(&format!("{question}{hint}"), retrieval.shown[*k].block.clone()), seed)
                        }
                        Help::Plan(written) => Episode {
                            prompt: render(question, retrieval.shown[*k].block.clone()),
                            seed,
                            written: Some(written.clone()),
                        },
                        Help::Probe(searches) => Episode {
                            prompt: render(question, retrieval.shown[*k].block.clone()),
                            seed,
                            written: Some(probe(*searches)),
                        },
                    }
                })
                .collect();
            let (trajectories, generation, search) = play(cx, &selfplay, Role::Solver, &episodes).await?;
            (generation_ms, search_ms) = (generation_ms + generation, search_ms + search);
            for ((k, i, rollout, help), mut trajectory) in guided.into_iter().zip(trajectories) {
                if let Help::Hint(_) = help {
                    // Recorded under the prompt without the hint, the group's own: what the
                    // update trains it as.
                    let bare = &rollouts[k * self.config.n_rollouts].trajectory;
                    trajectory.prompt.clone_from(&bare.prompt);
                    trajectory.prompt_ids.clone_from(&bare.prompt_ids);
                    trajectory.prompt_tokens = bare.prompt_tokens;
                }
                rollouts.push(record((k, i, rollout), Some(help.recorded()), trajectory));
            }
        }
        let metrics = [
            ("questions", asked.len() as f64),
            ("rollouts", rollouts.len() as f64),
            ("skills_retrieved", events.len() as f64),
            ("tokens", rollouts.iter().map(|r| r.trajectory.generated_tokens() as f64).sum()),
            ("generation_ms", generation_ms),
            ("search_ms", search_ms),
            ("wall_ms", elapsed_ms(clock)),
        ];
        Ok(Tables::new()
            .with("rollouts", rollouts_batch(&rollouts)?)
            .with("skill_events", events_batch(version, &events)?)
            .with("step_metrics", metrics_batch(cx.stage_name(), &metrics)?))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::{RetrieveBy, hint, retrieve};
    use crate::memory::{CachedEmbedder, HashedWords, Skill, SkillBank, SkillMeta, SkillText};
    use crate::sections::{MemorySection, ShowSkills};
    use crate::selfplay::{FailureQueue, SkillMemory};

    fn memory(min_similarity: Option<f32>) -> SkillMemory {
        memory_by(min_similarity, RetrieveBy::Question)
    }

    fn memory_by(min_similarity: Option<f32>, retrieve_by: RetrieveBy) -> SkillMemory {
        let embedder = CachedEmbedder::new(Box::new(HashedWords::new(256)));
        let skill = Skill {
            id: "s1-0".into(),
            text: SkillText {
                description: "For where a founder was born, search the founder of the company first".into(),
                trigger: "where was the founder of a company born".into(),
                avoid: vec![],
                query_template: "founder of <company>".into(),
            },
            meta: SkillMeta::default(),
        };
        let bank = SkillBank::embedded(MemorySection::default_bank_config(), vec![skill], 1, &embedder).unwrap();
        SkillMemory {
            bank: Mutex::new(bank),
            embedder,
            top_k: 3,
            min_similarity,
            retrieve_by,
            show: ShowSkills::Prompt,
            queue: Mutex::new(FailureQueue::new(10)),
        }
    }

    #[test]
    fn a_similarity_threshold_shows_no_skill_to_an_unrelated_question() {
        let questions = ["Where was the founder of Vexa Labs born?", "Which river flows through Orlin?"];
        let all = retrieve(&memory(None), &questions).unwrap();
        assert!(all.shown.iter().all(|s| s.skills.len() == 1), "without a threshold every question gets the top skill");
        let (related, unrelated) = (all.shown[0].skills[0].2, all.shown[1].skills[0].2);
        assert!(related > 0.3 && unrelated < 0.1, "cosines {related} and {unrelated}");
        let some = retrieve(&memory(Some(0.3)), &questions).unwrap();
        assert_eq!(some.shown[0].skills.len(), 1);
        assert!(
            some.shown[1].skills.is_empty() && some.shown[1].block.is_empty(),
            "the unrelated question is shown none"
        );
        assert!(!some.shown[0].block.is_empty());
        // One question at a time (`sesa ask --memory`), the same.
        let (one, other) =
            (memory(Some(0.3)).shown(questions[0]).unwrap(), memory(Some(0.3)).shown(questions[1]).unwrap());
        assert_eq!((one.block, one.plan, one.skills.len()), (some.shown[0].block.clone(), None, 1));
        assert_eq!((other.block.as_str(), other.skills.len()), ("", 0));
    }

    #[test]
    fn by_pattern_a_question_meets_the_skills_of_its_own_template() {
        let memory = memory_by(Some(0.99), RetrieveBy::Pattern);
        let induced = SkillText {
            description: "Search one hop at a time, 2 searches: \"<entity> founder\", then \"<result 1> birthplace\""
                .into(),
            trigger: "Where was the founder of <entity> born?".into(),
            avoid: vec![],
            query_template: "<entity> founder → <result 1> birthplace".into(),
        };
        {
            let mut bank = memory.bank.lock().unwrap();
            let vector = memory.embedder.embed(&[induced.embedding_text().as_str()]).unwrap().remove(0);
            let events = bank.admit("s2-0".into(), induced, SkillMeta::default(), vector);
            assert_eq!(events[0].kind, crate::memory::SkillEventKind::Added);
        }
        let questions =
            ["Where was the founder of Orla Dunmere Works born?", "Where was the mother of Orla Dunmere born?"];
        let shown = retrieve(&memory, &questions).unwrap();
        assert_eq!(shown.shown[0].skills.iter().map(|s| s.0.as_str()).collect::<Vec<_>>(), ["s2-0"]);
        assert!(shown.shown[0].skills[0].2 > 0.999, "the same pattern: {}", shown.shown[0].skills[0].2);
        assert!(shown.shown[1].skills.is_empty(), "another template is shown none");
        let by_question = retrieve(&memory_by(Some(0.99), RetrieveBy::Question), &questions).unwrap();
        assert!(by_question.shown.iter().all(|s| s.skills.is_empty()), "names keep the question far from any skill");
    }

    #[test]
    fn a_skill_shown_as_a_plan_writes_the_plan_of_its_chain_and_nothing_in_the_prompt() {
        let mut memory = memory_by(Some(0.99), RetrieveBy::Pattern);
        memory.show = ShowSkills::Plan;
        let question = "In which country is the city where the spouse of Orla Veny was born?";
        let induced = SkillText {
            description: "Search one hop at a time, 3 searches".into(),
            trigger: crate::memory::question_pattern(question),
            avoid: vec![],
            query_template: "<entity> spouse → <result 1> birthplace → <result 2> country".into(),
        };
        {
            let mut bank = memory.bank.lock().unwrap();
            let vector = memory.embedder.embed(&[induced.embedding_text().as_str()]).unwrap().remove(0);
            bank.admit("s2-0".into(), induced, SkillMeta::default(), vector);
        }
        let unrelated = "Where was the founder of Vexa Labs born?";
        let shown = retrieve(&memory, &[question, unrelated]).unwrap();
        // The plan the skill writes is the one plan guidance writes from the world's grammar.
        let (planned, other) = (&shown.shown[0], &shown.shown[1]);
        assert_eq!(planned.plan, super::plan(question));
        assert!(planned.plan.is_some());
        assert_eq!(planned.skills.iter().map(|s| s.0.as_str()).collect::<Vec<_>>(), ["s2-0"]);
        assert_eq!(
            [planned.block.as_str(), other.block.as_str()],
            ["", ""],
            "a skill shown as a plan is not in the prompt"
        );
        assert_eq!((other.plan.clone(), other.skills.len()), (None, 0), "no skill of its pattern: none");
        let one = memory.shown(question).unwrap();
        assert_eq!((one.block.as_str(), one.plan, one.skills), ("", planned.plan.clone(), planned.skills.clone()));
        // The bank's other skill (a question's wording, not a pattern) is never written.
        memory.min_similarity = None;
        let all = retrieve(&memory, &[unrelated]).unwrap();
        let none = &all.shown[0];
        assert_eq!((none.plan.clone(), none.skills.len(), none.block.as_str()), (None, 0, ""));
    }

    #[test]
    fn a_plan_is_the_demonstrations_first_thought_for_the_questions_chain() {
        let question = "In which country is the city where the spouse of Orla Veny was born?";
        let written = super::plan(question).unwrap();
        assert_eq!(
            written.opening,
            "<think>I need the spouse of Orla Veny, then the birthplace of it, then the country of it.</think>\n"
        );
        // Nothing after the plan's own turn; then the step to each relation left.
        let next = |r: &str| Some(format!(" Next, the {r} of"));
        assert_eq!(written.in_thought, [None, next("birthplace"), next("country")]);
        assert!(super::plan("Which entity hides behind the word CODE-x here?").is_none(), "not the world's grammar");
    }

    #[test]
    fn a_probe_writes_one_more_hop_into_its_plan_and_the_next_hop_into_every_thought_until_it_has_searched_enough() {
        let written = super::probe(3);
        assert_eq!(written.searches, 3);
        assert_eq!(written.opening, "");
        let thoughts = [" Then the", " Next, the", " Next, the"].map(|t| Some(t.to_string()));
        assert_eq!(written.in_thought, thoughts);
    }

    #[test]
    fn a_hint_names_the_path_without_the_answer() {
        // A proposer's searches, reversed by verify: the walk forward.
        let path = ["Mimi Observatory".to_string(), "Orla".to_string(), "Veltria".to_string()];
        let hint = hint(&path, "veltria").unwrap();
        assert_eq!(hint, "\nHint: search Mimi Observatory, then Orla, one at a time, then answer from the last.");
        assert_eq!(super::hint(&["Veltria country".to_string()], "Veltria"), None, "nothing but the answer");
        assert_eq!(super::hint(&[], "Veltria"), None);
    }
}
