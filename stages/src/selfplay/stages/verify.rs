//! `verify`: the RAG check. A verifier answers each valid question from the proposer's own
//! materials plus documents from other proposals as noise, without searching (SSP), or by the
//! solver's own loop whose searches reach only those documents (`reads: search`, with `plan`
//! opening its response with the question's hops as plan guidance writes them); the question is
//! accepted on exact match, or when the judge says the answer matches. Invalid or rejected
//! proposals are replaced by a reused question, a substitute, a dummy, or nothing, as
//! configured; each solver question's `source` and hop count are recorded, and the step's
//! metrics give the share of each source and the pass rate per requested hop count.

use std::collections::BTreeMap;
use std::time::Instant;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use rand::seq::{IndexedRandom, SliceRandom};
use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, Requirement, Stage, StageContext, StageError, TableSpec, Tables};

use super::{LoadOnce, elapsed_ms, failed, mean, metrics_batch, metrics_table, per_hops, solve};
use crate::agent::{AgentRun, Episode, Outcome, Role};
use crate::data::datasets::load_questions;
use crate::data::metrics::{contains_answer, exact_match};
use crate::search::{PassageSearch, parse_results};
use crate::sections::MAX_TOKENS;
use crate::selfplay::resources::{PooledQuestion, SelfPlay, Templates, pool_start};
use crate::selfplay::rules::{judge_says_correct, verifier_answer};
use sesa_engine::columns::{Columns, Reader, schema_of};
use sesa_models::policy::{GenerationRequest, Policy, Sampling};

/// Who answers in the RAG check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verifier {
    /// The policy itself.
    #[default]
    Policy,
    /// The `judge:` model (SSP uses an external judge).
    Judge,
}

/// How the verifier reads the materials.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MaterialsAccess {
    /// All of them in the verifier prompt, answered after "Answer:" (SSP).
    #[default]
    Prompt,
    /// The solver's own prompt and loop, its searches answered from the materials alone
    /// (BM25 over those passages): for a small policy that has only learned to answer by
    /// searching, and that meets the verifier prompt's materials nowhere else.
    Search,
}

/// How replacements are drawn from the reuse pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PoolDraw {
    /// Uniformly, with replacement (SSP).
    #[default]
    WithReplacement,
    /// Each pooled question at most once a step.
    Distinct,
}

/// What the solver gets in place of an invalid or rejected proposal (SSP's reuse pool, then a
/// dummy).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum InvalidStrategy {
    /// Nothing: the solver batch shrinks.
    #[default]
    Drop,
    /// A random earlier accepted question from the reuse pool, else a substitute from
    /// `fallback_questions`, else a dummy (SSP, which has no substitutes).
    Reuse,
    /// SSP's dummy problem, with the proposal's target.
    Dummy,
}

/// How the verifier's answer is checked against the target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AnswerMatch {
    /// Exact match after normalisation (SSP; its judge then rules on the misses).
    #[default]
    Exact,
    /// The answer holds the target as whole words: a rule standing in for SSP's judge, which
    /// counts an answer that contains the correct one as correct, where no judge model runs
    /// (small models answer in a sentence).
    Contains,
}

/// SSP's dummy problem.
pub const DUMMY_QUESTION: &str = "This is a dummy problem. Please directly output </answer>";

