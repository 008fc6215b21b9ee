//! `reward`: the solver's reward per rollout (exact match, optional judge fallback, SSP's
//! anti-spam rule), the success rate p̂ per question, the proposer's reward by the configured
//! shape (with the format penalty for invalid or rejected proposals), and skill usage
//! accounting, which makes a new bank version.

use std::collections::BTreeMap;
use std::time::Instant;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, Stage, StageContext, StageError, TableSpec, Tables};

use super::solve::Solve;
use super::verify::{Verify, judge_answers};
use super::{elapsed_ms, mean, metrics_batch, metrics_table, per_hops, skills_table};
use crate::data::metrics::exact_match;
use crate::memory::{QuestionUsage, skills_batch};
use crate::selfplay::resources::{SelfPlay, SkillMemory, Templates};
use crate::selfplay::rules::{FrontierReward, LastTurn, ProposerReward, excess_search_factor, missteps, solver_reward};
use sesa_engine::columns::{Columns, Reader, schema_of};

/// The config of `reward`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewardConfig {
    /// The proposer's reward shape.
    pub proposer: ProposerReward,
    /// The proposer's reward for an invalid or rejected proposal: −1 by default (SSP's
    /// config), and it must be below every valid proposal's reward under `proposer`, or a
    /// trained proposer learns that writing invalid questions pays.
    #[serde(default = "minus_one")]
    pub format_penalty: f64,
    /// Accepts a `format_penalty` that is not below every valid proposal's reward (SSP's
    /// training script used 0 with the adversarial shape, whose lowest valid reward is 0).
    #[serde(default)]
    pub allow_rewarding_invalid: bool,
    /// Ask the judge when a solver answer misses exactly (needs `prompts.judge`).
    #[serde(default)]
    pub judge_fallback: bool,
    /// Each search a rewarded solver rollout made beyond its question's hop count multiplies
    /// its reward by 1 − this (0, the default, changes nothing; must be in [0, 1)). Correct
    /// answers that searched more than the question needs then score below those that did
    /// not, so a group of all-correct rollouts still teaches when to stop searching; failed
    /// rollouts and questions without a hop count are left as they are.
    #[serde(default)]
    pub excess_search_cost: f64,
}

fn minus_one() -> f64 {
    -1.0
}

/// Rewards for both roles.
pub struct Reward {
    config: RewardConfig,
}

/// One row of `rewards`.
struct RewardRow {
    role: &'static str,
    item: u64,
    rollout: u64,
    reward: f64,
    p_hat: Option<f64>,
    /// A solver rollout's turns that misjudged its question's depth ([`missteps`]).
    missteps: Vec<u32>,
}

fn rewards_batch(rows: &[RewardRow]) -> Result<RecordBatch, ArrowError> {
    Columns::default()
        .str("role", rows.iter().map(|r| r.role))
        .u64("item", rows.iter().map(|r| r.item))
        .u64("rollout", rows.iter().map(|r| r.rollout))
        .f64("reward", rows.iter().map(|r| r.reward))
        .opt_f64("p_hat", rows.iter().map(|r| r.p_hat))
        .u32s("missteps", rows.iter().map(|r| r.missteps.as_slice()))
        .finish()
}

impl Reward {
    /// The `rewards` table, as the stages that read it declare it.
    pub fn rewards_table() -> TableSpec {
        TableSpec::new("rewards", schema_of(|| rewards_batch(&[])))
    }
}

impl Stage for Reward {
    const KIND: &'static str = "reward";
    const ABOUT: &'static str = "solver and proposer rewards, success rates, and skill usage accounting";
    type Config = RewardConfig;

