//! Skills as data: the 5-tuple `(u, c, a, z, m)` and the file format that holds a bank
//! (`specs/skills/seed.yaml`, `sesa skills export`, `schemas/skill.schema.json`).

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::sanitize::{clean, limits};

/// What a skill says: written by hand (seeds) or by the judge (distilled). The judge's output is
/// constrained to this schema, so the length limits here bound what a model can write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillText {
    /// u: the strategy, in a sentence or two.
    #[schemars(length(min = 1, max = 300))]
    pub description: String,
    /// c: when the strategy applies.
    #[schemars(length(min = 1, max = 200))]
    pub trigger: String,
    /// a: what not to do (anti-patterns the failures showed).
    #[serde(default)]
    #[schemars(length(max = 3), inner(length(min = 1, max = 150)))]
    pub avoid: Vec<String>,
    /// z: a reusable search-query template, with `<slots>` for the parts that change.
    #[schemars(length(min = 1, max = 150))]
    pub query_template: String,
}

impl SkillText {
    /// The text the same skill is found by: description and trigger.
    pub fn embedding_text(&self) -> String {
        format!("{} {}", self.description, self.trigger)
    }

    /// The skill with protocol tags and chat markers stripped and every field cut to its
    /// limit: model-written text goes into another model's prompt only through here. `None` when
    /// a required field is empty after cleaning.
    pub fn sanitized(&self) -> Option<SkillText> {
        let text = SkillText {
            description: clean(&self.description, limits::DESCRIPTION),
            trigger: clean(&self.trigger, limits::TRIGGER),
            avoid: self
                .avoid
                .iter()
                .map(|a| clean(a, limits::AVOID))
                .filter(|a| !a.is_empty())
                .take(limits::AVOID_ITEMS)
                .collect(),
            query_template: clean(&self.query_template, limits::QUERY_TEMPLATE),
        };
        let complete = !text.description.is_empty() && !text.trigger.is_empty() && !text.query_template.is_empty();
        complete.then_some(text)
    }

    /// The first of `answers` the skill quotes, as whole words after answer normalisation
    /// (case, punctuation and articles ignored). A skill that quotes an answer of the failures
    /// it was distilled from leaks that answer into the solver's prompt: it is not a strategy.
    pub fn quoted_answer<'a>(&self, answers: &[&'a str]) -> Option<&'a str> {
        let text = self.render();
        answers.iter().copied().find(|answer| crate::data::metrics::contains_answer(&text, answer))
    }

    /// The skill as the solver sees it in its prompt.
    pub fn render(&self) -> String {
        let mut out = format!("- {} Use when: {} Query: {}", self.description, self.trigger, self.query_template);
        if !self.avoid.is_empty() {
            out.push_str(&format!(" Avoid: {}", self.avoid.join("; ")));
        }
        out
    }
}

/// m: where a skill came from and what it has done since.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillMeta {
    /// Questions it was retrieved for.
    #[serde(default)]
    pub retrievals: u64,
    /// Credit from successful solver rollouts that saw it (see `UsageRule`).
    #[serde(default)]
    pub helps: u64,
    /// Blame from failed solver rollouts that saw it.
    #[serde(default)]
    pub harms: u64,
    /// The step that added it (0: before the run).
    #[serde(default)]
    pub origin_step: u64,
    /// The failure records it was distilled from (its lineage).
    #[serde(default)]
    pub origin_failures: Vec<String>,
    /// A hand-written priming anchor: never evicted.
    #[serde(default)]
    pub seed: bool,
    /// The bank version that added it.
    #[serde(default)]
    pub version_added: u64,
}

impl SkillMeta {
    /// helps − harms: what eviction ranks by.
    pub fn utility(&self) -> i64 {
        self.helps as i64 - self.harms as i64
    }
}

/// The skills block of the solver's prompt (`{skills}`; empty without skills).
pub fn prompt_block(skills: &[&Skill]) -> String {
    if skills.is_empty() {
        return String::new();
    }
    let lines: Vec<String> = skills.iter().map(|s| s.text.render()).collect();
    format!("Search strategies that helped on similar questions:\n{}\n\n", lines.join("\n"))
}

/// A skill in a bank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Skill {
    /// Unique within a bank: `seed-NN` for seeds, `s<step>-<n>` for distilled skills.
    pub id: String,
    /// u, c, a, z.
    pub text: SkillText,
    /// m.
    #[serde(default)]
    pub meta: SkillMeta,
}

/// A bank as a file: the seed skills (`specs/skills/seed.yaml`), an export (`sesa skills
/// export`), or a bank to start a run from. JSON or YAML; `schemas/skill.schema.json` is its
/// schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillFile {
    /// The bank version the file was exported at (0 for hand-written files).
    #[serde(default)]
    pub version: u64,
    /// The skills.
    pub skills: Vec<Skill>,
}

/// A skill file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct SkillFileError {
    /// The file.
    pub path: String,
    /// What is wrong, with the key where there is one.
    pub message: String,
}

impl SkillFile {
    /// Reads and checks a skill file (YAML or JSON): known keys only, unique ids, every text
    /// field non-empty and within its limit.
    pub fn load(path: &Path) -> Result<SkillFile, SkillFileError> {
        let error = |message: String| SkillFileError { path: path.display().to_string(), message };
        let text = std::fs::read_to_string(path).map_err(|e| error(format!("cannot read: {e}")))?;
        let file: SkillFile = serde_path_to_error::deserialize(serde_yaml::Deserializer::from_str(&text))
            .map_err(|e| error(format!("{}: {}", e.path(), e.inner())))?;
        file.check().map_err(error)?;
        Ok(file)
    }

    /// Unique ids, texts that survive sanitising unchanged.
    pub fn check(&self) -> Result<(), String> {
        let mut seen = std::collections::HashSet::new();
        for (index, skill) in self.skills.iter().enumerate() {
            if skill.id.is_empty() || !seen.insert(skill.id.as_str()) {
                return Err(format!("skills[{index}].id: `{}` is empty or not unique", skill.id));
            }
            match skill.text.sanitized() {
                Some(clean) if clean == skill.text => {}
                Some(_) => {
                    return Err(format!(
                        "skills[{index}] (`{}`): a field is over its length limit or holds protocol tags \
                         such as <answer> or chat markers; shorten or remove them (limits: description {}, \
                         trigger {}, each of at most {} avoid cues {}, query_template {} characters)",
                        skill.id,
                        limits::DESCRIPTION,
                        limits::TRIGGER,
                        limits::AVOID_ITEMS,
                        limits::AVOID,
                        limits::QUERY_TEMPLATE
                    ));
                }
                None => {
                    return Err(format!(
                        "skills[{index}] (`{}`): description, trigger and query_template must not be empty",
                        skill.id
                    ));
                }
            }
        }
        Ok(())
    }

    /// The JSON Schema of skill files.
    pub fn json_schema() -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(SkillFile)).expect("a schema is JSON")
    }
}
