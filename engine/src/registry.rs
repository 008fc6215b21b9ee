//! The registry of stage kinds and spec sections a binary knows about, and the JSON Schema of
//! specs built from them.
//!
//! The engine ships no stage kinds: a domain crate registers its own, and tests register
//! test-only kinds. Each registered type brings its typed config, so validation and the schema
//! come from one source.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use schemars::{JsonSchema, SchemaGenerator, generate::SchemaSettings};
use serde::de::DeserializeOwned;
use serde_json::{Value as Json, json};

use crate::requirement::Requirement;
use crate::resources::Resources;
use crate::stage::{ConfigProblem, DynStage, Stage};

/// A top-level section of a spec (such as `model:` or `search:`), typed by the crate that
/// registers it. The parsed section is available to stages as a resource of type `Self`.
pub trait Section: DeserializeOwned + JsonSchema + Send + Sync + 'static {
    /// The top-level key.
    const KEY: &'static str;

    /// Range and consistency checks beyond what the types say. Returns every problem.
    fn check(&self) -> Vec<ConfigProblem> {
        Vec::new()
    }

    /// What the section needs from outside the run (keys relative to the section).
    fn requirements(&self) -> Vec<Requirement> {
        Vec::new()
    }

    /// Paths the section creates on first use: requirements under them are met by the run.
    fn provides(&self) -> Vec<PathBuf> {
        Vec::new()
    }
}

/// What a typed section declares it needs and provides.
#[derive(Default)]
pub(crate) struct SectionNeeds {
    pub(crate) requirements: Vec<Requirement>,
    pub(crate) provides: Vec<PathBuf>,
}

type BuildStage = fn(serde_yaml::Value) -> Result<Arc<dyn DynStage>, Vec<ConfigProblem>>;
type SchemaFn = fn(&mut SchemaGenerator) -> schemars::Schema;
type InsertSection = fn(serde_yaml::Value, &mut Resources) -> Result<SectionNeeds, Vec<ConfigProblem>>;

pub(crate) struct StageKindEntry {
    pub(crate) about: &'static str,
    pub(crate) build: BuildStage,
    schema: SchemaFn,
}

pub(crate) struct SectionEntry {
    pub(crate) key: &'static str,
    pub(crate) insert: InsertSection,
    schema: SchemaFn,
}

/// The stage kinds and sections a spec may use.
#[derive(Default)]
pub struct Registry {
    pub(crate) stages: BTreeMap<&'static str, StageKindEntry>,
    pub(crate) sections: Vec<SectionEntry>,
}

/// The keys every spec has, whatever is registered.
pub(crate) const CORE_KEYS: &[&str] = &["name", "description", "seed", "steps", "stages"];

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Registry::default()
    }

    /// Registers stage kind `S` under `S::KIND`.
    ///
    /// # Panics
    /// If the kind is already registered: two kinds with one name is a programming error.
    pub fn stage<S: Stage>(&mut self) -> &mut Self {
        let entry = StageKindEntry {
            about: S::ABOUT,
            build: |value| {
                let config: S::Config = from_value(value)?;
                let stage = S::new(config)?;
                Ok(Arc::new(stage) as Arc<dyn DynStage>)
            },
            schema: |generator| generator.root_schema_for::<S::Config>(),
        };
        let previous = self.stages.insert(S::KIND, entry);
        assert!(previous.is_none(), "stage kind `{}` registered twice", S::KIND);
        self
    }

    /// Registers section `T` under `T::KEY`.
    ///
    /// # Panics
    /// If the key is taken by a core key or another section.
    pub fn section<T: Section>(&mut self) -> &mut Self {
        assert!(
            !CORE_KEYS.contains(&T::KEY) && self.sections.iter().all(|s| s.key != T::KEY),
            "section key `{}` is already taken",
            T::KEY
        );
        self.sections.push(SectionEntry {
            key: T::KEY,
            insert: |value, resources| {
                let section: T = from_value(value)?;
                let problems = section.check();
                if !problems.is_empty() {
                    return Err(problems);
                }
                let needs = SectionNeeds { requirements: section.requirements(), provides: section.provides() };
                resources.insert(Arc::new(section));
                Ok(needs)
            },
            schema: |generator| generator.root_schema_for::<T>(),
        });
        self
    }

    /// The registered stage kinds, sorted.
    pub fn stage_kinds(&self) -> Vec<String> {
        self.stages.keys().map(|k| k.to_string()).collect()
    }

    /// The JSON Schema of a spec file: core keys, every section, and every stage kind's config.
    ///
    /// A spec with `extends:` is checked against a partial copy of the same schema (see
    /// [`partial`]), since it overrides only the keys it names.
    pub fn json_schema(&self) -> Json {
        let mut generator = SchemaGenerator::new(SchemaSettings::draft2020_12());
        let mut stage_variants = Vec::new();
        for (kind, entry) in &self.stages {
            let mut schema = inline((entry.schema)(&mut generator));
            let object = schema.as_object_mut().expect("a stage config is an object");
            object.insert("description".into(), json!(entry.about));
            let properties = object.entry("properties").or_insert_with(|| json!({}));
            let properties = properties.as_object_mut().expect("properties is an object");
            properties.insert("kind".into(), json!({ "const": kind, "description": entry.about }));
            properties.insert(
                "after".into(),
                json!({ "type": "array", "items": { "type": "string" }, "description": "Stages that must finish first in every step where both run." }),
            );
            properties.insert("schedule".into(), json!({ "$ref": format!("#/$defs/{STAGE_SCHEDULE}") }));
            let required = object.entry("required").or_insert_with(|| json!([]));
            required.as_array_mut().expect("required is an array").push(json!("kind"));
            object.insert("additionalProperties".into(), json!(false));
            stage_variants.push(schema);
        }
        let mut properties = serde_json::Map::new();
        properties.insert(
            "extends".into(),
            json!({
                "anyOf": [{ "type": "string" }, { "type": "array", "items": { "type": "string" } }],
                "description": "Another spec, or a list of them, relative to this file, that this one overrides (deep merge, parents first, each file once; `key: null` removes a key)."
            }),
        );
        properties.insert("name".into(), json!({ "type": "string", "minLength": 1, "description": "The experiment's name; runs are named after it." }));
        properties.insert("description".into(), json!({ "type": "string" }));
        properties.insert("seed".into(), json!({ "type": "integer", "minimum": 0, "description": "The run seed; every random choice derives from (seed, step, stage, item)." }));
        properties.insert(
            "steps".into(),
            json!({ "type": "integer", "minimum": 1, "description": "How many steps to run." }),
        );
        for section in &self.sections {
            let schema = inline((section.schema)(&mut generator));
            properties.insert(section.key.into(), json!({ "anyOf": [schema, { "type": "null" }] }));
        }
        properties.insert(
            "stages".into(),
            json!({
                "type": "object",
                "description": "Stage instances by name; `name: null` removes one inherited through `extends`.",
                "additionalProperties": { "anyOf": [ { "oneOf": stage_variants }, { "type": "null" } ] }
            }),
        );
        let spec = json!({ "type": "object", "properties": properties, "additionalProperties": false });
        let mut definitions = generator.take_definitions(true);
        let taken = definitions.insert(STAGE_SCHEDULE.into(), schedule_schema());
        assert!(taken.is_none(), "a config type's schema is named `{STAGE_SCHEDULE}`, like the stage schedule");
        let partials: Vec<(String, Json)> =
            definitions.iter().map(|(name, schema)| (partial_name(name), partial(schema))).collect();
        definitions.extend(partials);
        definitions.insert(SPEC_OVERRIDE.into(), partial(&spec));
        definitions.insert(SPEC.into(), spec);
        json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "sesa experiment spec",
            "description": "A whole spec, or with `extends:` the keys it overrides in another (none required; `key: null` removes one).",
            "if": { "type": "object", "required": ["extends"] },
            "then": { "$ref": format!("#/$defs/{SPEC_OVERRIDE}") },
            "else": { "$ref": format!("#/$defs/{SPEC}") },
            "$defs": definitions,
        })
    }
}