/// The config of `verify`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VerifyConfig {
    /// Who answers.
    #[serde(default)]
    pub verifier: Verifier,
    /// Other proposals' materials mixed in as noise (SSP: 4).
    #[serde(default = "super::four")]
    pub noise: usize,
    /// New tokens of the verifier's answer at most (SSP: 70); with `reads: search`, the
    /// agent section's budgets apply instead.
    #[serde(default = "seventy")]
    pub max_tokens: usize,
    /// How the verifier reads the materials: `prompt` (SSP) or `search`.
    #[serde(default)]
    pub reads: MaterialsAccess,
    /// Ask the judge when the verifier's answer misses exactly (needs `prompts.judge`).
    #[serde(default)]
    pub judge_fallback: bool,
    /// How the verifier's answer must match the target before any judge fallback.
    #[serde(default)]
    pub answer_match: AnswerMatch,
    /// What replaces an invalid or rejected proposal.
    #[serde(default)]
    pub invalid: InvalidStrategy,
    /// The reuse pool is emptied every this many steps (SSP: 10).
    #[serde(default = "ten")]
    pub pool_clear_interval: u64,
    /// With `distinct`, a step's replacements draw each pooled question at most once, then
    /// fall back as an empty pool does; SSP draws with replacement (the default), so a pool of
    /// one question can fill a whole batch.
    #[serde(default)]
    pub pool_draw: PoolDraw,
    /// Questions (FlashRAG JSONL) that `reuse` draws from while the pool is empty, instead of
    /// a dummy: for small proposers that rarely write a valid question (the quickstart).
    #[serde(default)]
    pub fallback_questions: Option<std::path::PathBuf>,
    /// Only the fallback questions of at most this many hops (their `hops` field; a generated
    /// world's questions have one): the depths a small solver can answer at all.
    #[serde(default)]
    pub fallback_max_hops: Option<u8>,
    /// At least this many of a step's replacements are substitutes from `fallback_questions`
    /// even while the reuse pool has questions (the first ones, in proposal order): keeps every
    /// depth the fallback questions hold in the solver's diet once the pool holds only the
    /// proposer's (default 0, SSP's way: the pool first).
    #[serde(default)]
    pub min_substitutes: usize,
    /// With `reads: search`, the verifier's response opens with the plan of the question's
    /// chain, as a plan-guided solver rollout's does (`solve.guidance: plan`; questions in the
    /// generated world's grammar, the others unplanned): the check then asks whether the
    /// materials answer the question once its hops are laid out, as a larger verifier would lay
    /// them out itself. The policy verifies as the solver it is, and a solver shown two hops
    /// never searched a third: it rejected every right three- and four-hop question.
    #[serde(default)]
    pub plan: bool,
}

fn seventy() -> usize {
    70
}
fn ten() -> u64 {
    10
}

/// The RAG verifier.
pub struct Verify {
    config: VerifyConfig,
    fallback: LoadOnce<Vec<crate::data::datasets::Question>>,
}

impl Verify {
    fn matches(&self, answer: &str, target: &str) -> bool {
        match self.config.answer_match {
            AnswerMatch::Exact => exact_match(answer, &[target.to_string()]) > 0.0,
            AnswerMatch::Contains => contains_answer(answer, target),
        }
    }

    /// `fallback_questions`, less those deeper than `fallback_max_hops`.
    fn load_fallback(&self, path: &std::path::Path) -> Result<Vec<crate::data::datasets::Question>, StageError> {
        let mut questions = load_questions(path).map_err(|e| failed("fallback questions", e))?;
        if let Some(max) = self.config.fallback_max_hops {
            questions.retain(|q| q.hops.is_some_and(|hops| hops <= max));
            if questions.is_empty() {
                return Err(failed(
                    "fallback questions",
                    format!(
                        "{} has no question with a `hops` field of at most {max} (fallback_max_hops); raise it or remove it",
                        path.display()
                    ),
                ));
            }
        }
        Ok(questions)
    }
}

/// One row of `verifications`.
struct Verification {
    target: String,
    question: Option<String>,
    accepted: bool,
    answer: Option<String>,
    reason: String,
    solver_question: Option<String>,
    solver_target: String,
    /// Hops the proposer was asked for.
    requested_hops: u64,
    /// Hops of the solver's question: an accepted proposal's as the targets' world reads it
    /// (those asked for without a generated world), a reused or substitute question's own.
    hops: Option<u64>,
    /// The searches the question was built along, in the order a solver makes them: the
    /// proposer's reversed (it walks back from the answer), or each hop of a generated world's
    /// supporting chain as the solver's demonstrations search it (`entity relation`); empty
    /// when unknown. What `solve`'s guidance hints from.
    path: Vec<String>,
    source: &'static str,
}

