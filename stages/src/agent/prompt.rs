//! Prompt templates: YAML files under `specs/prompts/` with named `{placeholders}`, checked when
//! a spec is validated and rendered into chat messages when an episode starts.
//!
//! ```yaml
//! system: You answer questions by searching...
//! examples:            # optional worked turns, rendered before the real one
//!   - user: "Question: Who founded Quarn Industries?"
//!     assistant: "<search>Quarn Industries founder</search>"
//! user: "Question: {question}\n{skills}"
//! ```
//! `{{` and `}}` write literal braces.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use sesa_models::policy::ChatMessage;

/// What a kind of prompt may and must contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptKind {
    /// For messages.
    pub name: &'static str,
    /// Placeholders the template may use.
    pub allowed: &'static [&'static str],
    /// Placeholders the user message must contain.
    pub required: &'static [&'static str],
}

/// The solver's prompt: the question, and the retrieved skills block (empty without memory).
pub const SOLVER_PROMPT: PromptKind =
    PromptKind { name: "solver", allowed: &["question", "skills"], required: &["question"] };
/// The proposer's prompt: the target answer and the hop count.
pub const PROPOSER_PROMPT: PromptKind =
    PromptKind { name: "proposer", allowed: &["answer", "hops"], required: &["answer", "hops"] };
/// The verifier's prompt: the proposer's materials and the question.
pub const VERIFIER_PROMPT: PromptKind =
    PromptKind { name: "verifier", allowed: &["materials", "question"], required: &["materials", "question"] };
/// The judge's prompt: the question, the reference and the model's answer.
pub const JUDGE_PROMPT: PromptKind = PromptKind {
    name: "judge",
    allowed: &["question", "golden", "answer"],
    required: &["question", "golden", "answer"],
};

/// The distillation judge's prompt: a batch of solver failures and how many skills to write.
pub const DISTILL_PROMPT: PromptKind =
    PromptKind { name: "distill", allowed: &["failures", "max_skills"], required: &["failures"] };

/// A problem with a template file.
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct PromptError {
    /// The template file.
    pub path: PathBuf,
    /// What is wrong.
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTemplate {
    #[serde(default)]
    system: Option<String>,
    #[serde(default)]
    examples: Vec<RawExample>,
    user: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExample {
    user: String,
    assistant: String,
}

/// A loaded, checked template.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptTemplate {
    path: PathBuf,
    raw: RawTemplate,
}

/// The placeholders of `text`, in order.
fn placeholders(text: &str) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            '{' if chars.peek().map(|(_, n)| *n) == Some('{') => {
                chars.next();
            }
            '}' if chars.peek().map(|(_, n)| *n) == Some('}') => {
                chars.next();
            }
            '{' => {
                let rest = &text[at + 1..];
                let end = rest
                    .find('}')
                    .ok_or_else(|| format!("unclosed `{{` at byte {at}; write `{{{{` for a literal brace"))?;
                let name = &rest[..end];
                if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return Err(format!("`{{{name}}}` is not a placeholder name (letters, digits, `_`)"));
                }
                names.push(name.to_string());
                for _ in 0..=name.len() {
                    chars.next();
                }
            }
            '}' => return Err(format!("stray `}}` at byte {at}; write `}}}}` for a literal brace")),
            _ => {}
        }
    }
    Ok(names)
}

