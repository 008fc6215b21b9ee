//! Client of the Search-R1 retriever API (`POST /retrieve {queries, topk, return_scores}` →
//! `{result: [[{document: {id, contents}, score}]]}`): how a run uses a shared retriever.

use std::time::Duration;

use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::corpus::parse_passage;
use super::{Hit, Search, SearchError};
use sesa_models::retry::{Attempt, with_retries};

/// Where the retriever is and how patiently to talk to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetrieverConfig {
    /// The full URL of the endpoint, e.g. `http://127.0.0.1:8000/retrieve`.
    pub url: String,
    /// Seconds before one request is abandoned.
    #[serde(default = "default_timeout")]
    pub timeout_secs: f64,
    /// Retries after a connection error, a timeout or a 5xx answer.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// The first pause between retries, in milliseconds; it doubles after each retry (jittered,
    /// at most 60 s; a `Retry-After` from the server is honoured instead).
    #[serde(default = "default_backoff")]
    pub backoff_ms: u64,
    /// Requests in flight at once (the episodes of an agent loop each search on their own).
    #[serde(default = "default_concurrency")]
    pub max_concurrency: usize,
}

fn default_timeout() -> f64 {
    30.0
}
fn default_retries() -> u32 {
    3
}
fn default_backoff() -> u64 {
    500
}
fn default_concurrency() -> usize {
    16
}

impl RetrieverConfig {
    /// A config for `url` with the default timeout and retries.
    pub fn new(url: impl Into<String>) -> Self {
        RetrieverConfig {
            url: url.into(),
            timeout_secs: default_timeout(),
            retries: default_retries(),
            backoff_ms: default_backoff(),
            max_concurrency: default_concurrency(),
        }
    }
}

#[derive(Serialize)]
struct RetrieveRequest<'a> {
    queries: &'a [String],
    topk: usize,
    return_scores: bool,
}

#[derive(Deserialize)]
struct RetrieveResponse {
    result: Vec<Vec<ScoredDocument>>,
}

#[derive(Deserialize)]
struct ScoredDocument {
    document: serde_json::Value,
    score: f32,
}

/// A retriever server client. Cheap to clone (clones share the bound on requests in flight).
#[derive(Debug, Clone)]
pub struct RetrieverClient {
    client: reqwest::Client,
    config: RetrieverConfig,
    in_flight: std::sync::Arc<tokio::sync::Semaphore>,
}

impl RetrieverClient {
    /// A client for `config`.
    pub fn new(config: RetrieverConfig) -> Result<RetrieverClient, SearchError> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs_f64(config.timeout_secs.max(0.001)))
            .build()
            .map_err(|e| SearchError::Retriever { url: config.url.clone(), message: e.to_string() })?;
        let in_flight = std::sync::Arc::new(tokio::sync::Semaphore::new(config.max_concurrency.max(1)));
        Ok(RetrieverClient { client, config, in_flight })
    }

    async fn attempt(&self, queries: &[String], k: usize) -> Result<Vec<Vec<Hit>>, Attempt> {
        let request = RetrieveRequest { queries, topk: k, return_scores: true };
        let response = self.client.post(&self.config.url).json(&request).send().await.map_err(|e| {
            let message = if e.is_timeout() {
                format!("no answer within {} s", self.config.timeout_secs)
            } else {
                format!("unreachable ({e}); is it running? `sesa serve-retriever --index DIR` serves an index")
            };
            Attempt::retry(message)
        })?;
        let status = response.status();
        if let Some(retry) = Attempt::from_status(&response, || format!("answered {status}")) {
            return Err(retry);
        }
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(Attempt::GiveUp(format!("answered {status}: {}", body.chars().take(300).collect::<String>())));
        }
        let body: RetrieveResponse =
            response.json().await.map_err(|e| Attempt::GiveUp(format!("answer is not a retriever response: {e}")))?;
        if body.result.len() != queries.len() {
            return Err(Attempt::GiveUp(format!("{} results for {} queries", body.result.len(), queries.len())));
        }
        body.result
            .into_iter()
            .map(|hits| {
                hits.into_iter()
                    .take(k)
                    .map(|scored| {
                        let doc = parse_passage(&scored.document.to_string()).map_err(Attempt::GiveUp)?;
                        Ok(Hit { doc, score: scored.score })
                    })
                    .collect()
            })
            .collect()
    }
}

impl Search for RetrieverClient {
    fn search<'a>(&'a self, queries: &'a [String], k: usize) -> BoxFuture<'a, Result<Vec<Vec<Hit>>, SearchError>> {
        Box::pin(async move {
            if queries.is_empty() {
                return Ok(Vec::new());
            }
            let _permit = self
                .in_flight
                .acquire()
                .await
                .map_err(|e| SearchError::Retriever { url: self.config.url.clone(), message: e.to_string() })?;
            let pause = Duration::from_millis(self.config.backoff_ms);
            with_retries(self.config.retries, pause, &self.config.url, || self.attempt(queries, k))
                .await
                .map_err(|message| SearchError::Retriever { url: self.config.url.clone(), message })
        })
    }
}
