//! Specs: YAML files in, a validated [`Spec`] out.
//!
//! Loading goes through two layers, like raw flags and resolved arguments: `source` reads the
//! files, follows `extends:`, merges and applies `--set`; this module types the merged document
//! with the registry's stage kinds and sections, collecting every problem it finds. The graph
//! checks (edges, cycles, tables) happen in [`crate::plan`].

// Spec errors carry their context (file, line, key) by design, and are off the hot path.
#![allow(clippy::result_large_err)]

mod error;
mod schedule;
mod source;

use std::path::PathBuf;
use std::sync::Arc;

use serde_yaml::Value;

pub use self::error::{SpecError, SpecErrors};
pub use self::schedule::Schedule;
pub use self::source::{Location, SourceDoc};
use crate::registry::{CORE_KEYS, Registry};
use crate::requirement::{Requirement, Resource, SpecRequirement, is_provided};
use crate::resources::Resources;
use crate::stage::DynStage;

/// The most steps a spec may ask for: far beyond any run (the paper's is 150), so that a typo
/// is refused here rather than discovered in the run's tables.
const MAX_STEPS: u64 = 10_000_000;

/// A typed, checked spec. Build it with [`crate::load_pipeline`] or [`Spec::from_source`].
#[derive(Clone)]
pub struct Spec {
    /// The experiment's name.
    pub name: String,
    /// What the experiment is for, if the spec says.
    pub description: Option<String>,
    /// The run seed.
    pub seed: u64,
    /// How many steps to run.
    pub steps: u64,
    /// The stage instances, in the order the spec lists them.
    pub stages: Vec<StageInstance>,
    /// The typed sections, as resources.
    pub(crate) sections: Resources,
    /// What the sections and stages need from outside the run, less what they provide.
    pub requirements: Vec<SpecRequirement>,
    /// The merged document, `extends` resolved and overrides applied.
    pub resolved: Value,
}

/// One entry of `stages:`.
#[derive(Clone)]
pub struct StageInstance {
    /// Its name in the spec.
    pub name: String,
    /// Its kind.
    pub kind: String,
    /// The stages it runs after.
    pub after: Vec<String>,
    /// When it runs.
    pub schedule: Schedule,
    /// Its own config as written (no defaults), as JSON: for fingerprints and graphs.
    pub(crate) config: serde_json::Value,
    pub(crate) stage: Arc<dyn DynStage>,
}

impl StageInstance {
    /// Its own config as written in the spec (no defaults), as JSON.
    pub fn config(&self) -> &serde_json::Value {
        &self.config
    }
}

impl std::fmt::Debug for StageInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StageInstance")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("after", &self.after)
            .field("schedule", &self.schedule)
            .finish()
    }
}

