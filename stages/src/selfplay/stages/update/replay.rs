//! Demonstrations replayed in each update beside the step's trajectories (InstructGPT's
//! PPO-ptx): a supervised term that holds what the warm start taught (one- and two-hop
//! questions answered with as many searches) while RL trains what it did not.

use rand::seq::index;
use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, StageContext, StageError};

use super::batch::{RoleBatch, Sample};
use crate::selfplay::SelfPlay;
use crate::selfplay::demonstrations::Demonstration;
use crate::selfplay::stages::failed;
use crate::selfplay::stages::warmup::WorldDemonstrations;

/// The config of `update.replay`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Replay {
    /// The demonstrations, written as `warmup` writes a world's (the same keys: a YAML anchor
    /// on the warm start's `world:` replays its own demonstrations, and keeps its `held_out`
    /// questions out). Written once per process.
    pub world: WorldDemonstrations,
    /// Demonstrations drawn each step for each replayed role, without replacement, by the
    /// step's seed (all of a role's when it has fewer).
    pub per_step: usize,
    /// The advantage of every replayed token: each is trained as a demonstration at this
    /// weight beside the rollouts' tokens (whose advantages are about ±1), in the same
    /// per-token mean; they are spread over the role's mini-batches.
    pub weight: f64,
}

impl Replay {
    /// What is wrong with it, given the roles the update trains.
    pub fn problems(&self, trained: &[String]) -> Vec<ConfigProblem> {
        let mut problems = self.world.problems("replay.world");
        problems.extend(ConfigProblem::size("replay.per_step", self.per_step, 1..=100_000));
        if !(self.weight.is_finite() && self.weight > 0.0) {
            problems.push(ConfigProblem::new(
                "replay.weight",
                format!("{} is no positive weight: give the replayed tokens' advantage, such as 1", self.weight),
            ));
        }
        if self.world.roles.is_empty() {
            problems.push(ConfigProblem::new("replay.world.roles", "name `solver`, `proposer` or both"));
        }
        let known = |role: &&String| *role == "solver" || *role == "proposer";
        for role in self.world.roles.iter().filter(known).filter(|role| !trained.contains(role)) {
            problems.push(ConfigProblem::new(
                "replay.world.roles",
                format!("`{role}` is replayed but not trained: add it to `roles` or leave it out here"),
            ));
        }
        problems
    }

    /// Writes the demonstrations; an error when a replayed role gets none (its questions all
    /// filtered out or missing a search), which would otherwise replay nothing every step.
    pub(super) async fn write(&self, selfplay: &SelfPlay) -> Result<Vec<Demonstration>, StageError> {
        let in_replay = |e: StageError| failed("update", format!("replay.world: {e}"));
        let demonstrations = self.world.write(selfplay).await.map_err(in_replay)?;
        for role in &self.world.roles {
            if !demonstrations.iter().any(|d| d.role == role) {
                return Err(failed(
                    "update",
                    format!(
                        "replay.world wrote no {role} demonstrations: widen its `limit` or `max_hops`, or leave \
                         `{role}` out of its `roles`"
                    ),
                ));
            }
        }
        Ok(demonstrations)
    }

    /// Adds to each replayed role's batch its demonstrations drawn for this step, spread
    /// evenly among its trajectories (so that each mini-batch holds its share); returns how
    /// many each got.
    pub(super) fn add(
        &self,
        cx: &StageContext,
        demonstrations: &[Demonstration],
        batches: &mut [RoleBatch],
    ) -> Vec<(&'static str, usize)> {
        let mut added = Vec::new();
        for batch in batches.iter_mut() {
            if !self.world.roles.iter().any(|role| role == batch.role) {
                continue;
            }
            let pool: Vec<&Demonstration> = demonstrations.iter().filter(|d| d.role == batch.role).collect();
            // One stream per role, whichever roles the update trains.
            let stream = REPLAY_STREAM + u64::from(batch.role == "solver");
            let mut drawn = index::sample(&mut cx.rng(stream), pool.len(), self.per_step.min(pool.len())).into_vec();
            drawn.sort_unstable();
            let replayed: Vec<Sample> = drawn.iter().map(|&i| replay_sample(pool[i], self.weight)).collect();
            added.push((batch.role, replayed.len()));
            batch.samples = interleave(std::mem::take(&mut batch.samples), replayed);
        }
        added
    }
}

/// The update's draw from the step's seed, an item number no other draw of the stage uses.
const REPLAY_STREAM: u64 = 1 << 40;

/// `rest` placed evenly among `items`: the j-th of k after item ⌊(j + 1)·n / (k + 1)⌋.
fn interleave<T>(items: Vec<T>, rest: Vec<T>) -> Vec<T> {
    let (n, k) = (items.len(), rest.len());
    let mut out = Vec::with_capacity(n + k);
    let mut rest = rest.into_iter().enumerate().peekable();
    for (i, item) in items.into_iter().enumerate() {
        while let Some((_, next)) = rest.next_if(|(j, _)| (j + 1) * n / (k + 1) <= i) {
            out.push(next);
        }
        out.push(item);
    }
    out.extend(rest.map(|(_, next)| next));
    out
}

/// A demonstration as a trajectory to learn from: its prompt the tokens before the first
/// trained one, every trained token at advantage `weight`.
fn replay_sample(demonstration: &Demonstration, weight: f64) -> Sample {
    let sequence = &demonstration.sequence;
    let first = sequence.mask.iter().position(|&m| m != 0).unwrap_or(sequence.tokens.len());
    Sample {
        group: u64::MAX,
        reward: 0.0,
        advantage: weight,
        prompt: String::new(),
        response: String::new(),
        prompt_ids: sequence.tokens[..first].to_vec(),
        response_ids: sequence.tokens[first..].to_vec(),
        loss_mask: sequence.mask[first..].iter().map(|&m| u32::from(m)).collect(),
        logprobs: Vec::new(),
        exact: false,
        policy_version: 0,
        guided: false,
        last_misstep: None,
        replayed: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sesa_models::train::TrainSequence;

    #[test]
    fn a_replayed_demonstration_trains_the_tokens_it_was_written_to_train() {
        let sequence = TrainSequence::new(vec![5, 6, 7, 8, 9, 10], vec![0, 0, 1, 1, 0, 1]);
        let demonstration = Demonstration { role: "solver", hops: 1, sequence: sequence.clone() };
        let sample = replay_sample(&demonstration, 0.5);
        let trained = sample.sequence().unwrap();
        assert_eq!((&trained.tokens, &trained.mask), (&sequence.tokens, &sequence.mask));
        assert_eq!((sample.advantage, sample.replayed), (0.5, true));
        assert!(sample.serving_at(&trained).is_empty(), "no sampling log-probabilities to compare with");
        assert!(sample.guided_at(&trained).is_none() && sample.misstep_at(&trained).is_none());
    }

    #[test]
    fn replayed_samples_are_spread_among_the_trajectories() {
        assert_eq!(interleave(vec![1, 2, 3, 4, 5, 6], vec![10, 20]), [1, 2, 10, 3, 4, 20, 5, 6]);
        assert_eq!(interleave(vec![1, 2], vec![10, 20, 30]), [10, 1, 20, 30, 2]);
        assert_eq!(interleave(Vec::new(), vec![10, 20]), [10, 20]);
        assert_eq!(interleave(vec![1, 2], Vec::new()), [1, 2]);
    }
}
