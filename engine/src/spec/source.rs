//! The untyped layer of a spec: YAML files, `extends:` chains, deep merge and `--set` overrides.
//!
//! Everything here works on `serde_yaml::Value` and remembers which file (or override) last set
//! each key, so that a type error found later can name the file and line a person must edit.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_yaml::{Mapping, Value};

use super::error::SpecError;

/// Where a key of the merged document came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A spec file.
    File(PathBuf),
    /// A `--set KEY=VALUE` override.
    Override(String),
}

/// A merged YAML document and, for each dotted key, where it was last set.
#[derive(Debug, Clone)]
pub struct SourceDoc {
    /// The merged document, `extends` removed and overrides applied.
    pub value: Value,
    origins: HashMap<String, Origin>,
    texts: HashMap<PathBuf, String>,
}

/// Where in a file a key is written, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The file, or `None` for an override.
    pub file: Option<PathBuf>,
    /// 1-based line, when it could be found.
    pub line: Option<usize>,
    /// The override argument, when the key came from `--set`.
    pub argument: Option<String>,
}

impl SourceDoc {
    /// Loads `path`, follows its `extends:` parents and merges them, parents first.
    ///
    /// `extends:` names one spec or a list of them. The files are merged depth first in the order
    /// listed, each file once: with `extends: [../ablation.yaml, cpu.yaml]` where both extend
    /// `../sesa.yaml`, the merge is `sesa`, `ablation`, `cpu`, then this file.
    pub fn load(path: &Path) -> Result<SourceDoc, SpecError> {
        let mut files = Linearized::default();
        files.visit(path, None, &mut Vec::new())?;
        let mut doc = SourceDoc { value: Value::Null, origins: HashMap::new(), texts: files.texts };
        for (file, value) in files.merge_order {
            let origin = Origin::File(file);
            merge(&mut doc.value, value, "", &origin, &mut doc.origins);
        }
        doc.origins.insert(String::new(), Origin::File(path.to_path_buf()));
        Ok(doc)
    }

    /// Reads a document from `text` (no `extends:` allowed), labelling its keys with `label`:
    /// how a run's saved spec is read back.
    pub fn from_text(text: &str, label: &str) -> Result<SourceDoc, SpecError> {
        let file = PathBuf::from(label);
        let value = parse_mapping(text, &file)?;
        if value.as_mapping().is_some_and(|m| m.contains_key("extends")) {
            return Err(SpecError::Type {
                location: Location { file: Some(file), line: locate_key(text, &["extends"]), argument: None },
                key: "extends".into(),
                message: "a resolved spec cannot extend another".into(),
            });
        }
        let mut doc = SourceDoc { value: Value::Null, origins: HashMap::new(), texts: HashMap::new() };
        doc.texts.insert(file.clone(), text.to_string());
        merge(&mut doc.value, value, "", &Origin::File(file.clone()), &mut doc.origins);
        doc.origins.insert(String::new(), Origin::File(file));
        Ok(doc)
    }

    /// Applies `--set a.b.c=VALUE` overrides in order. The value is read as YAML, so
    /// `steps=3` is a number and `stages.x=null` removes a stage.
    pub fn apply_overrides(&mut self, overrides: &[String]) -> Result<(), SpecError> {
        for argument in overrides {
            let Some((key, raw)) = argument.split_once('=') else {
                return Err(SpecError::BadOverride {
                    argument: argument.clone(),
                    reason: "expected KEY=VALUE, for example `steps=3`".into(),
                });
            };
            let key = key.trim();
            if key.is_empty() || key.split('.').any(str::is_empty) {
                return Err(SpecError::BadOverride {
                    argument: argument.clone(),
                    reason: "the key must be a dotted path such as `stages.reward.lambda`".into(),
                });
            }
            let value: Value = serde_yaml::from_str(raw).map_err(|error| SpecError::BadOverride {
                argument: argument.clone(),
                reason: format!("the value is not valid YAML: {}", strip_location(&error.to_string())),
            })?;
            let segments: Vec<&str> = key.split('.').collect();
            let origin = Origin::Override(argument.clone());
            let (last, parents) = segments.split_last().expect("checked non-empty");
            let mut node = &mut self.value;
            let mut prefix = String::new();
            for segment in parents {
                prefix = join_key(&prefix, segment);
                if !node.is_mapping() {
                    *node = Value::Mapping(Mapping::new());
                }
                let map = node.as_mapping_mut().expect("made a mapping above");
                let entry = map.entry(Value::String((*segment).to_string())).or_insert(Value::Null);
                if !entry.is_mapping() {
                    *entry = Value::Mapping(Mapping::new());
                    self.origins.insert(prefix.clone(), origin.clone());
                }
                node = entry;
            }
            if !node.is_mapping() {
                *node = Value::Mapping(Mapping::new());
            }
            let map = node.as_mapping_mut().expect("made a mapping above");
            let mut single = Mapping::new();
            single.insert(Value::String((*last).to_string()), value);
            let mut target = Value::Mapping(std::mem::take(map));
            merge(&mut target, Value::Mapping(single), &prefix, &origin, &mut self.origins);
            *node = target;
        }
        Ok(())
    }