impl Spec {
    /// Types a merged document, collecting every problem.
    pub fn from_source(source: &SourceDoc, registry: &Registry) -> Result<Spec, SpecErrors> {
        let mut problems = Vec::new();
        let type_error = |key: &str, message: String| SpecError::Type {
            location: source.locate(key),
            key: key.to_string(),
            message,
        };
        let empty = serde_yaml::Mapping::new();
        let top = source.value.as_mapping().unwrap_or(&empty);
        let section_keys: Vec<&str> = registry.sections.iter().map(|s| s.key).collect();
        for key in top.keys() {
            let known = key.as_str().is_some_and(|k| CORE_KEYS.contains(&k) || section_keys.contains(&k));
            if !known {
                let name = key.as_str().map(str::to_string).unwrap_or_else(|| format!("{key:?}"));
                let mut expected: Vec<&str> = CORE_KEYS.to_vec();
                expected.extend(&section_keys);
                problems.push(type_error(&name, format!("unknown key; a spec has: {}", expected.join(", "))));
            }
        }

        let name = match top.get("name") {
            Some(Value::String(name)) if !name.trim().is_empty() => name.clone(),
            Some(_) => {
                problems.push(type_error("name", "expected a non-empty string".into()));
                String::new()
            }
            None => {
                problems.push(type_error("name", "missing: every spec needs a `name`".into()));
                String::new()
            }
        };
        let description = match top.get("description") {
            None => None,
            Some(Value::String(text)) => Some(text.clone()),
            Some(_) => {
                problems.push(type_error("description", "expected a string".into()));
                None
            }
        };
        let seed = match top.get("seed") {
            Some(value) => value.as_u64().unwrap_or_else(|| {
                problems.push(type_error("seed", "expected a non-negative integer".into()));
                0
            }),
            None => {
                problems
                    .push(type_error("seed", "missing: every spec needs a `seed` (any non-negative integer)".into()));
                0
            }
        };
        let steps = match top.get("steps") {
            Some(value) => match value.as_u64() {
                Some(steps) if (1..=MAX_STEPS).contains(&steps) => steps,
                _ => {
                    problems.push(type_error("steps", format!("expected an integer between 1 and {MAX_STEPS}")));
                    1
                }
            },
            None => {
                problems.push(type_error("steps", "missing: every spec needs `steps` (an integer >= 1)".into()));
                1
            }
        };

        let mut sections = Resources::new();
        let mut required: Vec<(String, Requirement)> = Vec::new();
        let mut provided: Vec<PathBuf> = Vec::new();
        for section in &registry.sections {
            let Some(value) = top.get(section.key) else {
                continue;
            };
            match (section.insert)(value.clone(), &mut sections) {
                Ok(needs) => {
                    required.extend(needs.requirements.into_iter().map(|r| (section.key.to_string(), r)));
                    provided.extend(needs.provides);
                }
                Err(found) => {
                    for problem in found {
                        let key = join(section.key, &problem.key);
                        problems.push(type_error(&key, problem.message));
                    }
                }
            }
        }

        let mut stages = Vec::new();
        match top.get("stages") {
            // A spec without stages still describes an environment (models, search...).
            None => {}
            Some(Value::Mapping(map)) => {
                for (stage_name, value) in map {
                    let Some(stage_name) = stage_name.as_str() else {
                        problems
                            .push(type_error("stages", format!("stage names must be strings, found {stage_name:?}")));
                        continue;
                    };
                    // Stage names become file names of the run's tables.
                    if stage_name.is_empty()
                        || !stage_name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                    {
                        problems.push(type_error(
                            &format!("stages.{stage_name}"),
                            "stage names may only use letters, digits, `_` and `-`".into(),
                        ));
                        continue;
                    }
                    match parse_stage(stage_name, value, registry, source) {
                        Ok(instance) => stages.push(instance),
                        Err(found) => problems.extend(found),
                    }
                }
                problems.extend(dangling_after(map, source));
            }
            Some(_) => problems.push(type_error("stages", "expected a mapping of stage names to stages".into())),
        }

        for stage in &stages {
            let prefix = format!("stages.{}", stage.name);
            required.extend(stage.stage.requirements().into_iter().map(|r| (prefix.clone(), r)));
            provided.extend(stage.stage.provides());
        }
        let requirements = required
            .into_iter()
            .filter(|(_, r)| !matches!(&r.resource, Resource::Path(path) if is_provided(path, &provided)))
            .map(|(prefix, requirement)| {
                let key = join(&prefix, &requirement.key);
                SpecRequirement { location: source.locate(&key), key, requirement }
            })
            .collect();

        if problems.is_empty() {
            Ok(Spec { name, description, seed, steps, stages, sections, requirements, resolved: source.value.clone() })
        } else {
            Err(SpecErrors(problems))
        }
    }

    /// The typed section of type `T`, if the spec has it.
    pub fn section<T: std::any::Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.sections.get::<T>()
    }

    /// Whether stage `later` always runs after stage `earlier` within a step: `earlier` is
    /// reachable from `later` through `after:` lists. Two stages ordered neither way may run at
    /// the same time.
    pub fn runs_after(&self, later: &str, earlier: &str) -> bool {
        let mut seen = std::collections::HashSet::new();
        let mut pending = vec![later];
        while let Some(name) = pending.pop() {
            let Some(stage) = self.stages.iter().find(|s| s.name == name) else { continue };
            for before in &stage.after {
                if before == earlier {
                    return true;
                }
                if seen.insert(before.as_str()) {
                    pending.push(before);
                }
            }
        }
        false
    }
}

