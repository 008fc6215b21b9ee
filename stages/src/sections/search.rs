//! The `search:` section of a spec: which backend the agents search with.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, Requirement, Section};

use crate::search::{Bm25Index, RetrieverClient, RetrieverConfig, Search, SearchError};
use sesa_engine::deserialize_tagged;

/// The agents' search tool, as a spec configures it.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchSection {
    /// Passages returned per query (SSP: 3).
    #[serde(default = "default_top_k")]
    pub top_k: usize,
    /// The backend.
    pub backend: Backend,
}

fn default_top_k() -> usize {
    3
}

/// Where the passages come from.
#[derive(Debug, Clone, PartialEq, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Backend {
    /// A local BM25 index directory, built by `sesa index build`.
    Bm25(Bm25Config),
    /// A Search-R1 retriever server.
    Retriever(RetrieverConfig),
}

deserialize_tagged!(Backend, "kind", { "bm25" => Bm25(settings), "retriever" => Retriever(settings) });

/// A local BM25 index.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Bm25Config {
    /// The index directory.
    pub index: PathBuf,
    /// A corpus (Search-R1 JSONL) to build the index from when it does not exist yet.
    #[serde(default)]
    pub corpus: Option<PathBuf>,
}

impl Section for SearchSection {
    const KEY: &'static str = "search";

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        if !(1..=100).contains(&self.top_k) {
            problems.push(ConfigProblem::new("top_k", format!("must be between 1 and 100, got {}", self.top_k)));
        }
        if let Backend::Retriever(retriever) = &self.backend {
            if !retriever.url.starts_with("http://") && !retriever.url.starts_with("https://") {
                problems.push(ConfigProblem::new("backend.url", "must be an http:// or https:// URL"));
            }
            if retriever.timeout_secs <= 0.0 {
                problems.push(ConfigProblem::new("backend.timeout_secs", "must be positive"));
            }
        }
        problems
    }

    fn requirements(&self) -> Vec<Requirement> {
        match &self.backend {
            Backend::Bm25(Bm25Config { index, corpus }) => {
                bm25_requirements("backend.index", index, "backend.corpus", corpus.as_deref())
            }
            // Search-R1's server answers only `POST`; any answer to a `GET` shows it is up.
            Backend::Retriever(config) => vec![Requirement::server(
                "backend.url",
                &config.url,
                None,
                "start a retriever there: Search-R1's `retrieval_server.py` over wiki-18, or \
                 `sesa serve-retriever --index DIR` over a BM25 index (`sesa index build`)",
            )],
        }
    }

    fn provides(&self) -> Vec<PathBuf> {
        match &self.backend {
            Backend::Bm25(Bm25Config { index, corpus: Some(_) }) => vec![index.clone()],
            _ => Vec::new(),
        }
    }
}

/// A BM25 index must exist, or a corpus to build it from on first use.
pub fn bm25_requirements(index_key: &str, index: &Path, corpus_key: &str, corpus: Option<&Path>) -> Vec<Requirement> {
    match corpus {
        Some(corpus) if !index.exists() => vec![Requirement::path(
            corpus_key,
            corpus,
            "the corpus the index is built from: Search-R1 JSONL, `{\"id\", \"contents\"}` per line",
        )],
        Some(_) => Vec::new(),
        None => vec![Requirement::path(
            index_key,
            index,
            format!(
                "build it with `sesa index build CORPUS --out {}`, or name the corpus in `{corpus_key}` to build it \
                 on first use",
                index.display()
            ),
        )],
    }
}

impl SearchSection {
    /// Opens the backend, first building a missing BM25 index from the configured corpus.
    pub fn open_or_build(&self) -> Result<Arc<dyn Search>, SearchError> {
        match &self.backend {
            Backend::Bm25(Bm25Config { index, corpus: Some(corpus) }) => {
                Ok(Arc::new(Arc::new(Bm25Index::open_or_build(corpus, index)?)))
            }
            _ => self.open(),
        }
    }

    /// Opens the backend. The index is opened (not built): a missing index is an error that
    /// says how to build it.
    pub fn open(&self) -> Result<Arc<dyn Search>, SearchError> {
        Ok(match &self.backend {
            Backend::Bm25(Bm25Config { index, .. }) => Arc::new(Arc::new(Bm25Index::open(index)?)),
            Backend::Retriever(config) => Arc::new(RetrieverClient::new(config.clone())?),
        })
    }
}
