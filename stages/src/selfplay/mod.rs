//! The SESA loop: the stage kinds `priming`, `propose`, `verify`, `solve`, `reward`, `collect`
//! and `consolidate`, the rules they apply, and the resources they share in a run.
//!
//! A step flows as tables: `proposals` → `verifications` → `rollouts` → `rewards` →
//! `failures`; the bank's history goes to `skills` (a snapshot per version) and `skill_events`,
//! and every stage appends its numbers to `step_metrics`. Only `solve` retrieves skills: the
//! proposer's prompt has no `{skills}` placeholder and `propose` never asks for the memory.

mod checks;
pub mod demonstrations;
mod resources;
mod rules;
mod stages;
pub mod training;

pub use self::resources::{InitialPolicy, LoopResources, PooledQuestion, SelfPlay, SkillMemory, Templates};
pub use self::rules::{
    FailureQueue, FrontierReward, IntermediateReward, ProposerReward, ValidityRules, judge_says_correct, solver_reward,
    verifier_answer,
};
pub use self::stages::{
    Collect, Consolidate, Evaluate, Priming, Propose, Reward, STEP_SUMMARY, Shown, Solve, Update, Verify, Warmup,
    metrics_batch, train_with_sesa,
};
pub use self::training::Training;
