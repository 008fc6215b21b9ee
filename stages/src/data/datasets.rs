//! Question sets: FlashRAG JSONL (`id`, `question`, `golden_answers`, plus `hops` and
//! `supporting_titles` in generated worlds) and the verl / Search-R1 Parquet eval format.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The benchmarks of the paper, and generated worlds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Benchmark {
    /// Natural Questions.
    Nq,
    /// TriviaQA.
    Triviaqa,
    /// PopQA.
    Popqa,
    /// HotpotQA.
    Hotpotqa,
    /// 2WikiMultiHopQA.
    #[serde(rename = "2wikimultihopqa")]
    TwoWikiMultihopqa,
    /// MuSiQue.
    Musique,
    /// Bamboogle.
    Bamboogle,
    /// A world made by `sesa world generate`.
    World,
}

/// A question set as a spec names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DatasetConfig {
    /// Which benchmark this is (for reports).
    pub benchmark: Benchmark,
    /// FlashRAG JSONL, or verl Parquet (`.parquet`).
    pub path: PathBuf,
    /// Use only the first `limit` questions.
    #[serde(default)]
    pub limit: Option<usize>,
}

/// One question with its gold answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Question {
    /// The id in its dataset.
    pub id: String,
    /// The question.
    pub question: String,
    /// Every accepted answer.
    pub golden_answers: Vec<String>,
    /// Searches needed, when the dataset says (generated worlds do).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hops: Option<u8>,
    /// Titles of the passages that support the answer, when known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supporting_titles: Vec<String>,
    /// The relation each supporting passage is read for ("birthplace"), when known
    /// (generated worlds say): one per supporting title.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supporting_relations: Vec<String>,
}

/// A question set that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("{}{}: {message}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct DatasetError {
    /// The file.
    pub path: PathBuf,
    /// The 1-based line (JSONL) or row (Parquet), when one is at fault.
    pub line: Option<u64>,
    /// What is wrong.
    pub message: String,
}

#[derive(Deserialize)]
struct RawQuestion {
    id: Option<serde_json::Value>,
    question: String,
    golden_answers: serde_json::Value,
    #[serde(default)]
    hops: Option<u8>,
    #[serde(default)]
    supporting_titles: Vec<String>,
    #[serde(default)]
    supporting_relations: Vec<String>,
}

fn answers(value: serde_json::Value) -> Result<Vec<String>, String> {
    match value {
        serde_json::Value::String(answer) => Ok(vec![answer]),
        serde_json::Value::Array(items) => items
            .into_iter()
            .map(|item| match item {
                serde_json::Value::String(answer) => Ok(answer),
                serde_json::Value::Number(n) => Ok(n.to_string()),
                other => Err(format!("a gold answer must be a string, found {other}")),
            })
            .collect(),
        other => Err(format!("`golden_answers` must be a list of strings, found {other}")),
    }
}

impl DatasetConfig {
    /// Loads the questions, honouring `limit`.
    pub fn load(&self) -> Result<Vec<Question>, DatasetError> {
        let mut questions = load_questions(&self.path)?;
        if let Some(limit) = self.limit {
            questions.truncate(limit);
        }
        Ok(questions)
    }
}

