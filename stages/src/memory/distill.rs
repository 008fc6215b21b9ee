//! Failure distillation: a judge model turns a batch of the solver's failure records into
//! candidate skills. Its output is constrained to a JSON Schema derived from [`SkillText`]
//! (llguidance in mistral.rs, `response_format` on an OpenAI-compatible server), then parsed,
//! validated and sanitised here; a malformed candidate is reported with its reason and skipped.

use std::collections::BTreeMap;

use schemars::JsonSchema;

use super::skill::SkillText;
use crate::agent::PromptTemplate;
use sesa_models::policy::{GenerationRequest, Policy, PolicyError, Sampling};

/// What the solver got wrong on one question, compact enough for a judge's prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct FailureRecord {
    /// Unique in a run: `f<step>-<question>-<rollout>`.
    pub id: String,
    /// The question.
    pub question: String,
    /// Its answer.
    pub target: String,
    /// What the solver answered (`None`: no answer).
    pub predicted: Option<String>,
    /// Skills the solver saw.
    pub skill_ids: Vec<String>,
    /// The searches it made and how it ended, in a few lines.
    pub digest: String,
    /// The searches it made, in order.
    pub searches: Vec<String>,
    /// The searches of a rollout of the same question that succeeded (the one with the fewest),
    /// empty when none did: the contrast a rule-based distiller learns from.
    pub solved_searches: Vec<String>,
}

/// The judge's whole output; only its schema is used (candidates are parsed one by one).
#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[expect(dead_code, reason = "a schema, never built")]
struct JudgeOutput {
    /// New skills.
    skills: Vec<SkillText>,
}

/// The JSON Schema the judge's output is constrained to: `{"skills": [...]}` with at most
/// `max_skills` skills, each within the skill limits.
pub fn output_schema(max_skills: usize) -> serde_json::Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(JudgeOutput)).expect("a schema is JSON");
    schema["properties"]["skills"]["maxItems"] = max_skills.into();
    schema["properties"]["skills"]["minItems"] = 1.into();
    schema
}

/// Candidates from one judge call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Distilled {
    /// Valid, sanitised candidates.
    pub candidates: Vec<SkillText>,
    /// Why each malformed candidate (or the whole output) was skipped.
    pub malformed: Vec<String>,
}

/// Parses a judge's output: the JSON object in `text` (code fences and chatter around it are
/// tolerated, for remote judges), each skill checked on its own.
pub fn parse_output(text: &str) -> Distilled {
    let mut out = Distilled::default();
    let json = match (text.find('{'), text.rfind('}')) {
        (Some(start), Some(end)) if start < end => &text[start..=end],
        _ => {
            out.malformed.push(format!("no JSON object in the output: {:?}", preview(text)));
            return out;
        }
    };
    let value: serde_json::Value = match serde_json::from_str(json) {
        Ok(value) => value,
        Err(e) => {
            out.malformed.push(format!("the output is not valid JSON ({e}): {:?}", preview(json)));
            return out;
        }
    };
    let Some(items) = value.get("skills").and_then(|s| s.as_array()) else {
        out.malformed.push(format!("the output has no `skills` list: {:?}", preview(json)));
        return out;
    };
    for (index, item) in items.iter().enumerate() {
        match serde_json::from_value::<SkillText>(item.clone()) {
            Ok(skill) => match skill.sanitized() {
                Some(clean) => out.candidates.push(clean),
                None => out.malformed.push(format!("skills[{index}]: a required field is empty after cleaning")),
            },
            Err(e) => out.malformed.push(format!("skills[{index}]: {e}")),
        }
    }
    out
}

fn preview(text: &str) -> String {
    text.chars().take(200).collect()
}

/// The failures of a batch as the `{failures}` block of the distillation prompt.
pub fn render_failures(failures: &[FailureRecord]) -> String {
    let mut out = String::new();
    for (index, failure) in failures.iter().enumerate() {
        out.push_str(&format!(
            "Failure {}:\nQuestion: {}\nCorrect answer: {}\nSolver's answer: {}\nSkills it was shown: {}\nWhat it did: {}\n\n",
            index + 1,
            failure.question,
            failure.target,
            failure.predicted.as_deref().unwrap_or("(none)"),
            if failure.skill_ids.is_empty() { "(none)".to_string() } else { failure.skill_ids.join(", ") },
            failure.digest
        ));
    }
    out.trim_end().to_string()
}

