//! The bank as tables: `skills` (one snapshot per bank version) and `skill_events` (what
//! happened to the bank and why). Snapshots read back into skills, for `sesa skills` and for
//! restoring the bank when a run resumes.

use std::sync::LazyLock;

use arrow_array::RecordBatch;
use arrow_schema::{ArrowError, SchemaRef};

use super::bank::SkillEvent;
use super::skill::{Skill, SkillMeta, SkillText};
use sesa_engine::columns::{Columns, Reader, schema_of};

/// `skills`: every skill of every committed bank version.
pub static SKILLS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| schema_of(|| skills_batch(0, &[])));

/// `skill_events`: additions, rejections (with the nearest skill and similarity), evictions
/// (with the reason) and retrievals.
pub static SKILL_EVENTS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| schema_of(|| events_batch(0, &[])));

/// The snapshot of `skills` at `version`.
pub fn skills_batch(version: u64, skills: &[Skill]) -> Result<RecordBatch, ArrowError> {
    let meta = |f: fn(&SkillMeta) -> u64| skills.iter().map(move |s| f(&s.meta));
    Columns::default()
        .u64("version", skills.iter().map(|_| version))
        .str("skill_id", skills.iter().map(|s| s.id.as_str()))
        .str("description", skills.iter().map(|s| s.text.description.as_str()))
        .str("trigger", skills.iter().map(|s| s.text.trigger.as_str()))
        .strs("avoid", skills.iter().map(|s| s.text.avoid.iter().map(String::as_str)))
        .str("query_template", skills.iter().map(|s| s.text.query_template.as_str()))
        .u64("retrievals", meta(|m| m.retrievals))
        .u64("helps", meta(|m| m.helps))
        .u64("harms", meta(|m| m.harms))
        .u64("origin_step", meta(|m| m.origin_step))
        .strs("origin_failures", skills.iter().map(|s| s.meta.origin_failures.iter().map(String::as_str)))
        .bool("seed", skills.iter().map(|s| s.meta.seed))
        .u64("version_added", meta(|m| m.version_added))
        .finish()
}

/// `events` as `skill_events` rows at bank `version`.
pub fn events_batch(version: u64, events: &[SkillEvent]) -> Result<RecordBatch, ArrowError> {
    Columns::default()
        .u64("version", events.iter().map(|_| version))
        .str("event", events.iter().map(|e| e.kind.as_str()))
        .str("skill_id", events.iter().map(|e| e.skill_id.as_str()))
        .str("description", events.iter().map(|e| e.description.as_str()))
        .opt_str("nearest_skill_id", events.iter().map(|e| e.nearest.as_deref()))
        .opt_f64("similarity", events.iter().map(|e| e.similarity.map(f64::from)))
        .str("reason", events.iter().map(|e| e.reason.as_str()))
        .opt_str("question_id", events.iter().map(|e| e.question_id.as_deref()))
        .finish()
}

/// The rows of a `skills` batch as (version, skill).
pub fn skills_from_batch(batch: &RecordBatch) -> Result<Vec<(u64, Skill)>, ArrowError> {
    let reader = Reader::new("skills", batch);
    let read = || -> Result<Vec<(u64, Skill)>, sesa_engine::StageError> {
        let (version, id) = (reader.u64("version")?, reader.str("skill_id")?);
        let (description, trigger) = (reader.str("description")?, reader.str("trigger")?);
        let (avoid, template) = (reader.strs("avoid")?, reader.str("query_template")?);
        let (retrievals, helps, harms) = (reader.u64("retrievals")?, reader.u64("helps")?, reader.u64("harms")?);
        let (origin_step, origin_failures) = (reader.u64("origin_step")?, reader.strs("origin_failures")?);
        let (seed, version_added) = (reader.bool("seed")?, reader.u64("version_added")?);
        Ok((0..reader.rows())
            .map(|row| {
                let skill = Skill {
                    id: id[row].to_string(),
                    text: SkillText {
                        description: description[row].to_string(),
                        trigger: trigger[row].to_string(),
                        avoid: avoid[row].clone(),
                        query_template: template[row].to_string(),
                    },
                    meta: SkillMeta {
                        retrievals: retrievals[row],
                        helps: helps[row],
                        harms: harms[row],
                        origin_step: origin_step[row],
                        origin_failures: origin_failures[row].clone(),
                        seed: seed[row],
                        version_added: version_added[row],
                    },
                };
                (version[row], skill)
            })
            .collect())
    };
    read().map_err(|e| ArrowError::SchemaError(e.to_string()))
}