    fn new(config: RewardConfig) -> Result<Self, Vec<ConfigProblem>> {
        let mut problems = Vec::new();
        if let ProposerReward::Frontier(FrontierReward { lambda, low, high }) = config.proposer {
            if lambda <= 0.0 {
                problems.push(ConfigProblem::new("proposer.lambda", "the endpoint penalty must be positive"));
            }
            if low < 0.0 || high > 1.0 || low >= high {
                problems.push(ConfigProblem::new("proposer.low", "need 0 ≤ low < high ≤ 1"));
            }
        }
        if !(0.0..1.0).contains(&config.excess_search_cost) {
            problems.push(ConfigProblem::new(
                "excess_search_cost",
                format!(
                    "{} is outside [0, 1): it multiplies a correct answer's reward by 1 − cost per excess search: set it below 1 (0 turns it off)",
                    config.excess_search_cost
                ),
            ));
        }
        let lowest = config.proposer.lowest();
        if problems.is_empty() && config.format_penalty >= lowest && !config.allow_rewarding_invalid {
            problems.push(ConfigProblem::new(
                "format_penalty",
                format!(
                    "{} is not below {lowest}, the lowest reward of a valid proposal under this shape: a trained \
                     proposer would learn to write invalid questions. Lower it, or set \
                     `allow_rewarding_invalid: true` to keep it",
                    config.format_penalty
                ),
            ));
        }
        if problems.is_empty() { Ok(Reward { config }) } else { Err(problems) }
    }

    fn inputs(&self) -> Vec<TableSpec> {
        vec![Solve::rollouts_table(), Verify::verifications_table()]
    }

    fn outputs(&self) -> Vec<TableSpec> {
        vec![Reward::rewards_table(), skills_table(), metrics_table()]
    }