/// The names of the definitions [`Registry::json_schema`] adds beside the config types'.
const SPEC: &str = "Spec";
const SPEC_OVERRIDE: &str = "SpecOverride";
const STAGE_SCHEDULE: &str = "StageSchedule";

fn partial_name(name: &str) -> String {
    format!("Partial{name}")
}

/// What an `extends:` spec may say where `schema` is the full one: the same keys and types, none
/// required, `null` allowed for every key (it removes the inherited one, so even a key another
/// variant has may be nulled), and maps merged entry by entry. A list replaces the inherited one whole, so its items keep the full schema. One-of
/// choices become any-of: a partial object without its tag can match several.
fn partial(schema: &Json) -> Json {
    let Some(object) = schema.as_object() else { return schema.clone() };
    let mut out = serde_json::Map::new();
    for (key, value) in object {
        let value = match key.as_str() {
            "required" => continue,
            "$ref" => match value.as_str().and_then(|r| r.strip_prefix("#/$defs/")) {
                Some(name) => json!(format!("#/$defs/{}", partial_name(name))),
                None => value.clone(),
            },
            "properties" => Json::Object(
                value
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(name, property)| (name.clone(), json!({ "anyOf": [partial(property), { "type": "null" }] })))
                    .collect(),
            ),
            // `key: null` removes what the base says, even where this variant has no such key.
            "additionalProperties" if value == &json!(false) => json!({ "type": "null" }),
            "additionalProperties" => partial(value),
            "anyOf" | "allOf" | "oneOf" => Json::Array(value.as_array().into_iter().flatten().map(partial).collect()),
            _ => value.clone(),
        };
        out.insert(if key == "oneOf" { "anyOf".into() } else { key.clone() }, value);
    }
    Json::Object(out)
}

/// Drops the copies of shared definitions that `root_schema_for` attaches to each root.
fn inline(schema: schemars::Schema) -> Json {
    let mut value = schema.to_value();
    if let Some(object) = value.as_object_mut() {
        object.remove("$defs");
        object.remove("$schema");
    }
    value
}

fn schedule_schema() -> Json {
    json!({
        "description": "When a stage runs: `every_step` (the default), `once` (step 1), `at_end` (the last step) or `{every: k}` (steps k, 2k, ...).",
        "oneOf": [
            { "type": "string", "enum": ["every_step", "once", "at_end"] },
            {
                "type": "object",
                "properties": { "every": { "type": "integer", "minimum": 1 } },
                "required": ["every"],
                "additionalProperties": false
            }
        ]
    })
}

/// Deserialises a config, reporting the dotted path of the first problem.
fn from_value<T: DeserializeOwned>(value: serde_yaml::Value) -> Result<T, Vec<ConfigProblem>> {
    serde_path_to_error::deserialize(value).map_err(|error| {
        let key = error.path().to_string();
        let key = if key == "." { String::new() } else { key };
        vec![ConfigProblem::new(key, error.into_inner().to_string())]
    })
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("stages", &self.stages.keys().collect::<Vec<_>>())
            .field("sections", &self.sections.iter().map(|s| s.key).collect::<Vec<_>>())
            .finish()
    }
}