/// An accepted question's depth: the one the targets' world gives it (`asks`: its answer and
/// hops there) when it asks for `target`, unknown when it asks for something else, and the
/// `requested` one when no world could read it.
fn accepted_hops(asks: Option<(&str, u64)>, target: &str, requested: u64) -> Option<u64> {
    match asks {
        Some((answer, hops)) if answer == target => Some(hops),
        Some(_) => None,
        None => Some(requested),
    }
}

/// Where the solver's questions come from, in the order `step_metrics` lists their shares.
const SOURCES: [&str; 4] = ["proposed", "reused", "substitute", "dummy"];

/// The verifier's episode for `question` when it reads by searching: with `plan`, opening with
/// the plan of the question's chain where the world's grammar reads one.
fn verifier_episode(prompt: String, seed: u64, question: Option<&str>, plan: bool) -> Episode {
    let written = if plan { question.and_then(solve::plan) } else { None };
    Episode { prompt, seed, written }
}

fn verifications_batch(rows: &[Verification]) -> Result<RecordBatch, ArrowError> {
    Columns::default()
        .u64("item", 0..rows.len() as u64)
        .str("target", rows.iter().map(|r| r.target.as_str()))
        .opt_str("question", rows.iter().map(|r| r.question.as_deref()))
        .bool("accepted", rows.iter().map(|r| r.accepted))
        .opt_str("verifier_answer", rows.iter().map(|r| r.answer.as_deref()))
        .str("reason", rows.iter().map(|r| r.reason.as_str()))
        .opt_str("solver_question", rows.iter().map(|r| r.solver_question.as_deref()))
        .str("solver_target", rows.iter().map(|r| r.solver_target.as_str()))
        .u64("requested_hops", rows.iter().map(|r| r.requested_hops))
        .opt_u64("hops", rows.iter().map(|r| r.hops))
        .strs("path", rows.iter().map(|r| r.path.iter().map(String::as_str)))
        .str("source", rows.iter().map(|r| r.source))
        .finish()
}

/// Asks `judge` whether each `(question, golden, answer)` is correct.
pub async fn judge_answers(
    judge: &dyn Policy,
    template: &crate::agent::PromptTemplate,
    items: &[(String, String, String)],
    seed: impl Fn(usize) -> u64,
) -> Result<Vec<bool>, StageError> {
    let requests: Vec<GenerationRequest> = items
        .iter()
        .enumerate()
        .map(|(i, (question, golden, answer))| GenerationRequest {
            context: judge.render_chat(&template.render(&BTreeMap::from([
                ("question", question.clone()),
                ("golden", golden.clone()),
                ("answer", answer.clone()),
            ]))),
            context_ids: None,
            max_tokens: 10,
            stop: Vec::new(),
            sampling: Sampling::GREEDY,
            seed: seed(i),
            json_schema: None,
            ignore_eos: false,
        })
        .collect();
    let replies = judge.generate(&requests).await.map_err(|e| failed("judge", e))?;
    Ok(replies.iter().map(|r| judge_says_correct(&r.text)).collect())
}

impl Verify {
    /// The `verifications` table, as the stages that read it declare it.
    pub fn verifications_table() -> TableSpec {
        TableSpec::new("verifications", schema_of(|| verifications_batch(&[])))
    }
}

impl Stage for Verify {
    const KIND: &'static str = "verify";
    const ABOUT: &'static str =
        "the RAG check: answer each question from the proposer's materials plus noise, keep the answerable";
    type Config = VerifyConfig;

    fn new(config: VerifyConfig) -> Result<Self, Vec<ConfigProblem>> {
        let mut problems = Vec::new();
        problems.extend(ConfigProblem::size("max_tokens", config.max_tokens, 1..=MAX_TOKENS));
        problems.extend(ConfigProblem::size("noise", config.noise, 0..=100));
        problems.extend(ConfigProblem::size("pool_clear_interval", config.pool_clear_interval, 1..=u64::MAX));
        if config.min_substitutes > 0 && config.fallback_questions.is_none() {
            problems.push(ConfigProblem::new(
                "min_substitutes",
                "draws from `fallback_questions`: name a question set there, or remove the key",
            ));
        }
        if config.min_substitutes > 0 && config.invalid != InvalidStrategy::Reuse {
            problems.push(ConfigProblem::new(
                "min_substitutes",
                "replaces invalid proposals only with `invalid: reuse`: set it, or remove the key",
            ));
        }
        if config.plan && config.reads != MaterialsAccess::Search {
            problems.push(ConfigProblem::new(
                "plan",
                "writes into the verifier's search loop: set `reads: search`, or remove the key",
            ));
        }
        if problems.is_empty() { Ok(Verify { config, fallback: LoadOnce::default() }) } else { Err(problems) }
    }

