//! The bank as tables: `skills` (one snapshot per bank version) and `skill_events` (what
//! happened to the bank and why). Snapshots read back into skills, for `sesa skills` and for
//! restoring the bank when a run resumes.

use std::sync::{Arc, LazyLock};

use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::{Array, ArrayRef, BooleanArray, Float32Array, ListArray, RecordBatch, StringArray, UInt64Array};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};

use super::bank::SkillEvent;
use super::skill::{Skill, SkillMeta, SkillText};

fn list_of_strings() -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Utf8, true)))
}

/// `skills`: every skill of every committed bank version.
pub static SKILLS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("version", DataType::UInt64, false),
        Field::new("skill_id", DataType::Utf8, false),
        Field::new("description", DataType::Utf8, false),
        Field::new("trigger", DataType::Utf8, false),
        Field::new("avoid", list_of_strings(), false),
        Field::new("query_template", DataType::Utf8, false),
        Field::new("retrievals", DataType::UInt64, false),
        Field::new("helps", DataType::UInt64, false),
        Field::new("harms", DataType::UInt64, false),
        Field::new("origin_step", DataType::UInt64, false),
        Field::new("origin_failures", list_of_strings(), false),
        Field::new("seed", DataType::Boolean, false),
        Field::new("version_added", DataType::UInt64, false),
    ]))
});

/// `skill_events`: additions, rejections (with the nearest skill and similarity), evictions
/// (with the reason) and retrievals.
pub static SKILL_EVENTS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("version", DataType::UInt64, false),
        Field::new("event", DataType::Utf8, false),
        Field::new("skill_id", DataType::Utf8, false),
        Field::new("description", DataType::Utf8, false),
        Field::new("nearest_skill_id", DataType::Utf8, true),
        Field::new("similarity", DataType::Float32, true),
        Field::new("reason", DataType::Utf8, false),
        Field::new("question_id", DataType::Utf8, true),
    ]))
});

fn strings<'a>(values: impl IntoIterator<Item = &'a str>) -> ArrayRef {
    Arc::new(StringArray::from_iter_values(values))
}

fn lists<'a>(values: impl IntoIterator<Item = &'a [String]>) -> ArrayRef {
    let mut builder = ListBuilder::new(StringBuilder::new());
    for list in values {
        for item in list {
            builder.values().append_value(item);
        }
        builder.append(true);
    }
    Arc::new(builder.finish())
}

/// The snapshot of `skills` at `version`.
pub fn skills_batch(version: u64, skills: &[Skill]) -> Result<RecordBatch, ArrowError> {
    let u64s = |f: &dyn Fn(&SkillMeta) -> u64| -> ArrayRef {
        Arc::new(UInt64Array::from_iter_values(skills.iter().map(|s| f(&s.meta))))
    };
    RecordBatch::try_new(
        SKILLS_SCHEMA.clone(),
        vec![
            Arc::new(UInt64Array::from(vec![version; skills.len()])),
            strings(skills.iter().map(|s| s.id.as_str())),
            strings(skills.iter().map(|s| s.text.description.as_str())),
            strings(skills.iter().map(|s| s.text.trigger.as_str())),
            lists(skills.iter().map(|s| s.text.avoid.as_slice())),
            strings(skills.iter().map(|s| s.text.query_template.as_str())),
            u64s(&|m| m.retrievals),
            u64s(&|m| m.helps),
            u64s(&|m| m.harms),
            u64s(&|m| m.origin_step),
            lists(skills.iter().map(|s| s.meta.origin_failures.as_slice())),
            Arc::new(BooleanArray::from_iter(skills.iter().map(|s| Some(s.meta.seed)))),
            u64s(&|m| m.version_added),
        ],
    )
}

/// `events` as `skill_events` rows at bank `version`.
pub fn events_batch(version: u64, events: &[SkillEvent]) -> Result<RecordBatch, ArrowError> {
    RecordBatch::try_new(
        SKILL_EVENTS_SCHEMA.clone(),
        vec![
            Arc::new(UInt64Array::from(vec![version; events.len()])),
            strings(events.iter().map(|e| e.kind.as_str())),
            strings(events.iter().map(|e| e.skill_id.as_str())),
            strings(events.iter().map(|e| e.description.as_str())),
            Arc::new(StringArray::from_iter(events.iter().map(|e| e.nearest.as_deref()))),
            Arc::new(Float32Array::from_iter(events.iter().map(|e| e.similarity))),
            strings(events.iter().map(|e| e.reason.as_str())),
            Arc::new(StringArray::from_iter(events.iter().map(|e| e.question_id.as_deref()))),
        ],
    )
}

fn column<'a, T: 'static>(batch: &'a RecordBatch, name: &str) -> Result<&'a T, ArrowError> {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<T>())
        .ok_or_else(|| ArrowError::SchemaError(format!("`skills` table: column `{name}` is missing or mistyped")))
}

fn list_at(list: &ListArray, row: usize) -> Result<Vec<String>, ArrowError> {
    let values = list.value(row);
    let values = values
        .as_any()
        .downcast_ref::<StringArray>()
        .ok_or_else(|| ArrowError::SchemaError("`skills` table: a list column is not a list of strings".into()))?;
    Ok(values.iter().map(|v| v.unwrap_or_default().to_string()).collect())
}

/// The rows of a `skills` batch as (version, skill).
pub fn skills_from_batch(batch: &RecordBatch) -> Result<Vec<(u64, Skill)>, ArrowError> {
    let version = column::<UInt64Array>(batch, "version")?;
    let id = column::<StringArray>(batch, "skill_id")?;
    let description = column::<StringArray>(batch, "description")?;
    let trigger = column::<StringArray>(batch, "trigger")?;
    let avoid = column::<ListArray>(batch, "avoid")?;
    let template = column::<StringArray>(batch, "query_template")?;
    let retrievals = column::<UInt64Array>(batch, "retrievals")?;
    let helps = column::<UInt64Array>(batch, "helps")?;
    let harms = column::<UInt64Array>(batch, "harms")?;
    let origin_step = column::<UInt64Array>(batch, "origin_step")?;
    let origin_failures = column::<ListArray>(batch, "origin_failures")?;
    let seed = column::<BooleanArray>(batch, "seed")?;
    let version_added = column::<UInt64Array>(batch, "version_added")?;
    (0..batch.num_rows())
        .map(|row| {
            Ok((
                version.value(row),
                Skill {
                    id: id.value(row).to_string(),
                    text: SkillText {
                        description: description.value(row).to_string(),
                        trigger: trigger.value(row).to_string(),
                        avoid: list_at(avoid, row)?,
                        query_template: template.value(row).to_string(),
                    },
                    meta: SkillMeta {
                        retrievals: retrievals.value(row),
                        helps: helps.value(row),
                        harms: harms.value(row),
                        origin_step: origin_step.value(row),
                        origin_failures: list_at(origin_failures, row)?,
                        seed: seed.value(row),
                        version_added: version_added.value(row),
                    },
                },
            ))
        })
        .collect()
}
