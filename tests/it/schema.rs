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

/// The specs whose stages write every table a shipped stage kind writes.
const TABLE_SPECS: [&str; 3] = ["specs/sesa.yaml", "specs/warmup.yaml", "specs/learn.yaml"];

/// The README's list of tables is `sesa tables` over [`TABLE_SPECS`]: regenerate it with
/// `SESA_UPDATE_SCHEMAS=1`.
#[test]
fn the_readme_lists_every_table_with_its_columns() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut args = vec!["tables"];
    args.extend(TABLE_SPECS);
    let output = crate::support::run_sesa_with(crate::support::ChildRegistry::Stages, &args, repo);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let generated = crate::support::stdout(&output);
    assert!(generated.contains("| `rollouts` | `solve` | `item` u64,"), "{generated}");

    let (begin, end) = ("<!-- tables: begin -->\n", "<!-- tables: end -->");
    let path = repo.join("README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let start = readme.find(begin).expect("README.md has a tables block") + begin.len();
    let stop = start + readme[start..].find(end).expect("the tables block ends");
    if std::env::var_os("SESA_UPDATE_SCHEMAS").is_some() {
        std::fs::write(&path, format!("{}{generated}\n{}", &readme[..start], &readme[stop..])).unwrap();
    } else {
        assert!(
            readme[start..stop].trim_end() == generated.trim_end(),
            "README.md's table list is stale: run `cargo run -- tables {}` into it (or set SESA_UPDATE_SCHEMAS=1)",
            TABLE_SPECS.join(" ")
        );
    }

    // Every shipped stage kind is in one of the specs, so no kind's tables are left out.
    let registry = sesa_stages::registry();
    let mut used = std::collections::BTreeSet::new();
    for spec in TABLE_SPECS {
        let pipeline = sesa_engine::load_pipeline(&repo.join(spec), &[], &registry).unwrap();
        used.extend(pipeline.spec().stages.iter().map(|s| s.kind.clone()));
    }
    let missing: Vec<String> = registry.stage_kinds().into_iter().filter(|k| !used.contains(k)).collect();
    assert!(missing.is_empty(), "stage kinds in none of {TABLE_SPECS:?}: {missing:?}");
}