    fn inputs(&self) -> Vec<TableSpec> {
        vec![super::propose::Propose::proposals_table()]
    }

    fn outputs(&self) -> Vec<TableSpec> {
        vec![Verify::verifications_table(), metrics_table()]
    }

    fn requirements(&self) -> Vec<Requirement> {
        let fallback = self.config.fallback_questions.iter();
        fallback
            .map(|path| {
                Requirement::path(
                    "fallback_questions",
                    path,
                    "name a FlashRAG JSONL question set, or remove the key to reuse earlier valid questions only",
                )
            })
            .collect()
    }

    async fn run(&self, cx: &StageContext, inputs: Tables) -> Result<Tables, StageError> {
        let clock = Instant::now();
        let selfplay = cx.resource::<SelfPlay>()?;
        let batch = inputs.get("proposals")?;
        let proposals = Reader::new("proposals", batch);
        let targets = proposals.str("target")?;
        let requested = proposals.u64("hops")?;
        let (world_answers, world_hops) = (proposals.opt_str("world_answer")?, proposals.opt_u64("world_hops")?);
        let realised = |i: usize| accepted_hops(world_answers[i].zip(world_hops[i]), targets[i], requested[i]);
        let searches = proposals.strs("searches")?;
        let questions = proposals.opt_str("question")?;
        let reasons = proposals.str("reason")?;
        let materials = proposals.str("materials")?;
        let valid: Vec<usize> = (0..proposals.rows()).filter(|&i| questions[i].is_some()).collect();

        let verifier: &dyn Policy = match self.config.verifier {
            Verifier::Policy => selfplay.policy.as_ref(),
            Verifier::Judge => selfplay.judge_or_policy(),
        };
        // Each valid proposal's materials, with other proposals' as noise, in a shuffled order.
        let documents: Vec<String> = valid
            .iter()
            .map(|&i| {
                let mut rng = cx.rng(i as u64);
                let mut others: Vec<&str> =
                    valid.iter().filter(|&&j| j != i && materials[j] != materials[i]).map(|&j| materials[j]).collect();
                others.dedup();
                others.shuffle(&mut rng);
                let mut documents: Vec<&str> = others.into_iter().take(self.config.noise).collect();
                documents.push(materials[i]);
                documents.shuffle(&mut rng);
                documents.join("\n\n")
            })
            .collect();
        let generation = Instant::now();
        let answers: Vec<String> = match self.config.reads {
            MaterialsAccess::Prompt => {
                let template = Templates::require(&selfplay.templates.verifier, "verifier")?;
                let requests: Vec<GenerationRequest> = valid
                    .iter()
                    .zip(&documents)
                    .map(|(&i, documents)| GenerationRequest {
                        context: verifier.render_chat(&template.render(&BTreeMap::from([
                            ("materials", documents.clone()),
                            ("question", questions[i].unwrap_or_default().to_string()),
                        ]))),
                        context_ids: None,
                        max_tokens: self.config.max_tokens,
                        stop: Vec::new(),
                        sampling: Sampling::GREEDY,
                        seed: cx.seed(i as u64),
                        json_schema: None,
                        ignore_eos: false,
                    })
                    .collect();
                let replies = verifier.generate(&requests).await.map_err(|e| failed("verifier", e))?;
                replies.iter().map(|r| verifier_answer(&r.text)).collect()
            }
            MaterialsAccess::Search => {
                let (top_k, limits) = (selfplay.top_k, selfplay.agent.limits());
                let solved = valid.iter().zip(&documents).map(|(&i, documents)| {
                    let search = PassageSearch::new(parse_results(documents));
                    let prompt = verifier.render_chat(&selfplay.templates.solver.render(&BTreeMap::from([
                        ("question", questions[i].unwrap_or_default().to_string()),
                        ("skills", String::new()),
                    ])));
                    let episode = verifier_episode(prompt, cx.seed(i as u64), questions[i], self.config.plan);
                    async move {
                        let agent = AgentRun {
                            role: Role::Solver,
                            policy: verifier,
                            search: &search,
                            top_k,
                            limits,
                            sampling: Sampling::GREEDY,
                        };
                        let trajectory = agent.run(&[episode]).await?.pop();
                        Ok::<_, crate::agent::AgentError>(match trajectory.map(|t| t.outcome) {
                            Some(Outcome::Final(answer)) => answer,
                            _ => String::new(),
                        })
                    }
                });
                futures::future::try_join_all(solved).await.map_err(|e| failed("verifier", e))?
            }
        };
        let mut accepted: Vec<bool> = valid.iter().zip(&answers).map(|(&i, a)| self.matches(a, targets[i])).collect();
        let mut generation_ms = elapsed_ms(generation);
        if self.config.judge_fallback {
            let generation = Instant::now();
            let judge_template = Templates::require(&selfplay.templates.judge, "judge")?;
            let misses: Vec<usize> = (0..valid.len()).filter(|&k| !accepted[k] && !answers[k].is_empty()).collect();
            let items: Vec<(String, String, String)> = misses
                .iter()
                .map(|&k| {
                    let i = valid[k];
                    (questions[i].unwrap_or_default().to_string(), targets[i].to_string(), answers[k].clone())
                })
                .collect();
            let verdicts = judge_answers(selfplay.judge_or_policy(), judge_template, &items, |k| {
                cx.seed(1_000_000 + misses[k] as u64)
            })
            .await?;
            for (&k, verdict) in misses.iter().zip(verdicts) {
                accepted[k] = verdict;
            }
            generation_ms += elapsed_ms(generation);
        }

        let kept_from = pool_start(cx.step(), self.config.pool_clear_interval);
        let mut pool = selfplay.pool.lock().expect("pool lock");
        pool.retain(|q| q.step >= kept_from);
        let available = pool.clone();
        let distinct = self.config.pool_draw == PoolDraw::Distinct;
        // Distinct draws take the pool's questions (each text once: two proposals can ask the
        // same) in a shuffled order until none is left.
        let mut unused: Vec<&PooledQuestion> = Vec::new();
        if distinct {
            for question in &available {
                if !unused.iter().any(|u| u.question == question.question) {
                    unused.push(question);
                }
            }
            unused.shuffle(&mut cx.rng(3_000_000));
        }
        // Read once a run, on first use.
        let fallback = match &self.config.fallback_questions {
            Some(path) => self.fallback.get(|| self.load_fallback(path))?,
            None => Default::default(),
        };
        let mut rows = Vec::with_capacity(proposals.rows());
        let mut substitutes_owed = self.config.min_substitutes;
        for i in 0..proposals.rows() {
            let checked = valid.iter().position(|&v| v == i);
            let (accept, answer, reason) = match checked {
                Some(k) if accepted[k] => (true, Some(answers[k].clone()), String::new()),
                Some(k) => (false, Some(answers[k].clone()), "the verifier's answer does not match the target".into()),
                None => (false, None, format!("invalid: {}", reasons[i])),
            };
            let (solver_question, solver_target, hops, path, source) = if accept {
                let path = searches[i].iter().rev().cloned().collect();
                (questions[i].map(str::to_string), targets[i].to_string(), realised(i), path, "proposed")
            } else {
                let mut rng = cx.rng(2_000_000 + i as u64);
                let replacement = match self.config.invalid {
                    InvalidStrategy::Reuse => {
                        let reused = if substitutes_owed > 0 && !fallback.is_empty() {
                            substitutes_owed -= 1;
                            None
                        } else if distinct {
                            unused.pop()
                        } else {
                            available.choose(&mut rng)
                        };
                        match reused {
                            Some(q) => Some((q.question.clone(), q.target.clone(), q.hops, Vec::new(), "reused")),
                            None => fallback.choose(&mut rng).map(|q| {
                                let target = q.golden_answers.first().cloned().unwrap_or_default();
                                let path = crate::selfplay::demonstrations::chain_searches(q);
                                (q.question.clone(), target, q.hops.map(u64::from), path, "substitute")
                            }),
                        }
                    }
                    _ => None,
                };
                match (self.config.invalid, replacement) {
                    (InvalidStrategy::Drop, _) => (None, targets[i].to_string(), None, Vec::new(), "none"),
                    (_, Some((question, target, hops, path, source))) => (Some(question), target, hops, path, source),
                    (_, None) => (Some(DUMMY_QUESTION.to_string()), targets[i].to_string(), None, Vec::new(), "dummy"),
                }
            };
            rows.push(Verification {
                target: targets[i].to_string(),
                question: questions[i].map(str::to_string),
                accepted: accept,
                answer,
                reason,
                solver_question,
                solver_target,
                requested_hops: requested[i],
                hops,
                path,
                source,
            });
        }
        pool.extend(rows.iter().filter(|r| r.accepted).map(|r| PooledQuestion {
            step: cx.step(),
            question: r.question.clone().unwrap_or_default(),
            target: r.target.clone(),
            hops: r.hops,
        }));
        drop(pool);
        let mut metrics = vec![
            ("checked".to_string(), valid.len() as f64),
            ("pass_rate".into(), mean(accepted.iter().map(|&a| f64::from(a as u8)))),
            ("accepted".into(), rows.iter().filter(|r| r.accepted).count() as f64),
        ];
        let asked = rows.iter().filter(|r| r.solver_question.is_some()).count().max(1) as f64;
        for source in SOURCES {
            let count = rows.iter().filter(|r| r.source == source).count() as f64;
            metrics.push((format!("source_{source}"), count / asked));
        }
        let checked_hops: Vec<(u64, f64)> =
            valid.iter().zip(&accepted).map(|(&i, &a)| (requested[i], f64::from(a as u8))).collect();
        metrics.extend(per_hops("pass_rate", checked_hops));
        metrics.push(("generation_ms".into(), generation_ms));
        metrics.push(("wall_ms".into(), elapsed_ms(clock)));
        Ok(Tables::new()
            .with("verifications", verifications_batch(&rows)?)
            .with("step_metrics", metrics_batch(cx.stage_name(), &metrics)?))
    }
}