/// `after:` entries that name no stage of the spec. Checked on the raw mapping so that the
/// problem is reported even when the stage itself has other problems.
fn dangling_after(stages: &serde_yaml::Mapping, source: &SourceDoc) -> Vec<SpecError> {
    let names: Vec<String> = stages.keys().filter_map(|k| k.as_str().map(str::to_string)).collect();
    let mut problems = Vec::new();
    for (name, value) in stages {
        let (Some(name), Some(after)) = (name.as_str(), value.get("after")) else {
            continue;
        };
        let listed: Vec<&str> = match after {
            Value::Sequence(items) => items.iter().filter_map(Value::as_str).collect(),
            Value::String(single) => vec![single.as_str()],
            _ => continue,
        };
        for missing in listed.into_iter().filter(|a| !names.iter().any(|n| n == a)) {
            problems.push(SpecError::MissingAfter {
                location: source.locate(&format!("stages.{name}.after")),
                stage: name.to_string(),
                missing: missing.to_string(),
                stages: names.clone(),
            });
        }
    }
    problems
}

fn join(prefix: &str, key: &str) -> String {
    if key.is_empty() { prefix.to_string() } else { format!("{prefix}.{key}") }
}

fn parse_stage(
    name: &str,
    value: &Value,
    registry: &Registry,
    source: &SourceDoc,
) -> Result<StageInstance, Vec<SpecError>> {
    let prefix = format!("stages.{name}");
    let type_error = |key: &str, message: String| {
        let key = join(&prefix, key);
        SpecError::Type { location: source.locate(&key), key, message }
    };
    let Value::Mapping(map) = value else {
        return Err(vec![type_error("", "expected a mapping with at least `kind:`".into())]);
    };
    let mut config = map.clone();
    let mut problems = Vec::new();
    let kind = match config.remove("kind") {
        Some(Value::String(kind)) => kind,
        Some(_) => {
            return Err(vec![type_error("kind", "expected the name of a stage kind".into())]);
        }
        None => {
            return Err(vec![type_error(
                "kind",
                format!("missing; known kinds: {}", registry.stage_kinds().join(", ")),
            )]);
        }
    };
    let after = match config.remove("after") {
        None => Vec::new(),
        Some(Value::Sequence(items)) => items
            .iter()
            .filter_map(|item| match item.as_str() {
                Some(stage) => Some(stage.to_string()),
                None => {
                    problems.push(type_error("after", format!("expected stage names, found {item:?}")));
                    None
                }
            })
            .collect(),
        Some(Value::String(single)) => vec![single],
        Some(_) => {
            problems.push(type_error("after", "expected a list of stage names".into()));
            Vec::new()
        }
    };
    let schedule = match config.remove("schedule") {
        None => Schedule::EveryStep,
        Some(value) => Schedule::from_yaml(&value).unwrap_or_else(|message| {
            problems.push(type_error("schedule", message));
            Schedule::EveryStep
        }),
    };
    let Some(entry) = registry.stages.get(kind.as_str()) else {
        let key = format!("{prefix}.kind");
        problems.push(SpecError::UnknownStageKind {
            location: source.locate(&key),
            stage: name.to_string(),
            kind,
            known: registry.stage_kinds(),
        });
        return Err(problems);
    };
    let config_value = Value::Mapping(config);
    let config_json = serde_json::to_value(&config_value).unwrap_or(serde_json::Value::Null);
    match (entry.build)(config_value) {
        Ok(stage) if problems.is_empty() => {
            Ok(StageInstance { name: name.to_string(), kind, after, schedule, config: config_json, stage })
        }
        Ok(_) => Err(problems),
        Err(found) => {
            problems.extend(found.into_iter().map(|problem| type_error(&problem.key, problem.message)));
            Err(problems)
        }
    }
}
