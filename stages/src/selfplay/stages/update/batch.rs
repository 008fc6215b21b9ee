//! What a role learns from: its trajectories of the step with their rewards and advantages,
//! read from the loop's tables (`rollouts` or `proposals`, and `rewards`).

use std::collections::{BTreeMap, BTreeSet};

use arrow_array::RecordBatch;
use sesa_engine::{StageError, Tables};

use super::super::failed;
use super::UpdateConfig;
use sesa_engine::columns::Reader;
use sesa_models::train::{TrainSequence, baseline_advantages, group_advantages};

/// One trajectory to learn from.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Sample {
    /// Its group: the question (solver) or the proposal (proposer).
    pub group: u64,
    pub reward: f64,
    pub advantage: f64,
    pub prompt: String,
    pub response: String,
    /// Token ids, empty when the policy gave none.
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
    /// Per response token: 1 where generated (trained on).
    pub loss_mask: Vec<u32>,
    /// Per response token: the serving backend's log-probability.
    pub logprobs: Vec<f32>,
    /// Whether ids, mask and log-probabilities are exact.
    pub exact: bool,
    /// The policy version that generated it.
    pub policy_version: u64,
    /// Guided: sampled with a hint the trained prompt lacks (`logprobs` are the hinted policy's),
    /// or with written text in it (`loss_mask` [`WRITTEN`]): a plan, a search opened for a
    /// proposer that stopped early.
    pub guided: bool,
    /// The last turn that misjudged the question's depth (`rewards.missteps`), filled only when
    /// the update credits missteps (`misstep_penalty` above 0).
    pub last_misstep: Option<u32>,
    /// A demonstration replayed beside the step's trajectories (`update.replay`), outside
    /// every group, with no sampling log-probabilities (`exact` false).
    pub replayed: bool,
}

/// `loss_mask` of a token written rather than sampled: trained on, with no sampling
/// probability to correct by.
const WRITTEN: u32 = 2;

impl Sample {
    /// Whether guidance wrote any of its tokens (a plan, a step to the next hop) and the
    /// update can tell which ([`Self::guided_at`] marks them).
    fn has_written(&self) -> bool {
        self.guided && self.exact && self.loss_mask.contains(&WRITTEN)
    }

    /// Whether some of its tokens are trained whatever the group's rewards: it has a misstep
    /// (filled only where missteps are credited), or written tokens where `credit_written`.
    pub fn has_own_credit(&self, credit_written: bool) -> bool {
        self.last_misstep.is_some() || (credit_written && self.has_written())
    }

    /// Whether the policy gave its token ids (in-process training needs them).
    pub fn has_ids(&self) -> bool {
        !self.prompt_ids.is_empty() && !self.response_ids.is_empty()
    }

    /// As a training sequence (prompt never trained on); `None` without token ids.
    pub fn sequence(&self) -> Option<TrainSequence> {
        if !self.has_ids() {
            return None;
        }
        let mut tokens = self.prompt_ids.clone();
        tokens.extend(&self.response_ids);
        let mut mask = vec![0u8; self.prompt_ids.len()];
        mask.extend(self.loss_mask.iter().map(|&m| u8::from(m != 0)));
        Some(TrainSequence::new(tokens, mask))
    }

    /// The `loss_mask` value and the recorded log-probability of each scored position of
    /// [`Self::sequence`].
    fn scored(&self, sequence: &TrainSequence) -> impl Iterator<Item = (u32, f32)> + '_ {
        let offset = self.prompt_ids.len();
        sequence.positions().into_iter().map(move |p| {
            (
                self.loss_mask.get(p - offset).copied().unwrap_or(0),
                self.logprobs.get(p - offset).copied().unwrap_or(0.0),
            )
        })
    }

    /// For a guided rollout, at each scored position of [`Self::sequence`], the log-probability
    /// it was sampled with (under a hint), or `None` for a token written rather than sampled
    /// (a plan's, `loss_mask` 2); `None` for an unguided rollout and when inexact.
    pub fn guided_at(&self, sequence: &TrainSequence) -> Option<Vec<Option<f32>>> {
        (self.guided && self.exact)
            .then(|| self.scored(sequence).map(|(mask, logprob)| (mask != WRITTEN).then_some(logprob)).collect())
    }

    /// Whether each scored position of [`Self::sequence`] is a sampled token of a turn up to
    /// and including the rollout's last misstep: the decision to take a hop too many or too few
    /// is often written before the turn that carries it out (the opening thought's plan, "I
    /// need the city of X, then the country of it."), and given that plan the misstep turn
    /// itself is near-certain. Written tokens are guidance's, not the solver's. Turn `j` is the
    /// text after the `j`-th retrieved block (`loss_mask` 0).
    /// `None` without a misstep.
    pub fn misstep_at(&self, sequence: &TrainSequence) -> Option<Vec<bool>> {
        let last = self.last_misstep?;
        let offset = self.prompt_ids.len();
        let mut turns = Vec::with_capacity(self.loss_mask.len());
        let (mut turn, mut retrieved) = (0u32, false);
        for &mask in &self.loss_mask {
            if mask == 0 {
                retrieved = true;
            } else if retrieved {
                (turn, retrieved) = (turn + 1, false);
            }
            turns.push((mask == 1).then_some(turn));
        }
        Some(
            sequence
                .positions()
                .into_iter()
                .map(|p| turns.get(p - offset).copied().flatten().is_some_and(|turn| turn <= last))
                .collect(),
        )
    }

    /// The serving log-probabilities of the trained prompt at the scored positions: those it was
    /// sampled with, unless a hint changed its prompt (empty then, and when inexact).
    pub fn serving_at(&self, sequence: &TrainSequence) -> Vec<f32> {
        if self.guided || !self.exact {
            return Vec::new();
        }
        self.scored(sequence).map(|(_, logprob)| logprob).collect()
    }
}