    async fn run(&self, cx: &StageContext, inputs: Tables) -> Result<Tables, StageError> {
        let clock = Instant::now();
        let selfplay = cx.resource::<SelfPlay>()?;
        let rollouts_batch = inputs.get("rollouts")?;
        let rollouts = Reader::new("rollouts", rollouts_batch);
        let items = rollouts.u64("item")?;
        let indices = rollouts.u64("rollout")?;
        let questions = rollouts.str("question")?;
        let targets = rollouts.str("target")?;
        let answers = rollouts.opt_str("answer")?;
        let responses = rollouts.str("response")?;
        let skill_ids = rollouts.strs("skill_ids")?;
        let guided = rollouts.bool("guided")?;

        let mut judged: Vec<Option<bool>> = vec![None; rollouts.rows()];
        let generation = Instant::now();
        if self.config.judge_fallback {
            let template = Templates::require(&selfplay.templates.judge, "judge")?;
            let misses: Vec<usize> = (0..rollouts.rows())
                .filter(|&i| answers[i].is_some_and(|a| exact_match(a, &[targets[i].to_string()]) == 0.0))
                .collect();
            let asks: Vec<(String, String, String)> = misses
                .iter()
                .map(|&i| {
                    (questions[i].to_string(), targets[i].to_string(), answers[i].unwrap_or_default().to_string())
                })
                .collect();
            let verdicts =
                judge_answers(selfplay.judge_or_policy(), template, &asks, |k| cx.seed(misses[k] as u64)).await?;
            for (&i, verdict) in misses.iter().zip(verdicts) {
                judged[i] = Some(verdict);
            }
        }
        let generation_ms = if self.config.judge_fallback { elapsed_ms(generation) } else { 0.0 };
        let verifications_batch = inputs.get("verifications")?;
        let verifications = Reader::new("verifications", verifications_batch);
        let proposal_items = verifications.u64("item")?;
        let question_hops: BTreeMap<u64, u64> = proposal_items
            .iter()
            .zip(verifications.opt_u64("hops")?)
            .filter_map(|(&item, hops)| hops.map(|h| (item, h)))
            .collect();
        let searches = rollouts.strs("searches")?;
        let outcomes = rollouts.str("outcome")?;
        let last_turn = |i: usize| match (answers[i], outcomes[i]) {
            (Some(_), _) => LastTurn::Answered,
            (None, "turn_limit") => LastTurn::Searched,
            (None, _) => LastTurn::Undecided,
        };
        let rewards: Vec<f64> = (0..rollouts.rows())
            .map(|i| {
                let hops = question_hops.get(&items[i]).copied();
                solver_reward(responses[i], answers[i], &[targets[i].to_string()], judged[i])
                    * excess_search_factor(self.config.excess_search_cost, searches[i].len(), hops)
            })
            .collect();
        // p̂ per question: the share of its rollouts with a positive reward (0.25 counts). A
        // guided rollout had help the question's difficulty must not count.
        let mut by_item: BTreeMap<u64, (u64, u64, Vec<String>)> = BTreeMap::new();
        // The rollouts answered without any skill, for counterfactual usage.
        let mut without: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for i in (0..rollouts.rows()).filter(|&i| !guided[i]) {
            let entry = by_item.entry(items[i]).or_default();
            entry.0 += u64::from(rewards[i] > 0.0);
            entry.1 += 1;
            if skill_ids[i].is_empty() {
                let entry = without.entry(items[i]).or_default();
                entry.0 += u64::from(rewards[i] > 0.0);
                entry.1 += 1;
            } else if entry.2.is_empty() {
                entry.2.clone_from(&skill_ids[i]);
            }
        }
        let p_hat: BTreeMap<u64, f64> =
            by_item.iter().map(|(&item, (s, n, _))| (item, *s as f64 / *n as f64)).collect();

        let mut rows: Vec<RewardRow> = (0..rollouts.rows())
            .map(|i| RewardRow {
                role: "solver",
                item: items[i],
                rollout: indices[i],
                reward: rewards[i],
                p_hat: p_hat.get(&items[i]).copied(),
                missteps: missteps(searches[i].len(), last_turn(i), question_hops.get(&items[i]).copied()),
            })
            .collect();
        let sources = verifications.str("source")?;
        let requested = verifications.u64("requested_hops")?;
        let mut proposer_rewards = Vec::new();
        // p̂ of the questions the proposer wrote (not reused or dummy ones), with their hops.
        let mut proposed = Vec::new();
        for (i, &item) in proposal_items.iter().enumerate() {
            let p = p_hat.get(&item).copied().filter(|_| sources[i] == "proposed");
            proposed.extend(p.map(|p| (requested[i], p)));
            let reward = p.map_or(self.config.format_penalty, |p| self.config.proposer.reward(p));
            proposer_rewards.push((requested[i], reward));
            rows.push(RewardRow { role: "proposer", item, rollout: 0, reward, p_hat: p, missteps: Vec::new() });
        }

        let mut skills = skills_batch(0, &[])?;
        let mut bank_metrics = Vec::new();
        if let Ok(memory) = cx.resource::<SkillMemory>() {
            let rollout_sources = rollouts.str("source")?;
            let mut bank = memory.bank.lock().expect("bank lock");
            let rule = bank.usage();
            let judges: std::collections::BTreeSet<u64> =
                (0..rollouts.rows()).filter(|&i| rule.judges(rollout_sources[i])).map(|i| items[i]).collect();
            let usage: Vec<QuestionUsage> = by_item
                .iter()
                .filter(|(item, (_, _, ids))| !ids.is_empty() && judges.contains(item))
                .map(|(item, (successes, n, ids))| {
                    let without = without.get(item).copied();
                    let (s, r) = without.unwrap_or_default();
                    QuestionUsage {
                        question_id: format!("s{}-{item}", cx.step()),
                        skill_ids: ids.clone(),
                        successes: successes - s,
                        rollouts: n - r,
                        without,
                    }
                })
                .collect();
            bank.record_usage(&usage);
            if let Some(version) = bank.commit() {
                skills = skills_batch(version, bank.skills())?;
            }
            bank_metrics.push(("bank_size".to_string(), bank.len() as f64));
            bank_metrics.push(("bank_version".to_string(), bank.version() as f64));
        }
        // Success of the unguided rollouts, per hop count of their question where it has one.
        let solved: Vec<(Option<u64>, f64)> = (0..rollouts.rows())
            .filter(|&i| !guided[i])
            .map(|i| (question_hops.get(&items[i]).copied(), f64::from(rewards[i] > 0.0)))
            .collect();
        // The share of unguided rollouts of questions with a hop count that misjudged it somewhere.
        let misjudged: Vec<(u64, f64)> = (0..rollouts.rows())
            .filter(|&i| !guided[i])
            .filter_map(|i| question_hops.get(&items[i]).map(|&h| (h, f64::from(!rows[i].missteps.is_empty()))))
            .collect();
        let guided_rows: Vec<usize> = (0..rollouts.rows()).filter(|&i| guided[i]).collect();
        let mut metrics: Vec<(String, f64)> = vec![
            ("solver_success".into(), mean(solved.iter().map(|(_, s)| *s))),
            ("mean_p_hat".into(), mean(proposed.iter().map(|(_, p)| *p))),
            ("frontier_share".into(), mean(proposed.iter().map(|(_, p)| f64::from(*p > 0.0 && *p < 1.0)))),
            ("proposer_reward_mean".into(), mean(proposer_rewards.iter().map(|(_, r)| *r))),
        ];
        if !guided_rows.is_empty() {
            metrics.push(("guided".into(), guided_rows.len() as f64));
            metrics.push(("guided_success".into(), mean(guided_rows.iter().map(|&i| f64::from(rewards[i] > 0.0)))));
        }
        metrics.extend(per_hops("solver_success", solved.iter().filter_map(|(h, s)| h.map(|h| (h, *s)))));
        if !misjudged.is_empty() {
            metrics.push(("solver_misstep_rate".into(), mean(misjudged.iter().map(|(_, m)| *m))));
        }
        metrics.extend(per_hops("solver_misstep_rate", misjudged.iter().copied()));
        metrics.extend(per_hops("p_hat", proposed.iter().copied()));
        metrics.extend(per_hops("proposer_reward", proposer_rewards.iter().copied()));
        metrics.push(("generation_ms".into(), generation_ms));
        metrics.push(("wall_ms".into(), elapsed_ms(clock)));
        metrics.extend(bank_metrics);
        Ok(Tables::new()
            .with("rewards", rewards_batch(&rows)?)
            .with("skills", skills)
            .with("step_metrics", metrics_batch(cx.stage_name(), &metrics)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_format_penalty_above_a_valid_proposals_reward_is_refused_unless_allowed() {
        use crate::selfplay::rules::{IntermediateReward, ProposerReward};
        let frontier = ProposerReward::Frontier(FrontierReward { lambda: 0.5, low: 0.0, high: 1.0 });
        assert_eq!(frontier.lowest(), -0.5);
        assert_eq!(ProposerReward::Adversarial.lowest(), 0.0);
        let narrow = ProposerReward::Intermediate(IntermediateReward { left: 0.0, right: 0.8 });
        assert!((narrow.lowest() - 4.0 * 1.0 * (0.8 - 1.0)).abs() < 1e-12);
        let reward = |yaml: &str| {
            <Reward as Stage>::new(serde_yaml::from_str(yaml).unwrap())
                .map(|_| ())
                .map_err(|p| format!("{}: {}", p[0].key, p[0].message))
        };
        assert!(reward("{proposer: {shape: frontier, lambda: 0.5}}").is_ok(), "the default −1 is below −λ");
        let refused = reward("{proposer: {shape: frontier, lambda: 0.5}, format_penalty: 0}").unwrap_err();
        assert!(refused.contains("format_penalty") && refused.contains("allow_rewarding_invalid"), "{refused}");
        assert!(reward("{proposer: {shape: frontier, lambda: 1.0}}").is_err(), "−1 is not below −1");
        assert!(reward("{proposer: {shape: adversarial}, format_penalty: 0, allow_rewarding_invalid: true}").is_ok());
    }
}