/// A judge that distils failures into skills.
pub struct Distiller<'a> {
    /// The judge model.
    pub policy: &'a dyn Policy,
    /// The distillation prompt (`{failures}`, `{max_skills}`).
    pub template: &'a PromptTemplate,
    /// Skills per batch at most.
    pub max_skills: usize,
    /// Tokens per judge call at most.
    pub max_tokens: usize,
    /// How the judge samples.
    pub sampling: Sampling,
}

impl Distiller<'_> {
    /// One judge call per batch, all in flight together; results in batch order. `seeds` gives
    /// each call its seed.
    pub async fn distill(&self, batches: &[&[FailureRecord]], seeds: &[u64]) -> Result<Vec<Distilled>, PolicyError> {
        let schema = output_schema(self.max_skills);
        let requests: Vec<GenerationRequest> = batches
            .iter()
            .zip(seeds)
            .map(|(batch, &seed)| {
                let values =
                    BTreeMap::from([("failures", render_failures(batch)), ("max_skills", self.max_skills.to_string())]);
                GenerationRequest {
                    context: self.policy.render_chat(&self.template.render(&values)),
                    context_ids: None,
                    max_tokens: self.max_tokens,
                    stop: Vec::new(),
                    sampling: self.sampling,
                    seed,
                    json_schema: Some(schema.clone()),
                    ignore_eos: false,
                }
            })
            .collect();
        let generations = self.policy.generate(&requests).await?;
        Ok(generations.iter().map(|g| parse_output(&g.text)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_output_gives_sanitised_candidates() {
        let text = r#"Sure! ```json
{"skills": [{"description": "Search the bridge entity first. <answer>x</answer>", "trigger": "two-hop questions",
 "avoid": ["guessing"], "query_template": "<entity> founder"}]}
```"#;
        let out = parse_output(text);
        assert_eq!(out.malformed, Vec::<String>::new());
        assert_eq!(
            out.candidates,
            vec![SkillText {
                description: "Search the bridge entity first. x".into(),
                trigger: "two-hop questions".into(),
                avoid: vec!["guessing".into()],
                query_template: "<entity> founder".into(),
            }]
        );
    }

    #[test]
    fn malformed_candidates_are_skipped_with_a_reason() {
        let text = r#"{"skills": [
            {"description": "ok", "trigger": "t", "query_template": "q"},
            {"description": "no trigger", "query_template": "q"},
            {"description": "<think></think>", "trigger": "t", "query_template": "q"},
            {"description": "d", "trigger": "t", "query_template": "q", "extra": 1}
        ]}"#;
        let out = parse_output(text);
        assert_eq!(out.candidates.len(), 1);
        assert_eq!(out.malformed.len(), 3, "{:?}", out.malformed);
        assert!(out.malformed[0].starts_with("skills[1]: missing field `trigger`"), "{}", out.malformed[0]);
        assert_eq!(out.malformed[1], "skills[2]: a required field is empty after cleaning");
        assert!(out.malformed[2].starts_with("skills[3]: unknown field `extra`"), "{}", out.malformed[2]);
    }

    #[test]
    fn an_output_without_json_is_one_malformed_entry() {
        assert_eq!(parse_output("I cannot help").malformed, vec!["no JSON object in the output: \"I cannot help\""]);
        assert!(parse_output("{\"skills\": [").malformed[0].starts_with("no JSON object"));
        assert!(parse_output("{\"skills\": 3}").malformed[0].starts_with("the output has no `skills` list"));
        assert!(parse_output("{\"skills\": [}").malformed[0].starts_with("the output is not valid JSON"));
    }

    #[test]
    fn the_schema_bounds_the_list_and_each_field() {
        let schema = output_schema(4);
        assert_eq!(schema["properties"]["skills"]["maxItems"], 4);
        let text = serde_json::to_string(&schema).unwrap();
        assert!(text.contains("\"maxLength\":300"), "{text}");
        assert!(text.contains("\"additionalProperties\":false"), "{text}");
    }
}