#[cfg(test)]
mod tests {
    use super::{accepted_hops, verifier_episode};
    use crate::selfplay::stages::solve;

    #[test]
    fn a_planned_verifier_opens_with_the_questions_chain_where_the_world_reads_one() {
        let question = "In which country is the city where the employer of the author of The Crimson Lantern of Katan is headquartered?";
        let planned = verifier_episode("p".into(), 7, Some(question), true);
        let expected = solve::plan(question).expect("a question of the world's grammar");
        assert!(
            expected.opening.contains("I need the author of The Crimson Lantern of Katan, then"),
            "{}",
            expected.opening
        );
        assert_eq!(planned.written, Some(expected));
        assert_eq!((planned.prompt.as_str(), planned.seed), ("p", 7));
        // Outside the grammar, or without `plan`: the verifier's own response.
        assert_eq!(verifier_episode("p".into(), 7, Some("What colour is the sky above Mibri?"), true).written, None);
        assert_eq!(verifier_episode("p".into(), 7, Some(question), false).written, None);
    }

    #[test]
    fn an_accepted_question_has_the_depth_its_world_gives_it() {
        // Asked for three hops, the question asks for the target at two.
        assert_eq!(accepted_hops(Some(("Mibri", 2)), "Mibri", 3), Some(2));
        // It asks for another entity: its depth for this target is unknown.
        assert_eq!(accepted_hops(Some(("Orla", 2)), "Mibri", 3), None);
        // No world read it (another kind of data, or wording outside the world's grammar).
        assert_eq!(accepted_hops(None, "Mibri", 3), Some(3));
    }
}
