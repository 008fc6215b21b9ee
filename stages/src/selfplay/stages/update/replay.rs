//! Demonstrations replayed in each update beside the step's trajectories (InstructGPT's
//! PPO-ptx): a supervised term that holds what the warm start taught (one- and two-hop
//! questions answered with as many searches) while RL trains what it did not.

use rand::seq::index;
use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, StageContext};

use super::batch::{RoleBatch, Sample};
use crate::selfplay::demonstrations::Demonstration;
use crate::selfplay::stages::warmup::WorldDemonstrations;

/// The config of `update.replay`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Replay {
    /// The demonstrations, written as `warmup` writes a world's (the same keys: a YAML anchor
    /// on the warm start's `world:` replays its own demonstrations). Written once per process.
    pub world: WorldDemonstrations,
    /// Demonstrations drawn each step for each trained role, without replacement, by the
    /// step's seed (all of a role's when it has fewer).
    pub per_step: usize,
    /// The advantage of every replayed token: each is trained as a demonstration at this
    /// weight beside the rollouts' tokens (whose advantages are about ±1), in the same
    /// optimizer step and the same per-token mean.
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
        for role in self.world.roles.iter().filter(|role| !trained.contains(role)) {
            problems.push(ConfigProblem::new(
                "replay.world.roles",
                format!("`{role}` is replayed but not trained: add it to `roles` or leave it out here"),
            ));
        }
        problems
    }

    /// Adds to each replayed role's batch its demonstrations drawn for this step; returns how
    /// many each got.
    pub(super) fn add(
        &self,
        cx: &StageContext,
        demonstrations: &[Demonstration],
        batches: &mut [RoleBatch],
    ) -> Vec<(&'static str, usize)> {
        let mut added = Vec::new();
        for (stream, batch) in batches.iter_mut().enumerate() {
            if !self.world.roles.iter().any(|role| role == batch.role) {
                continue;
            }
            let pool: Vec<&Demonstration> = demonstrations.iter().filter(|d| d.role == batch.role).collect();
            let drawn =
                index::sample(&mut cx.rng(REPLAY_STREAM + stream as u64), pool.len(), self.per_step.min(pool.len()));
            let mut drawn = drawn.into_vec();
            drawn.sort_unstable();
            batch.samples.extend(drawn.iter().map(|&i| replayed(pool[i], self.weight)));
            added.push((batch.role, drawn.len()));
        }
        added
    }
}

/// Seed streams of the update's draws (items of the step's seed), apart from any other use.
const REPLAY_STREAM: u64 = 1 << 40;

/// A demonstration as a trajectory to learn from: its prompt the tokens before the first
/// trained one, every trained token at advantage `weight`, in a group of its own. It has no
/// sampling log-probabilities (`exact` false), so none are compared or corrected by.
fn replayed(demonstration: &Demonstration, weight: f64) -> Sample {
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
        let sample = replayed(&demonstration, 0.5);
        let again = sample.sequence().unwrap();
        assert_eq!((again.tokens, again.mask), (sequence.tokens, sequence.mask));
        assert_eq!(sample.advantage, 0.5);
        let trained = sample.sequence().unwrap();
        assert!(sample.serving_at(&trained).is_empty(), "no sampling log-probabilities to compare with");
        assert!(sample.guided_at(&trained).is_none() && sample.misstep_at(&trained).is_none());
    }
}