/// Loads a question set: FlashRAG JSONL, or verl Parquet when the name ends in `.parquet`.
pub fn load_questions(path: &Path) -> Result<Vec<Question>, DatasetError> {
    let error = |line: Option<u64>, message: String| DatasetError { path: path.to_path_buf(), line, message };
    if path.extension().is_some_and(|e| e == "parquet") {
        return load_verl_parquet(path);
    }
    let file = std::fs::File::open(path).map_err(|e| error(None, format!("cannot open: {e}")))?;
    let mut questions = Vec::new();
    for (index, line) in std::io::BufReader::new(file).lines().enumerate() {
        let number = Some(index as u64 + 1);
        let line = line.map_err(|e| error(number, e.to_string()))?;
        if line.trim().is_empty() {
            continue;
        }
        let raw: RawQuestion = serde_json::from_str(&line).map_err(|e| {
            error(number, format!("expected a FlashRAG question {{id, question, golden_answers}}: {e}"))
        })?;
        let golden_answers = answers(raw.golden_answers).map_err(|e| error(number, e))?;
        if !raw.supporting_relations.is_empty() && raw.supporting_relations.len() != raw.supporting_titles.len() {
            return Err(error(
                number,
                format!(
                    "`supporting_relations` names {} relations for {} `supporting_titles`: give one per title, or none",
                    raw.supporting_relations.len(),
                    raw.supporting_titles.len()
                ),
            ));
        }
        let id = match raw.id {
            Some(serde_json::Value::String(id)) => id,
            Some(other) => other.to_string(),
            None => format!("{}", index),
        };
        questions.push(Question {
            id,
            question: raw.question,
            golden_answers,
            hops: raw.hops,
            supporting_titles: raw.supporting_titles,
            supporting_relations: raw.supporting_relations,
        });
    }
    Ok(questions)
}

/// Imports the verl / Search-R1 Parquet format: gold answers in
/// `reward_model.ground_truth.target`; the question from a `question` column or, failing that,
/// from the last user message of `prompt` after its last `Question:`.
pub fn load_verl_parquet(path: &Path) -> Result<Vec<Question>, DatasetError> {
    let error = |line: Option<u64>, message: String| DatasetError { path: path.to_path_buf(), line, message };
    let bytes = std::fs::read(path).map_err(|e| error(None, format!("cannot open: {e}")))?;
    let batch =
        sesa_engine::table::decode_parquet(bytes.into()).map_err(|e| error(None, format!("not Parquet: {e}")))?;
    (0..batch.num_rows()).map(|row| verl_row(&batch, row).map_err(|m| error(Some(row as u64 + 1), m))).collect()
}

fn string_at(array: &dyn Array, row: usize) -> Option<String> {
    if array.is_null(row) {
        return None;
    }
    array
        .as_string_opt::<i32>()
        .map(|a| a.value(row).to_string())
        .or_else(|| array.as_string_opt::<i64>().map(|a| a.value(row).to_string()))
        .or_else(|| array.as_string_view_opt().map(|a| a.value(row).to_string()))
}

fn verl_row(batch: &RecordBatch, row: usize) -> Result<Question, String> {
    let reward = batch.column_by_name("reward_model").ok_or("no `reward_model` column: not the verl format")?;
    let truth = reward
        .as_struct_opt()
        .and_then(|s| s.column_by_name("ground_truth"))
        .ok_or("no `reward_model.ground_truth`")?;
    let target = truth
        .as_struct_opt()
        .and_then(|s| s.column_by_name("target"))
        .ok_or("no `reward_model.ground_truth.target`")?;
    let golden_answers = if let Some(list) = target.as_list_opt::<i32>() {
        let values = list.value(row);
        (0..values.len()).filter_map(|i| string_at(&values, i)).collect()
    } else {
        string_at(target, row).into_iter().collect()
    };
    let question = match batch.column_by_name("question").and_then(|c| string_at(c, row)) {
        Some(question) => question,
        None => {
            let prompt = batch.column_by_name("prompt").ok_or("no `question` or `prompt` column")?;
            let messages = prompt.as_list_opt::<i32>().ok_or("`prompt` is not a list of messages")?.value(row);
            let messages = messages.as_struct_opt().ok_or("`prompt` messages are not {role, content}")?;
            let content = messages.column_by_name("content").ok_or("`prompt` messages have no `content`")?;
            let text = (0..messages.len()).rev().find_map(|i| string_at(content, i)).ok_or("empty `prompt`")?;
            let question = text.rsplit_once("Question:").map(|(_, q)| q).unwrap_or(&text);
            question.trim().to_string()
        }
    };
    let id = batch.column_by_name("id").and_then(|c| string_at(c, row)).unwrap_or_else(|| row.to_string());
    Ok(Question {
        id,
        question,
        golden_answers,
        hops: None,
        supporting_titles: Vec::new(),
        supporting_relations: Vec::new(),
    })
}

#[cfg(test)]
mod tests;