fn fill(text: &str, values: &BTreeMap<&str, String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(['{', '}']) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if tail.starts_with("{{") || tail.starts_with("}}") {
            out.push_str(&tail[..1]);
            rest = &tail[2..];
        } else if let Some(end) = tail.find('}').filter(|_| tail.starts_with('{')) {
            out.push_str(values.get(&tail[1..end]).map(String::as_str).unwrap_or_default());
            rest = &tail[end + 1..];
        } else {
            out.push_str(&tail[..1]);
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

impl PromptTemplate {
    /// Loads a template of `kind`.
    pub fn load_kind(path: &Path, kind: PromptKind) -> Result<PromptTemplate, PromptError> {
        Self::load(path, kind.allowed, kind.required)
    }

    /// Loads `path` and checks that its placeholders are all in `allowed` and that every name
    /// in `required` appears in the user message.
    pub fn load(path: &Path, allowed: &[&str], required: &[&str]) -> Result<PromptTemplate, PromptError> {
        let error = |message: String| PromptError { path: path.to_path_buf(), message };
        let text = std::fs::read_to_string(path).map_err(|e| error(format!("cannot read: {e}")))?;
        let raw: RawTemplate = serde_yaml::from_str(&text).map_err(|e| error(format!("not a prompt template: {e}")))?;
        let mut texts: Vec<(&str, &str)> = vec![("user", &raw.user)];
        if let Some(system) = &raw.system {
            texts.push(("system", system));
        }
        for example in &raw.examples {
            texts.push(("examples.user", &example.user));
            texts.push(("examples.assistant", &example.assistant));
        }
        for (key, text) in &texts {
            for name in placeholders(text).map_err(|e| error(format!("`{key}`: {e}")))? {
                if !allowed.contains(&name.as_str()) {
                    return Err(error(format!(
                        "`{key}` uses `{{{name}}}`; this template may use: {}",
                        braces(allowed)
                    )));
                }
            }
        }
        let user = placeholders(&raw.user).map_err(error)?;
        for name in required {
            if !user.iter().any(|n| n == name) {
                return Err(error(format!("`user` must contain `{{{name}}}`")));
            }
        }
        Ok(PromptTemplate { path: path.to_path_buf(), raw })
    }

    /// The file it came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The chat messages for `values` (a missing value renders as empty text).
    pub fn render(&self, values: &BTreeMap<&str, String>) -> Vec<ChatMessage> {
        let mut messages = Vec::new();
        if let Some(system) = &self.raw.system {
            messages.push(ChatMessage::new("system", fill(system, values)));
        }
        for example in &self.raw.examples {
            messages.push(ChatMessage::new("user", fill(&example.user, values)));
            messages.push(ChatMessage::new("assistant", fill(&example.assistant, values)));
        }
        messages.push(ChatMessage::new("user", fill(&self.raw.user, values)));
        messages
    }
}

fn braces(names: &[&str]) -> String {
    names.iter().map(|n| format!("{{{n}}}")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str, allowed: &[&str], required: &[&str]) -> Result<PromptTemplate, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.yaml");
        std::fs::write(&path, text).unwrap();
        PromptTemplate::load(&path, allowed, required).map_err(|e| e.message)
    }

    #[test]
    fn renders_with_examples_and_literal_braces() {
        let template = load(
            "system: 'Answer in {{braces}}.'\nexamples:\n  - {user: 'Q: A?', assistant: '<answer>a</answer>'}\nuser: 'Q: {question}\n{skills}'\n",
            &["question", "skills"],
            &["question"],
        )
        .unwrap();
        let values = BTreeMap::from([("question", "Who?".to_string())]);
        let messages = template.render(&values);
        let rendered: Vec<String> = messages.iter().map(|m| format!("{}: {}", m.role, m.content)).collect();
        insta::assert_snapshot!(rendered.join("\n---\n"), @"
        system: Answer in {braces}.
        ---
        user: Q: A?
        ---
        assistant: <answer>a</answer>
        ---
        user: Q: Who?
        ");
    }

    #[test]
    fn every_shipped_prompt_loads_as_its_kind() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../specs/prompts");
        let mut loaded = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_str().unwrap().to_string();
            let kind = [SOLVER_PROMPT, PROPOSER_PROMPT, VERIFIER_PROMPT, JUDGE_PROMPT, DISTILL_PROMPT]
                .into_iter()
                .find(|k| name.starts_with(k.name))
                .unwrap_or_else(|| panic!("{name}: prompt files are named after their kind"));
            PromptTemplate::load_kind(&path, kind).unwrap();
            loaded.push(name);
        }
        loaded.sort();
        assert_eq!(loaded, ["distill", "judge", "proposer", "proposer_small", "solver", "solver_small", "verifier"]);
    }

    #[test]
    fn placeholder_problems_are_named() {
        let errors = [
            load("user: '{question} {answer}'", &["question"], &[]),
            load("user: 'no question here'", &["question"], &["question"]),
            load("user: 'broken {question'", &["question"], &[]),
            load("user: 'odd } brace'", &[], &[]),
            load("usr: typo", &[], &[]),
        ];
        let messages: Vec<String> = errors.into_iter().map(|r| r.unwrap_err()).collect();
        insta::assert_snapshot!(messages.join("\n"), @"
        `user` uses `{answer}`; this template may use: {question}
        `user` must contain `{question}`
        `user`: unclosed `{` at byte 7; write `{{` for a literal brace
        `user`: stray `}` at byte 4; write `}}` for a literal brace
        not a prompt template: unknown field `usr`, expected one of `system`, `examples`, `user`
        ");
    }
}
