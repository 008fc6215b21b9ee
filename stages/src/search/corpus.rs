//! Streaming reader of Search-R1 JSONL corpora: `{"id", "contents": "\"Title\"\ntext"}` or
//! `{"id", "title", "text"}`, one passage per line. Never holds the corpus in memory.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::Doc;

/// A corpus line that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("{}:{line}: {message}", path.display())]
pub struct CorpusError {
    /// The corpus file.
    pub path: PathBuf,
    /// 1-based line number (0 when the file could not be opened).
    pub line: u64,
    /// What is wrong and what is expected.
    pub message: String,
}

#[derive(Deserialize)]
struct RawPassage {
    id: serde_json::Value,
    contents: Option<String>,
    title: Option<String>,
    text: Option<String>,
}

/// An iterator of passages with their byte offsets, for progress.
pub struct CorpusReader {
    path: PathBuf,
    lines: std::io::BufReader<std::fs::File>,
    line: u64,
    bytes_read: u64,
    buffer: String,
}

impl CorpusReader {
    /// Opens a JSONL corpus.
    pub fn open(path: &Path) -> Result<CorpusReader, CorpusError> {
        let file = std::fs::File::open(path).map_err(|e| CorpusError {
            path: path.to_path_buf(),
            line: 0,
            message: format!("cannot open: {e}"),
        })?;
        Ok(CorpusReader {
            path: path.to_path_buf(),
            lines: std::io::BufReader::with_capacity(1 << 20, file),
            line: 0,
            bytes_read: 0,
            buffer: String::new(),
        })
    }

    /// Bytes consumed so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    fn error(&self, message: impl Into<String>) -> CorpusError {
        CorpusError { path: self.path.clone(), line: self.line, message: message.into() }
    }
}

/// Parses one corpus line.
pub(crate) fn parse_passage(line: &str) -> Result<Doc, String> {
    let raw: RawPassage = serde_json::from_str(line).map_err(|e| format!("not a JSON passage: {e}"))?;
    let id = match raw.id {
        serde_json::Value::String(id) => id,
        serde_json::Value::Number(id) => id.to_string(),
        _ => return Err("`id` must be a string or a number".into()),
    };
    match (raw.contents, raw.title, raw.text) {
        (Some(contents), _, _) => {
            let (first, rest) = contents.split_once('\n').unwrap_or((contents.as_str(), ""));
            let title = first.trim();
            let title = title.strip_prefix('"').and_then(|t| t.strip_suffix('"')).unwrap_or(title);
            Ok(Doc { id, title: title.to_string(), text: rest.trim().to_string() })
        }
        (None, Some(title), Some(text)) => Ok(Doc { id, title, text }),
        _ => Err("expected `contents` (\"Title\"\\ntext) or both `title` and `text`".into()),
    }
}

impl Iterator for CorpusReader {
    type Item = Result<Doc, CorpusError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.buffer.clear();
            let read = match self.lines.read_line(&mut self.buffer) {
                Ok(0) => return None,
                Ok(read) => read,
                Err(e) => {
                    self.line += 1;
                    return Some(Err(self.error(format!("cannot read: {e}"))));
                }
            };
            self.line += 1;
            self.bytes_read += read as u64;
            let line = self.buffer.trim();
            if line.is_empty() {
                continue;
            }
            return Some(parse_passage(line).map_err(|message| self.error(message)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_formats_parse_to_the_same_doc() {
        let a = parse_passage(r#"{"id": "7", "contents": "\"Paris\"\nParis is the capital of France."}"#).unwrap();
        let b = parse_passage(r#"{"id": 7, "title": "Paris", "text": "Paris is the capital of France."}"#).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.contents(), "\"Paris\"\nParis is the capital of France.");
    }

    #[test]
    fn malformed_lines_name_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        std::fs::write(
            &path,
            "{\"id\":\"1\",\"title\":\"A\",\"text\":\"a\"}\n\n{\"id\":\"2\",\"text\":\"b\"}\nnot json\n",
        )
        .unwrap();
        let results: Vec<String> = CorpusReader::open(&path)
            .unwrap()
            .map(|r| match r {
                Ok(doc) => doc.id,
                Err(e) => e.to_string().replace(&dir.path().display().to_string(), "[DIR]"),
            })
            .collect();
        insta::assert_snapshot!(results.join("\n"), @r#"
        1
        [DIR]/c.jsonl:3: expected `contents` ("Title"\ntext) or both `title` and `text`
        [DIR]/c.jsonl:4: not a JSON passage: expected ident at line 1 column 2
        "#);
    }
}
