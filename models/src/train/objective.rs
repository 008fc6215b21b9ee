//! The policy-gradient objective of RL updates, per token: PPO's clipped surrogate with
//! separate low and high clips and a dual clip for negative advantages, plus a KL penalty to
//! a reference policy by the low-variance (k3) estimator. GRPO and REINFORCE share it; they
//! differ only in their advantages ([`group_advantages`], [`baseline_advantages`]).
//!
//! Clamps follow verl, so numbers compare with runs of the reference implementation: the
//! log-ratios are clamped to ±20 before `exp`, the KL estimate to ±10.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The clipped objective's settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClippedObjective {
    /// The ratio is clipped below at `1 − clip_low`.
    #[serde(default = "clip_low")]
    pub clip_low: f64,
    /// The ratio is clipped above at `1 + clip_high` (SSP: 0.285, "clip higher").
    #[serde(default = "clip_high")]
    pub clip_high: f64,
    /// Dual clip: for a negative advantage the loss is at most `clip_dual · |A|`.
    #[serde(default = "clip_dual")]
    pub clip_dual: f64,
    /// Weight of the KL penalty to the reference policy (0: no reference pass).
    #[serde(default = "kl_coef")]
    pub kl_coef: f64,
}

fn clip_low() -> f64 {
    0.2
}
fn clip_high() -> f64 {
    0.285
}
fn clip_dual() -> f64 {
    3.0
}
fn kl_coef() -> f64 {
    0.01
}

impl Default for ClippedObjective {
    fn default() -> Self {
        ClippedObjective { clip_low: clip_low(), clip_high: clip_high(), clip_dual: clip_dual(), kl_coef: kl_coef() }
    }
}

/// One token's share of the objective.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenTerms {
    /// The clipped policy-gradient loss.
    pub policy: f64,
    /// The k3 estimate of KL(π ‖ π_ref) (0 without a reference).
    pub kl: f64,
    /// `policy + kl_coef · kl`.
    pub loss: f64,
    /// d loss / d log π(token).
    pub derivative: f64,
    /// Whether the clip bound the ratio (the clip fraction's numerator).
    pub clipped: bool,
}

impl ClippedObjective {
    /// What is wrong with the settings, as (key, problem).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if !(0.0..1.0).contains(&self.clip_low) {
            problems.push(("clip_low", format!("must be in [0, 1), got {}", self.clip_low)));
        }
        if self.clip_high < 0.0 {
            problems.push(("clip_high", format!("cannot be negative, got {}", self.clip_high)));
        }
        if self.clip_dual <= 1.0 {
            problems.push(("clip_dual", format!("must be above 1, got {}", self.clip_dual)));
        }
        if self.kl_coef < 0.0 {
            problems.push(("kl_coef", format!("cannot be negative, got {}", self.kl_coef)));
        }
        problems
    }

    /// The terms of a token with log-probability `logp` under the policy being trained,
    /// `old` under the policy that the ratio is taken to, `reference` under the KL reference,
    /// and advantage `advantage`.
    pub fn token(&self, logp: f32, old: f32, reference: Option<f32>, advantage: f64) -> TokenTerms {
        let ratio = (f64::from(logp) - f64::from(old)).clamp(-20.0, 20.0).exp();
        let unclipped = -advantage * ratio;
        let clipped = -advantage * ratio.clamp(1.0 - self.clip_low, 1.0 + self.clip_high);
        // The larger loss is the pessimistic one; for a negative advantage it is capped.
        let mut policy = unclipped.max(clipped);
        let mut from_ratio = unclipped >= clipped;
        if advantage < 0.0 && policy > -advantage * self.clip_dual {
            policy = -advantage * self.clip_dual;
            from_ratio = false;
        }
        let mut derivative = if from_ratio { -advantage * ratio } else { 0.0 };
        let mut kl = 0.0;
        if let Some(reference) = reference.filter(|_| self.kl_coef > 0.0) {
            let log_ratio = f64::from(reference) - f64::from(logp);
            let bounded = log_ratio.clamp(-20.0, 20.0);
            let estimate = bounded.exp() - bounded - 1.0;
            kl = estimate.clamp(-10.0, 10.0);
            if log_ratio == bounded && estimate == kl {
                derivative += self.kl_coef * (1.0 - bounded.exp());
            }
        }
        TokenTerms { policy, kl, loss: policy + self.kl_coef * kl, derivative, clipped: unclipped < clipped }
    }
}

