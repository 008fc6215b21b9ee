//! Checks of a whole spec that no one section or stage can make alone: who trains which model
//! and how (in process, by an external trainer, served where), and whether the stages that
//! read the policy are ordered with the stages that train it. They run before a run is created,
//! so a mistake is reported before the first step's rollouts rather than after them.

use sesa_engine::spec::Spec;
use sesa_engine::{ConfigProblem, Stage};

use super::stages::{
    Consolidate, Evaluate, Propose, Reward, Solve, Update, UpdateConfig, Verify, Warmup, WarmupConfig,
};
use crate::agent::Role;
use crate::sections::{JudgeSection, ModelSection, ProposerModelSection};

/// Every problem of training in `spec` (see [`super::LoopResources::training_problems`]).
pub(super) fn training_problems(spec: &Spec) -> Vec<ConfigProblem> {
    let mut problems = unordered_policy_readers(spec);
    problems.extend(misplaced_training(spec));
    problems
}

/// Who trains which model, as the spec's training stages would get it wrong: a stage that
/// trains in process a model served by mistral.rs or a server; a model trained both in process
/// (a warm start, an update) and by an external trainer, which starts from the initial weights
/// it is configured with and would drop the other's work; and an external update of a model
/// whose servers nothing tells to load the new checkpoints. Each training stage's roles are
/// read from its typed config, with the stage's own defaults.
fn misplaced_training(spec: &Spec) -> Vec<ConfigProblem> {
    let Some(model) = spec.section::<ModelSection>() else {
        return Vec::new();
    };
    let proposer_model = spec.section::<ProposerModelSection>();
    let (mut problems, mut in_process, mut external) = (Vec::new(), Vec::new(), Vec::new());
    for stage in &spec.stages {
        let config = stage.config().clone();
        // A config that does not parse is reported with the spec's other problems.
        let (roles, trainer) = match stage.kind.as_str() {
            Warmup::KIND => match serde_json::from_value::<WarmupConfig>(config) {
                Ok(config) => (config.trained_roles(), None),
                Err(_) => continue,
            },
            Update::KIND => match serde_json::from_value::<UpdateConfig>(config) {
                Ok(config) => (config.trained_roles(), config.external),
                Err(_) => continue,
            },
            _ => continue,
        };
        let mut models: Vec<(&str, &ModelSection)> = roles
            .iter()
            .map(|role| match (role, &proposer_model) {
                (Role::Proposer, Some(proposer)) => ("proposer_model", &proposer.0),
                _ => ("model", &*model),
            })
            .collect();
        models.sort_unstable_by_key(|(key, _)| *key);
        models.dedup_by_key(|(key, _)| *key);
        if let Some(trainer) = trainer {
            let told = trainer.reload_command.is_some() || trainer.reload_url.is_some();
            for (key, section) in &models {
                external.push((stage.name.as_str(), *key));
                // The in-process backends load the trainer's checkpoint themselves.
                let problem = match section {
                    ModelSection::Candle(_) | ModelSection::Mistralrs(_) => continue,
                    ModelSection::Openai(_) if !told => format!(
                        "nothing tells the server of `{key}:` to load the trainer's checkpoints: set `reload_command` \
                         or `reload_url`"
                    ),
                    ModelSection::Openai(_) => continue,
                };
                problems.push(ConfigProblem::new(format!("stages.{}.external", stage.name), problem));
            }
            continue;
        }
        in_process.extend(models.iter().map(|(key, _)| (stage.kind.as_str(), *key)));
        for (key, _) in models.iter().filter(|(_, section)| !matches!(section, ModelSection::Candle(_))) {
            problems.push(ConfigProblem::new(
                format!("stages.{}", stage.name),
                format!(
                    "`{}` trains `{key}:` in process, which needs `backend: candle` there; with mistral.rs or an \
                     OpenAI-compatible server, give `update` an `external:` trainer (README, \"External trainer\")",
                    stage.kind
                ),
            ));
        }
    }
    for (stage, key) in external {
        let Some((kind, _)) = in_process.iter().find(|(_, k)| *k == key) else { continue };
        let export = if key == "proposer_model" { " --proposer" } else { "" };
        problems.push(ConfigProblem::new(
            format!("stages.{stage}.external"),
            format!(
                "`{key}:` is also trained in process (`{kind}`), but an external trainer starts from the initial \
                 weights it is configured with and would drop that training: train it one way, or run the \
                 in-process training alone, export it (`sesa model export RUN --version N{export} --out DIR`) and \
                 start this run and the trainer from DIR"
            ),
        ));
    }
    problems
}

/// Stages that read the policy and are ordered by `after:` neither before nor after a stage
/// that changes it, one problem per pair. Reward and consolidate read it only without a judge.
fn unordered_policy_readers(spec: &Spec) -> Vec<ConfigProblem> {
    let judged = spec.section::<JudgeSection>().is_some();
    let reads = |kind: &str| match kind {
        Propose::KIND | Solve::KIND | Verify::KIND | Evaluate::KIND => true,
        Reward::KIND | Consolidate::KIND => !judged,
        _ => false,
    };
    let trainers: Vec<&str> = spec
        .stages
        .iter()
        .filter(|s| [Warmup::KIND, Update::KIND].contains(&s.kind.as_str()))
        .map(|s| s.name.as_str())
        .collect();
    let mut problems = Vec::new();
    for reader in spec.stages.iter().filter(|s| reads(&s.kind)) {
        for &trainer in &trainers {
            if !spec.runs_after(&reader.name, trainer) && !spec.runs_after(trainer, &reader.name) {
                problems.push(ConfigProblem::new(
                    format!("stages.{}.after", reader.name),
                    format!(
                        "`{}` reads the policy that `{trainer}` trains, and neither runs after the other: the policy \
                         version it records would depend on which finishes first; add `{trainer}` to its `after:` \
                         (to use the trained policy) or it to `{trainer}`'s",
                        reader.name
                    ),
                ));
            }
        }
    }
    problems
}