    /// Where the value at `key` (dotted) was set: the longest prefix of `key` with a known origin.
    pub fn locate(&self, key: &str) -> Location {
        let mut probe = key.to_string();
        loop {
            if let Some(origin) = self.origins.get(&probe) {
                return match origin {
                    Origin::File(file) => {
                        let segments: Vec<&str> = key.split('.').filter(|s| !s.is_empty()).collect();
                        let line = self.texts.get(file).and_then(|text| locate_key(text, &segments));
                        Location { file: Some(file.clone()), line, argument: None }
                    }
                    Origin::Override(argument) => Location { file: None, line: None, argument: Some(argument.clone()) },
                };
            }
            match probe.rfind('.') {
                Some(dot) => probe.truncate(dot),
                None if !probe.is_empty() => probe.clear(),
                None => {
                    return Location { file: None, line: None, argument: None };
                }
            }
        }
    }

    /// The first file of the chain (the one the user named), for problems without a key.
    pub fn root_file(&self) -> Option<&Path> {
        self.origins.get("").and_then(|origin| match origin {
            Origin::File(file) => Some(file.as_path()),
            Origin::Override(_) => None,
        })
    }
}

/// The files of an `extends:` graph in the order they are merged.
#[derive(Default)]
struct Linearized {
    merge_order: Vec<(PathBuf, Value)>,
    texts: HashMap<PathBuf, String>,
    merged: Vec<PathBuf>,
}

/// Who named a file in `extends:`: (spec, line, value as written), to say where a missing parent
/// was named.
type NamedBy = (PathBuf, usize, String);

impl Linearized {
    /// Adds `file` after its parents, unless it is already in. `stack` holds the files being
    /// visited (canonical, as named), to report a cycle.
    fn visit(
        &mut self,
        file: &Path,
        named_by: Option<NamedBy>,
        stack: &mut Vec<(PathBuf, PathBuf)>,
    ) -> Result<(), SpecError> {
        let canonical = std::fs::canonicalize(file).map_err(|source| match named_by {
            Some((from, line, target)) => SpecError::ExtendsMissing {
                from,
                line,
                target,
                looked_for: file.to_path_buf(),
                message: if source.kind() == std::io::ErrorKind::NotFound {
                    "does not exist (the path is relative to the extending spec's directory)".into()
                } else {
                    format!("cannot be read: {source}")
                },
            },
            None => SpecError::Io { file: file.to_path_buf(), message: source.to_string() },
        })?;
        if stack.iter().any(|(seen, _)| seen == &canonical) {
            let mut files: Vec<PathBuf> = stack.iter().map(|(_, named)| named.clone()).collect();
            files.push(file.to_path_buf());
            return Err(SpecError::ExtendsCycle { files });
        }
        if self.merged.contains(&canonical) {
            return Ok(());
        }
        let text = std::fs::read_to_string(file)
            .map_err(|source| SpecError::Io { file: file.to_path_buf(), message: source.to_string() })?;
        let mut value = parse_mapping(&text, file)?;
        let map = value.as_mapping_mut().expect("parse_mapping returns a mapping");
        let line = locate_key(&text, &["extends"]);
        let parents = match map.remove("extends") {
            None => Vec::new(),
            Some(Value::String(parent)) => vec![parent],
            Some(Value::Sequence(parents)) if parents.iter().all(Value::is_string) => {
                parents.into_iter().filter_map(|p| p.as_str().map(str::to_string)).collect()
            }
            Some(_) => {
                return Err(SpecError::Type {
                    location: Location { file: Some(file.to_path_buf()), line, argument: None },
                    key: "extends".into(),
                    message: "expected the path of another spec, or a list of them, relative to this file".into(),
                });
            }
        };
        stack.push((canonical.clone(), file.to_path_buf()));
        let base = file.parent().unwrap_or(Path::new(""));
        for parent in parents {
            let named_by = (file.to_path_buf(), line.unwrap_or(1), parent.clone());
            self.visit(&base.join(&parent), Some(named_by), stack)?;
        }
        stack.pop();
        self.merged.push(canonical);
        self.texts.insert(file.to_path_buf(), text);
        self.merge_order.push((file.to_path_buf(), value));
        Ok(())
    }
}

