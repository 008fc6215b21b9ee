//! `priming`: loads the initial skill bank from a skill file (the 15 seed skills, or an export
//! of an earlier run's bank), deduplicated under the run's `memory` rules, as bank version 1.

use std::path::PathBuf;
use std::time::Instant;

use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, Requirement, Stage, StageContext, StageError, TableSpec, Tables};

use super::{elapsed_ms, failed, metrics_batch, metrics_table, skill_events_table, skills_table};
use crate::memory::{BankConfig, DedupBy, SkillEventKind, SkillFile, events_batch, skills_batch};
use crate::selfplay::resources::SkillMemory;

/// The config of `priming`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PrimingConfig {
    /// A skill file: `specs/skills/seed.yaml`, or a bank from `sesa skills export`.
    pub skills: PathBuf,
}

/// Loads the initial bank.
pub struct Priming {
    config: PrimingConfig,
}

impl Stage for Priming {
    const KIND: &'static str = "priming";
    const ABOUT: &'static str = "load the initial skill bank (seed skills or an exported bank)";
    type Config = PrimingConfig;

    fn new(config: PrimingConfig) -> Result<Self, Vec<ConfigProblem>> {
        Ok(Priming { config })
    }

    fn outputs(&self) -> Vec<TableSpec> {
        vec![skills_table(), skill_events_table(), metrics_table()]
    }

    fn requirements(&self) -> Vec<Requirement> {
        vec![Requirement::path(
            "skills",
            &self.config.skills,
            "name a skill file: `specs/skills/seed.yaml` (the paper's 15 seed skills) or an export of a run's bank \
             (`sesa skills export RUN --out FILE`)",
        )]
    }

    async fn run(&self, cx: &StageContext, _inputs: Tables) -> Result<Tables, StageError> {
        let clock = Instant::now();
        let memory = cx
            .resource::<SkillMemory>()
            .map_err(|_| failed("priming", "the spec has no `memory:` section to load skills into"))?;
        let file = SkillFile::load(&self.config.skills).map_err(|e| StageError::Failed(e.to_string()))?;
        let texts: Vec<String> = file.skills.iter().map(|s| s.text.embedding_text()).collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let vectors = memory.embedder.embed(&refs).map_err(|e| failed("embedding skills", e))?;
        let mut bank = memory.bank.lock().expect("bank lock");
        let mut events = Vec::new();
        for (skill, vector) in file.skills.into_iter().zip(vectors) {
            events.extend(bank.admit(skill.id, skill.text, skill.meta, vector));
        }
        let duplicates = events.iter().filter(|e| e.kind == SkillEventKind::RejectedDuplicate).count();
        if duplicates > 0 {
            tracing::warn!("{}", duplicates_dropped(&self.config.skills, duplicates, texts.len(), bank.config()));
        }
        let version = bank.commit().unwrap_or(bank.version());
        let metrics = [
            ("bank_size", bank.len() as f64),
            ("rejected_duplicates", duplicates as f64),
            ("wall_ms", elapsed_ms(clock)),
        ];
        Ok(Tables::new()
            .with("skills", skills_batch(version, bank.skills())?)
            .with("skill_events", events_batch(version, &events)?)
            .with("step_metrics", metrics_batch(cx.stage_name(), &metrics)?))
    }
}

/// Why a primed bank lost skills of its file as duplicates. An export of a bank built under
/// `dedup_by: trigger` (rule-made skills, one per question pattern) loses most of its deep
/// patterns when loaded under the default rule: their triggers differ only in relation words,
/// which the embedding places above the threshold.
fn duplicates_dropped(file: &std::path::Path, dropped: usize, total: usize, rules: &BankConfig) -> String {
    let rule = match rules.dedup_by {
        DedupBy::Embedding => format!(
            "`memory.dedup_by: embedding` (cosine above `memory.dedup_threshold` {}); a bank exported from a run \
             with `dedup_by: trigger` (one skill per question pattern, for `distiller: rules`) loads whole under the same rule",
            rules.dedup_threshold
        ),
        DedupBy::Trigger => "`memory.dedup_by: trigger` (the same trigger as a skill loaded before)".to_string(),
    };
    format!("priming {}: {dropped} of {total} skills were rejected as duplicates under {rule}", file.display())
}
