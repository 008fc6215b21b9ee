//! The checked-in JSON Schemas match the code: specs (what `sesa schema` prints) and skill
//! files (the exchange format of `sesa skills export/import`).

use std::path::Path;

/// Regenerate with `cargo run -- schema > schemas/spec.schema.json`.
#[test]
fn checked_in_spec_schema_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/spec.schema.json");
    let generated = serde_json::to_string_pretty(&sesa_stages::registry().json_schema()).unwrap() + "\n";
    if std::env::var_os("SESA_UPDATE_SCHEMAS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "schemas/spec.schema.json is stale: run `cargo run -- schema > schemas/spec.schema.json` (or set SESA_UPDATE_SCHEMAS=1)"
    );
}

/// `schemas/skill.schema.json` documents skill files; `sesa skills schema` prints it.
#[test]
fn checked_in_skill_schema_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/skill.schema.json");
    let generated = serde_json::to_string_pretty(&sesa_stages::memory::SkillFile::json_schema()).unwrap() + "\n";
    if std::env::var_os("SESA_UPDATE_SCHEMAS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "schemas/skill.schema.json is stale: run `cargo run -- skills schema > schemas/skill.schema.json` (or set SESA_UPDATE_SCHEMAS=1)"
    );
}

#[test]
fn the_schema_describes_stage_kinds_and_sections() {
    let schema = crate::support::registry().json_schema();
    let variants = schema.pointer("/properties/stages/additionalProperties/anyOf/0/oneOf").unwrap().as_array().unwrap();
    let kinds: Vec<&str> =
        variants.iter().map(|v| v.pointer("/properties/kind/const").unwrap().as_str().unwrap()).collect();
    assert_eq!(kinds, ["fail", "numbers", "offsets", "square", "total"]);
    let numbers = &variants[1];
    assert_eq!(numbers.pointer("/properties/rows/type").unwrap(), "integer");
    assert_eq!(numbers.pointer("/additionalProperties").unwrap(), false);
    assert!(schema.pointer("/properties/limits").is_some());
    assert!(schema.pointer("/$defs/Schedule").is_some());
}