/// One role's batch.
pub(super) struct RoleBatch {
    pub role: &'static str,
    pub samples: Vec<Sample>,
    /// Every reward of the role this step (samples left out included).
    pub rewards: Vec<f64>,
    pub groups: usize,
    pub groups_without_signal: usize,
}

/// Whether the batches hold trajectories but none with token ids, which in-process training
/// needs. Batches without any trajectory (every group of the step skipped for lack of signal)
/// are not: their update trains nothing and says so in `updates`.
pub(super) fn lack_token_ids(batches: &[RoleBatch]) -> bool {
    let mut samples = batches.iter().flat_map(|b| &b.samples).peekable();
    samples.peek().is_some() && samples.all(|s| !s.has_ids())
}

/// The trajectories of a table, with reward and advantage to fill: a `rollouts` or
/// `proposals` table (`token_ids`, `logprobs`) or an external trainer's batch (`response_ids`,
/// `old_logprobs`).
pub(super) fn read_samples(
    reader: &Reader<'_>,
    response_ids: &str,
    logprobs: &str,
    groups: &[u64],
) -> Result<Vec<Sample>, StageError> {
    let (prompts, responses) = (reader.str("prompt")?, reader.str("response")?);
    let (prompt_ids, response_ids) = (reader.u32s("prompt_ids")?, reader.u32s(response_ids)?);
    let (masks, logprobs, exact) = (reader.u32s("loss_mask")?, reader.f32s(logprobs)?, reader.bool("tokens_exact")?);
    let versions = reader.u64("policy_version")?;
    Ok((0..reader.rows())
        .map(|i| Sample {
            group: groups[i],
            reward: 0.0,
            advantage: 0.0,
            prompt: prompts[i].to_string(),
            response: responses[i].to_string(),
            prompt_ids: prompt_ids[i].clone(),
            response_ids: response_ids[i].clone(),
            loss_mask: masks[i].clone(),
            logprobs: logprobs[i].clone(),
            exact: exact[i],
            policy_version: versions[i],
            guided: false,
            last_misstep: None,
            replayed: false,
        })
        .collect())
}

fn samples(table: &str, batch: &RecordBatch, groups: &[u64]) -> Result<Vec<Sample>, StageError> {
    read_samples(&Reader::new(table, batch), "token_ids", "logprobs", groups)
}

/// The solver's batch: every rollout with its GRPO advantage over its question's group; groups
/// whose rewards are all equal left out with `skip_groups_without_signal`, unless a rollout of
/// theirs has credit of its own ([`Sample::has_own_credit`]). Each rollout carries its last
/// misstep where `config` credits missteps.
pub(super) fn solver_batch(inputs: &Tables, config: &UpdateConfig) -> Result<RoleBatch, StageError> {
    let rollouts = inputs.get("rollouts")?;
    let (items, guided) = {
        let reader = Reader::new("rollouts", rollouts);
        (reader.u64("item")?, reader.bool("guided")?)
    };
    let rewards = inputs.get("rewards")?;
    let reader = Reader::new("rewards", rewards);
    let (roles, values) = (reader.str("role")?, reader.f64("reward")?);
    // Missteps matter to the update only where it credits them.
    let missteps = if config.credits_missteps() { reader.u32s("missteps")? } else { vec![Vec::new(); roles.len()] };
    // `rewards` lists the solver's rows first, in rollout order.
    let (solver_rewards, last_missteps): (Vec<f64>, Vec<Option<u32>>) = roles
        .iter()
        .zip(values.into_iter().zip(missteps))
        .filter(|(role, _)| **role == "solver")
        .map(|(_, (reward, turns))| (reward, turns.into_iter().max()))
        .unzip();
    if solver_rewards.len() != items.len() {
        return Err(failed("update", format!("{} solver rewards for {} rollouts", solver_rewards.len(), items.len())));
    }
    let (advantages, groups, silent) = group_advantages(&solver_rewards, &items);
    let mut samples = samples("rollouts", rollouts, &items)?;
    for (i, sample) in samples.iter_mut().enumerate() {
        (sample.reward, sample.advantage, sample.guided) = (solver_rewards[i], advantages[i], guided[i]);
        sample.last_misstep = last_missteps[i];
    }
    let groups_without_signal = silent.len();
    if config.skip_groups_without_signal {
        retain_signal(&mut samples, silent, config.credits_written());
    }
    Ok(RoleBatch { role: "solver", samples, rewards: solver_rewards, groups, groups_without_signal })
}

