//! AdamW with decoupled weight decay, gradient clipping by global norm, and the learning-rate
//! schedule. Element-wise over the trained tensors in a fixed order, so a step's result does not
//! depend on the thread count.

use rayon::prelude::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How the learning rate moves after warmup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// Stays at `lr`.
    Constant,
    /// Cosine from `lr` down to `min_lr` at the last optimizer step.
    Cosine,
}

/// Optimizer settings of a training stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OptimizerConfig {
    /// Peak learning rate.
    pub lr: f64,
    /// Optimizer steps of linear warmup from 0.
    #[serde(default)]
    pub warmup_steps: u64,
    /// After warmup.
    #[serde(default = "constant")]
    pub schedule: Schedule,
    /// Where the cosine schedule ends.
    #[serde(default)]
    pub min_lr: f64,
    /// Decoupled weight decay (AdamW).
    #[serde(default)]
    pub weight_decay: f64,
    /// Adam's β₁.
    #[serde(default = "beta1")]
    pub beta1: f64,
    /// Adam's β₂.
    #[serde(default = "beta2")]
    pub beta2: f64,
    /// Adam's ε.
    #[serde(default = "eps")]
    pub eps: f64,
    /// Gradients are scaled down to this global L2 norm when larger; 0 turns clipping off.
    #[serde(default = "clip")]
    pub clip_norm: f64,
}

fn constant() -> Schedule {
    Schedule::Constant
}
fn beta1() -> f64 {
    0.9
}
fn beta2() -> f64 {
    0.999
}
fn eps() -> f64 {
    1e-8
}
fn clip() -> f64 {
    1.0
}

impl OptimizerConfig {
    /// Plain AdamW at `lr`: no warmup, no decay, clipping at 1.
    pub fn adamw(lr: f64) -> OptimizerConfig {
        OptimizerConfig {
            lr,
            warmup_steps: 0,
            schedule: Schedule::Constant,
            min_lr: 0.0,
            weight_decay: 0.0,
            beta1: beta1(),
            beta2: beta2(),
            eps: eps(),
            clip_norm: clip(),
        }
    }

    /// What is wrong with these settings, as (key, problem).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            problems.push(("lr", format!("must be a positive number, got {}", self.lr)));
        }
        for (key, value) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&value) {
                problems.push((key, format!("must be in [0, 1), got {value}")));
            }
        }
        if self.eps <= 0.0 {
            problems.push(("eps", "must be positive".into()));
        }
        if self.weight_decay < 0.0 || self.clip_norm < 0.0 || self.min_lr < 0.0 {
            problems.push(("weight_decay", "weight_decay, clip_norm and min_lr cannot be negative".into()));
        }
        problems
    }

    /// The learning rate of optimizer step `step` (1-based) out of `total`.
    pub fn lr_at(&self, step: u64, total: u64) -> f64 {
        if step <= self.warmup_steps {
            return self.lr * step as f64 / (self.warmup_steps + 1) as f64;
        }
        match self.schedule {
            Schedule::Constant => self.lr,
            Schedule::Cosine => {
                let span = total.saturating_sub(self.warmup_steps).max(1) as f64;
                let progress = ((step - self.warmup_steps) as f64 / span).min(1.0);
                self.min_lr + 0.5 * (self.lr - self.min_lr) * (1.0 + (std::f64::consts::PI * progress).cos())
            }
        }
    }
}

/// AdamW's moments for a list of tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamW {
    /// Steps taken.
    pub step: u64,
    /// First moments, one per tensor.
    pub m: Vec<Vec<f32>>,
    /// Second moments.
    pub v: Vec<Vec<f32>>,
}

/// Chunk of elements per parallel job.
const CHUNK: usize = 1 << 14;

impl AdamW {
    /// Zero moments for tensors of these lengths.
    pub fn new(lengths: &[usize]) -> AdamW {
        AdamW {
            step: 0,
            m: lengths.iter().map(|&n| vec![0.0; n]).collect(),
            v: lengths.iter().map(|&n| vec![0.0; n]).collect(),
        }
    }

    /// One step over `params` with `grads` (same order and lengths as at creation), after
    /// scaling the gradients by `grad_scale` (clipping).
    pub fn update(
        &mut self,
        config: &OptimizerConfig,
        lr: f64,
        params: Vec<&mut [f32]>,
        grads: Vec<&[f32]>,
        grad_scale: f32,
    ) {
        self.step += 1;
        let (b1, b2) = (config.beta1 as f32, config.beta2 as f32);
        let correction1 = 1.0 - config.beta1.powi(self.step as i32);
        let correction2 = 1.0 - config.beta2.powi(self.step as i32);
        let step_size = (lr / correction1) as f32;
        let (eps, decay) = (config.eps as f32, (lr * config.weight_decay) as f32);
        let root2 = correction2.sqrt() as f32;
        for (((p, g), m), v) in params.into_iter().zip(grads).zip(&mut self.m).zip(&mut self.v) {
            p.par_chunks_mut(CHUNK)
                .zip(g.par_chunks(CHUNK))
                .zip(m.par_chunks_mut(CHUNK))
                .zip(v.par_chunks_mut(CHUNK))
                .for_each(|(((p, g), m), v)| {
                    for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
                        let g = g * grad_scale;
                        *m = b1 * *m + (1.0 - b1) * g;
                        *v = b2 * *v + (1.0 - b2) * g * g;
                        *p -= decay * *p + step_size * *m / (v.sqrt() / root2 + eps);
                    }
                });
        }
    }
}

/// The global L2 norm of `grads` (summed in f64, in a fixed order of chunks).
pub fn global_norm(grads: &[&[f32]]) -> f64 {
    grads
        .iter()
        .map(|g| {
            let partial: Vec<f64> =
                g.par_chunks(CHUNK).map(|c| c.iter().map(|&x| f64::from(x) * f64::from(x)).sum()).collect();
            partial.iter().sum::<f64>()
        })
        .sum::<f64>()
        .sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_warms_up_then_holds_or_decays() {
        let mut config = OptimizerConfig { warmup_steps: 3, ..OptimizerConfig::adamw(1.0) };
        assert_eq!(config.lr_at(1, 10), 0.25);
        assert_eq!(config.lr_at(4, 10), 1.0);
        assert_eq!(config.lr_at(10, 10), 1.0);
        config.schedule = Schedule::Cosine;
        config.min_lr = 0.1;
        assert!((config.lr_at(10, 10) - 0.1).abs() < 1e-12);
        assert!(config.lr_at(6, 10) < 1.0 && config.lr_at(6, 10) > config.lr_at(8, 10));
    }

    #[test]
    fn adamw_moves_each_weight_against_its_gradient_by_about_lr() {
        let config = OptimizerConfig::adamw(0.1);
        let mut params = vec![1.0f32, 1.0, 1.0];
        let mut adam = AdamW::new(&[3]);
        adam.update(&config, 0.1, vec![&mut params], vec![&[2.0, -0.5, 0.0]], 1.0);
        assert!((params[0] - 0.9).abs() < 1e-5 && (params[1] - 1.1).abs() < 1e-5 && params[2] == 1.0, "{params:?}");
        assert_eq!(global_norm(&[&[3.0, 4.0]]), 5.0);
    }
}