/// Parses YAML text that must be a mapping (an empty file counts as an empty mapping).
fn parse_mapping(text: &str, file: &Path) -> Result<Value, SpecError> {
    let value: Value = serde_yaml::from_str(text).map_err(|error| SpecError::Yaml {
        file: file.to_path_buf(),
        line: error.location().map(|l| l.line()),
        column: error.location().map(|l| l.column()),
        message: strip_location(&error.to_string()),
    })?;
    match value {
        Value::Null => Ok(Value::Mapping(Mapping::new())),
        Value::Mapping(_) => Ok(value),
        _ => Err(SpecError::Type {
            location: Location { file: Some(file.to_path_buf()), line: Some(1), argument: None },
            key: String::new(),
            message: "a spec must be a YAML mapping of keys to values".into(),
        }),
    }
}

fn join_key(prefix: &str, segment: &str) -> String {
    if prefix.is_empty() { segment.to_string() } else { format!("{prefix}.{segment}") }
}

fn key_text(key: &Value) -> String {
    match key {
        Value::String(s) => s.clone(),
        other => serde_yaml::to_string(other).unwrap_or_default().trim().to_string(),
    }
}

/// Deep merge: mappings merge key by key, a `null` removes the key, anything else replaces. A
/// mapping that names another `kind:` than the one it lands on replaces it too: a section of
/// another kind shares none of its settings (`trainer.method={kind: full}` over
/// `{kind: lora, rank: 16}` must not keep `rank`).
fn merge(base: &mut Value, overlay: Value, prefix: &str, origin: &Origin, origins: &mut HashMap<String, Origin>) {
    match (base, overlay) {
        (Value::Mapping(base_map), Value::Mapping(overlay_map)) => {
            for (key, value) in overlay_map {
                let dotted = join_key(prefix, &key_text(&key));
                if value.is_null() {
                    base_map.remove(&key);
                    origins.retain(|k, _| k != &dotted && !k.starts_with(&format!("{dotted}.")));
                    continue;
                }
                match base_map.get_mut(&key) {
                    Some(existing)
                        if existing.is_mapping() && value.is_mapping() && !changes_kind(existing, &value) =>
                    {
                        merge(existing, value, &dotted, origin, origins);
                    }
                    _ => {
                        let mut value = value;
                        remove_nulls(&mut value);
                        origins.retain(|k, _| !k.starts_with(&format!("{dotted}.")));
                        record_origins(&value, &dotted, origin, origins);
                        base_map.insert(key, value);
                    }
                }
            }
        }
        (base, overlay) => {
            record_origins(&overlay, prefix, origin, origins);
            *base = overlay;
        }
    }
}

/// A `null` removes its key even where nothing is left to remove from (a section replaced
/// whole, or new): the key is then absent, not null.
fn remove_nulls(value: &mut Value) {
    if let Value::Mapping(map) = value {
        map.retain(|_, v| !v.is_null());
        map.values_mut().for_each(remove_nulls);
    }
}

/// Whether both mappings name a `kind:` and the two differ.
fn changes_kind(base: &Value, overlay: &Value) -> bool {
    matches!((base.get("kind"), overlay.get("kind")), (Some(a), Some(b)) if a != b)
}

fn record_origins(value: &Value, prefix: &str, origin: &Origin, origins: &mut HashMap<String, Origin>) {
    origins.insert(prefix.to_string(), origin.clone());
    if let Value::Mapping(map) = value {
        for (key, child) in map {
            record_origins(child, &join_key(prefix, &key_text(key)), origin, origins);
        }
    }
}

/// serde_yaml appends " at line L column C" to messages that carry a location; we print the
/// location ourselves.
fn strip_location(message: &str) -> String {
    match message.find(" at line ") {
        Some(at) => message[..at].to_string(),
        None => message.to_string(),
    }
}

/// Finds the 1-based line of a dotted key in block-style YAML text by following indentation.
/// Returns the deepest key it could find, so an error inside a flow mapping still points near it.
pub(crate) fn locate_key(text: &str, segments: &[&str]) -> Option<usize> {
    let mut found = None;
    let mut min_indent: isize = -1;
    let mut start = 0;
    let lines: Vec<&str> = text.lines().collect();
    'segments: for segment in segments {
        for (index, line) in lines.iter().enumerate().skip(start) {
            let trimmed = line.trim_start();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let indent = (line.len() - trimmed.len()) as isize;
            if indent <= min_indent && found.is_some() {
                break 'segments;
            }
            let key = trimmed.trim_start_matches("- ");
            let matches = key
                .strip_prefix(segment)
                .or_else(|| key.strip_prefix(&format!("\"{segment}\"")))
                .is_some_and(|rest| rest.trim_start().starts_with(':'));
            if matches {
                found = Some(index + 1);
                min_indent = indent;
                start = index + 1;
                continue 'segments;
            }
        }
        break;
    }
    found
}

#[cfg(test)]
#[path = "source_tests.rs"]
mod tests;