/// Leaves out the samples of `silent` groups (rewards all equal, advantages all 0) but those
/// of a group where a sample has credit of its own.
fn retain_signal(samples: &mut Vec<Sample>, mut silent: BTreeSet<u64>, credit_written: bool) {
    for sample in samples.iter().filter(|s| s.has_own_credit(credit_written)) {
        silent.remove(&sample.group);
    }
    samples.retain(|s| !silent.contains(&s.group));
}

/// The proposer's batch: every proposal with its reward minus the baseline (REINFORCE), which
/// `baseline` gives from the batch's mean reward, or with `per_hops` the mean reward of the
/// proposals asked for as many hops.
pub(super) fn proposer_batch(
    inputs: &Tables,
    per_hops: bool,
    baseline: impl FnOnce(f64) -> f64,
) -> Result<RoleBatch, StageError> {
    let proposals = inputs.get("proposals")?;
    let (items, hops, guided) = {
        let reader = Reader::new("proposals", proposals);
        (reader.u64("item")?, reader.u64("hops")?, reader.bool("guided")?)
    };
    let rewards = inputs.get("rewards")?;
    let reader = Reader::new("rewards", rewards);
    let (roles, reward_items, values) = (reader.str("role")?, reader.u64("item")?, reader.f64("reward")?);
    let by_item: BTreeMap<u64, f64> =
        (0..reader.rows()).filter(|&i| roles[i] == "proposer").map(|i| (reward_items[i], values[i])).collect();
    let rewards: Vec<f64> = items
        .iter()
        .map(|item| {
            by_item
                .get(item)
                .copied()
                .ok_or_else(|| failed("update", format!("proposal {item} has no proposer reward")))
        })
        .collect::<Result<_, _>>()?;
    let advantages = if per_hops {
        hop_advantages(&rewards, &hops)
    } else {
        baseline_advantages(&rewards, baseline(super::super::mean(rewards.iter().copied())))
    };
    let mut samples = samples("proposals", proposals, &items)?;
    for (i, sample) in samples.iter_mut().enumerate() {
        (sample.reward, sample.advantage, sample.guided) = (rewards[i], advantages[i], guided[i]);
    }
    Ok(RoleBatch { role: "proposer", samples, groups: items.len(), rewards, groups_without_signal: 0 })
}

/// Each reward minus the mean reward of its hop count's rewards.
fn hop_advantages(rewards: &[f64], hops: &[u64]) -> Vec<f64> {
    let mut sums: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for (reward, hops) in rewards.iter().zip(hops) {
        let entry = sums.entry(*hops).or_default();
        (entry.0, entry.1) = (entry.0 + reward, entry.1 + 1.0);
    }
    rewards.iter().zip(hops).map(|(reward, hops)| reward - sums[hops].0 / sums[hops].1).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(group: u64, loss_mask: Vec<u32>, last_misstep: Option<u32>) -> Sample {
        let guided = loss_mask.contains(&WRITTEN);
        Sample {
            group,
            reward: 1.0,
            advantage: 0.0,
            prompt: String::new(),
            response: String::new(),
            prompt_ids: vec![1],
            response_ids: vec![2; loss_mask.len()],
            logprobs: vec![0.0; loss_mask.len()],
            loss_mask,
            exact: true,
            policy_version: 0,
            guided,
            last_misstep,
            replayed: false,
        }
    }

    /// Groups 1–4 are silent: 1 plain, 2 with a misstep, 3 with a written plan, 4 with both;
    /// group 5 has signal and stays whatever its rollouts hold.
    #[test]
    fn silent_groups_are_left_out_unless_a_rollout_carries_credit_of_its_own() {
        let samples = vec![
            sample(1, vec![1, 1], None),
            sample(2, vec![1, 1], Some(0)),
            sample(3, vec![2, 1], None),
            sample(4, vec![2, 1], Some(0)),
            sample(5, vec![1, 1], None),
        ];
        let kept = |credit_written| {
            let mut samples = samples.clone();
            retain_signal(&mut samples, BTreeSet::from([1, 2, 3, 4]), credit_written);
            samples.iter().map(|s| s.group).collect::<Vec<_>>()
        };
        assert_eq!(kept(false), [2, 4, 5]);
        assert_eq!(kept(true), [2, 3, 4, 5]);
    }

    #[test]
    fn a_proposals_per_hops_baseline_is_the_mean_of_its_hop_count() {
        let advantages = hop_advantages(&[1.0, -1.0, 0.5, -1.0, -1.0], &[2, 2, 4, 4, 4]);
        assert_eq!(advantages, [1.0, -1.0, 1.0, -0.5, -0.5]);
    }
}