/// GRPO's advantages: each reward minus its group's mean, over the group's unbiased standard
/// deviation plus 1e-6 (a group of one: the reward itself, as verl). Returns the advantages, the
/// number of groups, and the groups of more than one whose rewards are all equal (no signal).
pub fn group_advantages(rewards: &[f64], groups: &[u64]) -> (Vec<f64>, usize, std::collections::BTreeSet<u64>) {
    let mut members: std::collections::BTreeMap<u64, Vec<usize>> = std::collections::BTreeMap::new();
    for (i, &group) in groups.iter().enumerate() {
        members.entry(group).or_default().push(i);
    }
    let mut advantages = vec![0.0; rewards.len()];
    let mut without_signal = std::collections::BTreeSet::new();
    for (&group, indices) in &members {
        let n = indices.len() as f64;
        if indices.len() == 1 {
            advantages[indices[0]] = rewards[indices[0]] / (1.0 + 1e-6);
            continue;
        }
        let mean = indices.iter().map(|&i| rewards[i]).sum::<f64>() / n;
        let variance = indices.iter().map(|&i| (rewards[i] - mean).powi(2)).sum::<f64>() / (n - 1.0);
        if indices.iter().all(|&i| rewards[i] == rewards[indices[0]]) {
            without_signal.insert(group);
        }
        for &i in indices {
            advantages[i] = (rewards[i] - mean) / (variance.sqrt() + 1e-6);
        }
    }
    (advantages, members.len(), without_signal)
}

/// REINFORCE's advantages: each reward minus `baseline`.
pub fn baseline_advantages(rewards: &[f64], baseline: f64) -> Vec<f64> {
    rewards.iter().map(|r| r - baseline).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numeric(objective: &ClippedObjective, logp: f32, old: f32, reference: Option<f32>, a: f64) -> f64 {
        let h = 1e-3;
        let up = objective.token(logp + h, old, reference, a).loss;
        let down = objective.token(logp - h, old, reference, a).loss;
        (up - down) / (2.0 * f64::from(h))
    }

    #[test]
    fn identical_policies_give_ratio_one_and_no_kl() {
        let objective = ClippedObjective::default();
        for advantage in [-1.5, 0.0, 2.0] {
            let terms = objective.token(-1.25, -1.25, Some(-1.25), advantage);
            assert_eq!(terms.kl, 0.0);
            assert_eq!(terms.policy, -advantage);
            assert_eq!(terms.derivative, -advantage, "the KL term has no slope at the reference");
            assert!(!terms.clipped);
        }
    }

    #[test]
    fn derivatives_match_finite_differences_inside_and_outside_the_clips() {
        let objective = ClippedObjective::default();
        // (logp, old, reference, advantage): inside, above the high clip, below the low clip,
        // and past the dual clip.
        for (logp, old, reference, a) in
            [(-1.0, -1.1, -0.9, 1.0), (-0.5, -1.0, -0.7, 1.0), (-2.0, -1.0, -1.5, -1.0), (0.0, -2.0, -0.5, -1.0)]
        {
            let terms = objective.token(logp, old, Some(reference), a);
            let expected = numeric(&objective, logp, old, Some(reference), a);
            assert!((terms.derivative - expected).abs() < 1e-3, "{logp} {old} {a}: {} vs {expected}", terms.derivative);
        }
    }

    #[test]
    fn clips_bound_the_ratio_at_their_edges() {
        let objective = ClippedObjective { kl_coef: 0.0, ..ClippedObjective::default() };
        // A positive advantage gains nothing beyond 1 + clip_high…
        let high = objective.token((1.5f32).ln(), 0.0, None, 1.0);
        assert!(high.clipped && high.derivative == 0.0);
        assert!((high.policy + 1.285).abs() < 1e-6);
        // …a negative one nothing below 1 − clip_low…
        let low = objective.token((0.5f32).ln(), 0.0, None, -1.0);
        assert!(low.clipped && low.derivative == 0.0);
        assert!((low.policy - 0.8).abs() < 1e-6);
        // …and its loss is capped at clip_dual · |A| however large the ratio.
        let dual = objective.token((10.0f32).ln(), 0.0, None, -1.0);
        assert_eq!((dual.policy, dual.derivative), (3.0, 0.0));
        // Inside the clips the gradient flows.
        let inside = objective.token((1.1f32).ln(), 0.0, None, 1.0);
        assert!(!inside.clipped && (inside.derivative + 1.1).abs() < 1e-6);
    }

    #[test]
    fn grpo_normalises_within_groups_and_counts_groups_without_signal() {
        let (advantages, groups, without_signal) =
            group_advantages(&[1.0, 0.0, 0.0, 1.0, 1.0, 0.5], &[7, 7, 7, 9, 9, 4]);
        assert_eq!((groups, without_signal.len()), (3, 1));
        // Group 7: mean 1/3, unbiased std 0.57735.
        assert!((advantages[0] - (2.0 / 3.0) / (0.5773503 + 1e-6)).abs() < 1e-5);
        assert!((advantages[1] + (1.0 / 3.0) / (0.5773503 + 1e-6)).abs() < 1e-5);
        assert_eq!(&advantages[3..5], &[0.0, 0.0]);
        assert!((advantages[5] - 0.5 / (1.0 + 1e-6)).abs() < 1e-12);
    }

    #[test]
    fn a_baseline_equal_to_every_reward_leaves_no_advantage() {
        assert_eq!(baseline_advantages(&[0.5, 0.5], 0.5), [0.0, 0.0]);
    }
}
