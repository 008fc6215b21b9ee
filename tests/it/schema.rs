//! The checked-in JSON Schemas match the code: specs (what `sesa schema` prints) and skill
//! files (the exchange format of `sesa skills export/import`).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::json;

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
    let variants =
        schema.pointer("/$defs/Spec/properties/stages/additionalProperties/anyOf/0/oneOf").unwrap().as_array().unwrap();
    let kinds: Vec<&str> =
        variants.iter().map(|v| v.pointer("/properties/kind/const").unwrap().as_str().unwrap()).collect();
    assert_eq!(kinds, ["fail", "numbers", "offsets", "square", "total"]);
    let numbers = &variants[1];
    assert_eq!(numbers.pointer("/properties/rows/type").unwrap(), "integer");
    assert_eq!(numbers.pointer("/additionalProperties").unwrap(), false);
    assert!(schema.pointer("/$defs/Spec/properties/limits").is_some());
    assert!(schema.pointer("/$defs/StageSchedule").is_some());
    // An `extends:` spec may leave out what its base says, `kind` included.
    let partial = schema.pointer("/$defs/SpecOverride/properties/stages/anyOf/0/additionalProperties/anyOf/0/anyOf/1");
    assert_eq!(partial.unwrap().pointer("/required"), None);
    assert_eq!(partial.unwrap().pointer("/additionalProperties/type").unwrap(), "null");
}

/// Every shipped spec (a file that names `spec.schema.json` on its first line) and every YAML
/// snippet of the README passes the checked-in schema under an independent validator (Python's
/// `jsonschema`, which `scripts/test` installs), as an editor would check it; snippets are checked
/// as `extends:` specs, since each shows a part of one. A spec with a misspelt key does not pass.
#[test]
fn shipped_specs_and_readme_snippets_pass_the_schema_in_an_independent_validator() {
    const TEST: &str = "shipped_specs_and_readme_snippets_pass_the_schema_in_an_independent_validator";
    if !Command::new("python3").args(["-c", "import jsonschema"]).status().is_ok_and(|s| s.success()) {
        sesa_engine::testing::skip(TEST, "no Python jsonschema package (python3 -m pip install jsonschema)");
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let yaml = |text: &str| serde_yaml::from_str::<serde_json::Value>(text).unwrap();
    let mut documents = Vec::new();
    for dir in ["specs", "examples"] {
        for path in yaml_files(&repo.join(dir)) {
            let text = std::fs::read_to_string(&path).unwrap();
            if text.lines().next().is_some_and(|line| line.contains("spec.schema.json")) {
                let name = path.strip_prefix(repo).unwrap().display().to_string();
                documents.push(json!({ "name": name, "spec": yaml(&text), "snippet": false }));
            }
        }
    }
    let specs = documents.len();
    assert!(specs >= 10, "found only {specs} shipped specs");
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    for (n, block) in readme.split("```yaml\n").skip(1).enumerate() {
        let block = &block[..block.find("```").expect("a YAML block ends")];
        documents
            .push(json!({ "name": format!("README.md YAML block {}", n + 1), "spec": yaml(block), "snippet": true }));
    }
    assert!(documents.len() > specs + 5, "the README's YAML blocks were not found");
    let misspelt = yaml("extends: sesa.yaml\nstages:\n  update:\n    optimiser: {lr: 1.0e-6}\n");
    documents.push(json!({ "name": "misspelt", "spec": misspelt, "snippet": true }));

    let schema = std::fs::read_to_string(repo.join("schemas/spec.schema.json")).unwrap();
    let check = "import json, sys, jsonschema\n\
        schema = json.load(open(sys.argv[1]))\n\
        jsonschema.Draft202012Validator.check_schema(schema)\n\
        snippet = dict(schema, **{'$ref': '#/$defs/SpecOverride'})\n\
        [snippet.pop(k) for k in ('if', 'then', 'else')]\n\
        for doc in json.load(sys.stdin):\n\
        \x20   validator = jsonschema.Draft202012Validator(snippet if doc['snippet'] else schema)\n\
        \x20   for error in validator.iter_errors(doc['spec']):\n\
        \x20       print(doc['name'], '/'.join(map(str, error.absolute_path)), error.message[:300])\n";
    let dir = tempfile::tempdir().unwrap();
    let schema_path = dir.path().join("spec.schema.json");
    std::fs::write(&schema_path, schema).unwrap();
    let mut child = Command::new("python3")
        .args(["-c", check, schema_path.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(serde_json::to_string(&documents).unwrap().as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let errors = String::from_utf8_lossy(&output.stdout);
    let (misspelt, others): (Vec<&str>, Vec<&str>) = errors.lines().partition(|line| line.starts_with("misspelt "));
    assert!(others.is_empty(), "specs or README snippets the schema rejects:\n{}", others.join("\n"));
    assert!(
        misspelt.iter().any(|line| line.contains("optimiser")),
        "the schema let a misspelt key through: {misspelt:?}"
    );
}

fn yaml_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(yaml_files(&path));
        } else if path.extension().is_some_and(|e| e == "yaml") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// The specs whose stages write every table a shipped stage kind writes.
const TABLE_SPECS: [&str; 3] = ["specs/sesa.yaml", "specs/warmup.yaml", "specs/learn.yaml"];

/// docs/analysis.md's list of tables is `sesa tables` over [`TABLE_SPECS`]: regenerate it with
/// `SESA_UPDATE_SCHEMAS=1`.
#[test]
fn the_analysis_guide_lists_every_table_with_its_columns() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut args = vec!["tables"];
    args.extend(TABLE_SPECS);
    let output = crate::support::run_sesa_with(crate::support::ChildRegistry::Stages, &args, repo);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let generated = crate::support::stdout(&output);
    assert!(generated.contains("| `rollouts` | `solve` | `item` u64,"), "{generated}");

    let (begin, end) = ("<!-- tables: begin -->\n", "<!-- tables: end -->");
    let path = repo.join("docs/analysis.md");
    let guide = std::fs::read_to_string(&path).unwrap();
    let start = guide.find(begin).expect("docs/analysis.md has a tables block") + begin.len();
    let stop = start + guide[start..].find(end).expect("the tables block ends");
    if std::env::var_os("SESA_UPDATE_SCHEMAS").is_some() {
        std::fs::write(&path, format!("{}{generated}\n{}", &guide[..start], &guide[stop..])).unwrap();
    } else {
        assert!(
            guide[start..stop].trim_end() == generated.trim_end(),
            "docs/analysis.md's table list is stale: run `cargo run -- tables {}` into it (or set SESA_UPDATE_SCHEMAS=1)",
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
