//! The agents' only tool: search. A batch of free-text queries in, the top-k documents of each
//! out, from a local BM25 index or a Search-R1 retriever server, behind one [`Search`] trait.
//!
//! - `corpus`: streaming reader of Search-R1 JSONL corpora.
//! - `bm25`: the tantivy index (build, open, query).
//! - `retriever`: client of the Search-R1 `POST /retrieve` API; `server` serves an index with it.
//! - `config`: the `search:` section of a spec.
//! - `format`: how results are shown to a model, exactly as SSP does, in one place.
//! - `passages`: search over a few passages held in memory (a verifier's materials).

mod bm25;
mod corpus;
mod format;
mod passages;
mod retriever;
mod server;

use futures::future::BoxFuture;

pub use self::bm25::{Bm25Index, IndexStats};
pub use self::corpus::{CorpusError, CorpusReader};
pub use self::format::{format_results, parse_results};
pub use self::passages::PassageSearch;
pub use self::retriever::{RetrieverClient, RetrieverConfig};
pub use self::server::{ServerLimits, serve};

/// A passage of the corpus.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Doc {
    /// The corpus id.
    pub id: String,
    /// The title, without the quotes the Search-R1 format puts around it.
    pub title: String,
    /// The passage text.
    pub text: String,
}

impl Doc {
    /// The Search-R1 `contents` field: the title in double quotes, a newline, the text.
    pub fn contents(&self) -> String {
        format!("\"{}\"\n{}", self.title, self.text)
    }
}

/// A retrieved document and its score (higher is better).
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    /// The document.
    pub doc: Doc,
    /// The retrieval score; comparable only within one backend.
    pub score: f32,
}

/// Mean fraction of each question's supporting titles found among its top-`k` hits
/// (questions without supporting titles count as 0). `results` is in question order.
pub fn supporting_title_recall(questions: &[crate::data::datasets::Question], results: &[Vec<Hit>], k: usize) -> f64 {
    let total: f64 = questions
        .iter()
        .zip(results)
        .map(|(question, hits)| {
            let titles = &question.supporting_titles;
            let found = titles.iter().filter(|t| hits.iter().take(k).any(|h| &&h.doc.title == t)).count();
            found as f64 / titles.len().max(1) as f64
        })
        .sum();
    total / questions.len().max(1) as f64
}

/// Why a search failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SearchError {
    /// The index could not be read or written.
    #[error("index `{path}`: {message}")]
    Index {
        /// The index directory.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The retriever server could not be reached or answered badly.
    #[error("retriever `{url}`: {message}")]
    Retriever {
        /// The URL.
        url: String,
        /// What went wrong.
        message: String,
    },
}

/// A search backend. `search` takes a batch of queries and returns, for each query in order,
/// at most `k` hits, best first; ties keep the backend's order. A query that matches nothing
/// (empty, only stopwords, unknown words) gets an empty list, not an error: queries come from
/// models and are untrusted. Errors mean the backend itself failed.
pub trait Search: Send + Sync {
    /// Top-`k` hits for each of `queries`.
    fn search<'a>(&'a self, queries: &'a [String], k: usize) -> BoxFuture<'a, Result<Vec<Vec<Hit>>, SearchError>>;
}

#[cfg(test)]
pub(crate) mod testing {
    //! Test support: BM25 indexes of the shared benchmark packs.

    use super::Bm25Index;
    use crate::data::datasets::{Question, load_questions};

    /// A pack of `../shared/data` indexed in a temporary directory.
    pub(crate) struct SharedPack {
        pub(crate) index: Bm25Index,
        pub(crate) questions: Vec<Question>,
        _directory: tempfile::TempDir,
    }

    impl SharedPack {
        /// Indexes `../shared/data/<name>`, or says it is absent and returns `None`.
        pub(crate) fn open(name: &str) -> Option<SharedPack> {
            let data = crate::testing::shared_data(name)?;
            let directory = tempfile::tempdir().unwrap();
            Bm25Index::build(&data.join("corpus.jsonl"), &directory.path().join("index"), |_| {}).unwrap();
            let index = Bm25Index::open(&directory.path().join("index")).unwrap();
            let questions = load_questions(&data.join("questions.jsonl")).unwrap();
            Some(SharedPack { index, questions, _directory: directory })
        }
    }
}
