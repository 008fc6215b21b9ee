//! A policy behind any OpenAI-compatible completions server (vLLM, SGLang, llama.cpp server,
//! mistralrs-server): how a run uses a fleet of GPUs.
//!
//! Trajectories continue as raw text (`POST {base_url}/completions` with the whole context), so
//! a tool result is appended without re-templating. Log-probs are requested; token ids come
//! from vLLM's `return_tokens_as_token_ids` (tokens written `token_id:N`) where the server
//! supports it. When it does not, the generation says so (no ids) and the trajectory is marked
//! inexact rather than guessed.
//!
//! One policy may be served by several servers (`base_url` as a list): each request goes to the
//! server with the fewest requests in flight, and a failed attempt is retried on another one,
//! so a server that dies mid-run costs its requests one retry, not the step.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::chat::TemplateSource;
use super::{ChatFormat, ChatMessage, FinishReason, Generation, GenerationRequest, Policy, PolicyError};
use crate::retry::{Attempt, with_retries};

/// An OpenAI-compatible server, as a spec names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenAiConfig {
    /// The API root, e.g. `http://gpu-1:8000/v1`, or a list of them: servers of the same
    /// weights, among which requests are spread (fewest in flight first) and a failed request
    /// is retried on another.
    pub base_url: ServerUrls,
    /// The model name the server knows.
    pub model: String,
    /// The environment variable holding the API key, if the server needs one.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// How messages become the prompt text: `chatml`, or the template of the model the server
    /// serves, `{from: REF}`.
    #[serde(default)]
    pub chat_template: ServerTemplate,
    /// Seconds before a request is abandoned.
    #[serde(default = "default_timeout")]
    pub timeout_secs: f64,
    /// Retries after a connection error, a timeout, a 429 or a 5xx answer: pauses from 0.5 s,
    /// doubling, jittered, at most 60 s, or the server's `Retry-After`. With several servers,
    /// each retry goes to another, and a request tries every server at least once.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// Requests in flight at once, over all concurrent calls (the episodes of an agent loop
    /// each call on their own; the server batches them).
    #[serde(default = "default_concurrency")]
    pub max_concurrency: usize,
}

/// One URL or several, as a spec writes them (`url` or `[url, url]`); never empty.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(into = "UrlsWritten")]
pub struct ServerUrls(Vec<String>);

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum UrlsWritten {
    One(String),
    Many(Vec<String>),
}

impl From<ServerUrls> for UrlsWritten {
    fn from(urls: ServerUrls) -> UrlsWritten {
        match <[String; 1]>::try_from(urls.0) {
            Ok([one]) => UrlsWritten::One(one),
            Err(many) => UrlsWritten::Many(many),
        }
    }
}

impl<'de> Deserialize<'de> for ServerUrls {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<ServerUrls, D::Error> {
        let written = UrlsWritten::deserialize(deserializer)
            .map_err(|_| serde::de::Error::custom("expected a URL or a list of URLs"))?;
        match written {
            UrlsWritten::One(url) => Ok(ServerUrls(vec![url])),
            UrlsWritten::Many(urls) if urls.is_empty() => Err(serde::de::Error::custom("the list of URLs is empty")),
            UrlsWritten::Many(urls) => Ok(ServerUrls(urls)),
        }
    }
}

impl JsonSchema for ServerUrls {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ServerUrls".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]
        })
    }
}

impl ServerUrls {
    /// One URL.
    pub fn one(url: impl Into<String>) -> ServerUrls {
        ServerUrls(vec![url.into()])
    }

    /// Several URLs; `None` when there are none.
    pub fn many(urls: Vec<String>) -> Option<ServerUrls> {
        (!urls.is_empty()).then_some(ServerUrls(urls))
    }

    /// The URLs, in the order written.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }
}

impl std::fmt::Display for ServerUrls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join(", "))
    }
}

/// The chat template of a server's prompts. The server receives raw text, so sesa renders the
/// conversation itself, with the template the served model was trained on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ServerTemplate {
    /// `<|im_start|>{role}\n{content}<|im_end|>\n` (SmolLM2, Qwen).
    #[default]
    Chatml,
    /// The model's own template, read from `hf://ORG/REPO[@REVISION]` (only its
    /// `tokenizer_config.json` is fetched), a Hugging Face model directory, a
    /// `tokenizer_config.json`, or a GGUF file: what the server was started with.
    From(String),
}

impl ServerTemplate {
    /// The chat format this names; an error says which file lacks a usable template.
    pub async fn load(&self) -> Result<ChatFormat, String> {
        let reference = match self {
            ServerTemplate::Chatml => return Ok(ChatFormat::Chatml),
            ServerTemplate::From(reference) => reference,
        };
        let path = match crate::cache::HubReference::parse(reference) {
            Some(Ok(mut hub)) => {
                hub.file.get_or_insert_with(|| "tokenizer_config.json".into());
                hub.fetch(&crate::cache::sesa_home()).await.map_err(|e| e.to_string())?
            }
            Some(Err(message)) => return Err(message),
            None => std::path::PathBuf::from(reference),
        };
        let path = if path.is_dir() { path.join("tokenizer_config.json") } else { path };
        let source = if path.extension().is_some_and(|x| x == "gguf") {
            super::candle::gguf_template_source(&path)?
        } else {
            let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let config = serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
            TemplateSource::from_tokenizer_config(&config)
        };
        source.format().map_err(|e| format!("{}: {e}", path.display()))
    }
}

fn default_timeout() -> f64 {
    300.0
}
fn default_retries() -> u32 {
    3
}
fn default_concurrency() -> usize {
    64
}

/// How long a server that failed is passed over while another is up.
const COOL_DOWN: Duration = Duration::from_secs(30);

/// The servers of one policy and what each is doing.
#[derive(Debug)]
struct Fleet {
    urls: Vec<String>,
    servers: Mutex<Vec<ServerLoad>>,
}

#[derive(Debug, Default, Clone)]
struct ServerLoad {
    in_flight: usize,
    /// Requests sent so far: among servers equally busy, the least used gets the next.
    sent: u64,
    failed_at: Option<Instant>,
}

/// A request in flight on server `index`; dropping it frees the slot.
struct Sent<'a> {
    fleet: &'a Fleet,
    index: usize,
}

impl Drop for Sent<'_> {
    fn drop(&mut self) {
        self.fleet.servers.lock().expect("fleet lock")[self.index].in_flight -= 1;
    }
}

impl Fleet {
    fn new(urls: &ServerUrls) -> Fleet {
        let urls = urls.as_slice().iter().map(|url| url.trim_end_matches('/').to_string()).collect::<Vec<_>>();
        Fleet { servers: Mutex::new(vec![ServerLoad::default(); urls.len()]), urls }
    }

    /// The server for a request's next attempt: one it has not tried, up (no failure within
    /// [`COOL_DOWN`]) where one is, with the fewest requests in flight, then the least used.
    fn send(&self, tried: &mut Vec<usize>) -> Sent<'_> {
        let mut servers = self.servers.lock().expect("fleet lock");
        if tried.len() >= servers.len() {
            tried.clear();
        }
        let now = Instant::now();
        let index = (0..servers.len())
            .filter(|i| !tried.contains(i))
            .min_by_key(|&i| {
                let server = &servers[i];
                let down = server.failed_at.is_some_and(|at| now.duration_since(at) < COOL_DOWN);
                (down, server.in_flight, server.sent, i)
            })
            .expect("a fleet has a server not yet tried");
        servers[index].in_flight += 1;
        servers[index].sent += 1;
        tried.push(index);
        Sent { fleet: self, index }
    }

    fn answered(&self, index: usize, ok: bool) {
        self.servers.lock().expect("fleet lock")[index].failed_at = if ok { None } else { Some(Instant::now()) };
    }
}

/// The client. Cheap to share.
#[derive(Debug)]
pub struct OpenAiPolicy {
    config: OpenAiConfig,
    fleet: Fleet,
    client: reqwest::Client,
    api_key: Option<String>,
    /// Set once the server has shown it has no `/tokenize`.
    no_tokenizer: AtomicBool,
    /// Permits for requests in flight (`max_concurrency`).
    in_flight: tokio::sync::Semaphore,
    /// The policy version the server holds, as an external trainer's updates report it.
    version: AtomicU64,
    /// How conversations become prompts.
    format: ChatFormat,
}

#[derive(Deserialize)]
struct CompletionResponse {
    choices: Vec<Choice>,
}

#[derive(Deserialize)]
struct Choice {
    text: String,
    finish_reason: Option<String>,
    /// vLLM: the stop string (or token id) that ended generation; absent at end of sequence.
    #[serde(default)]
    stop_reason: Option<serde_json::Value>,
    #[serde(default)]
    logprobs: Option<ChoiceLogprobs>,
}

#[derive(Deserialize)]
struct ChoiceLogprobs {
    #[serde(default)]
    tokens: Vec<String>,
    #[serde(default)]
    token_logprobs: Vec<Option<f32>>,
}

impl OpenAiPolicy {
    /// The JSON answer of a tokenizer endpoint (`tokenize`, `detokenize`), which vLLM and SGLang
    /// serve beside `/v1` (the servers share a tokenizer); `None` when the server has none.
    async fn tokenizer_call(&self, endpoint: &str, body: &serde_json::Value) -> Option<serde_json::Value> {
        let sent = self.fleet.send(&mut Vec::new());
        let root = self.fleet.urls[sent.index].trim_end_matches("/v1");
        let response = self.client.post(format!("{root}/{endpoint}")).json(body).send().await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.json().await.ok()
    }

    /// A client for `config`; reads the API key from the named environment variable and loads
    /// the chat template.
    pub async fn new(config: OpenAiConfig) -> Result<OpenAiPolicy, PolicyError> {
        let error = |message: String| PolicyError::Backend { name: config.model.clone(), message };
        let format = config.chat_template.load().await.map_err(|e| error(format!("`chat_template`: {e}")))?;
        let api_key =
            match &config.api_key_env {
                Some(variable) => Some(std::env::var(variable).map_err(|_| {
                    error(format!("the API key variable `{variable}` named by `api_key_env` is not set"))
                })?),
                None => None,
            };
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs_f64(config.timeout_secs.max(0.001)))
            .build()
            .map_err(|e| error(e.to_string()))?;
        let in_flight = tokio::sync::Semaphore::new(config.max_concurrency.max(1));
        Ok(OpenAiPolicy {
            fleet: Fleet::new(&config.base_url),
            config,
            client,
            api_key,
            no_tokenizer: AtomicBool::new(false),
            in_flight,
            version: AtomicU64::new(0),
            format,
        })
    }

    async fn post(&self, url: &str, body: &serde_json::Value) -> Result<reqwest::Response, Attempt> {
        let mut request = self.client.post(url).json(body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|e| {
            Attempt::retry(if e.is_timeout() {
                format!("no answer from {url} within {} s", self.config.timeout_secs)
            } else {
                format!("{url} is unreachable: {e}")
            })
        })?;
        let status = response.status();
        if let Some(retry) = Attempt::from_status(&response, || format!("{url} answered {status}")) {
            return Err(retry);
        }
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(Attempt::GiveUp(format!(
                "{url} answered {status}: {}",
                body.chars().take(300).collect::<String>()
            )));
        }
        Ok(response)
    }

    async fn complete(&self, request: &GenerationRequest) -> Result<Generation, PolicyError> {
        let mut body = json!({
            "model": self.config.model,
            "prompt": request.context,
            "max_tokens": request.max_tokens,
            "temperature": request.sampling.temperature,
            "top_p": request.sampling.top_p,
            "stop": request.stop,
            "seed": request.seed,
            "logprobs": 1,
            // vLLM extensions (ignored elsewhere): exact ids, and the stop string kept in both
            // the text and the ids, so that they agree.
            "return_tokens_as_token_ids": true,
            "include_stop_str_in_output": true,
        });
        if request.ignore_eos {
            body["ignore_eos"] = json!(true);
        }
        if let Some(schema) = &request.json_schema {
            body["response_format"] =
                json!({ "type": "json_schema", "json_schema": { "name": "output", "schema": schema, "strict": true } });
        }
        let tried = Mutex::new(Vec::new());
        let attempt = || async {
            let sent = self.fleet.send(&mut tried.lock().expect("tried lock"));
            let url = format!("{}/completions", self.fleet.urls[sent.index]);
            let answer = self.post(&url, &body).await;
            self.fleet.answered(sent.index, !matches!(answer, Err(Attempt::Retry { .. })));
            let parsed = answer?
                .json::<CompletionResponse>()
                .await
                .map_err(|e| Attempt::GiveUp(format!("the answer of {url} is not a completion: {e}")))?;
            self.read_choice(parsed, request)
        };
        // Every server gets its chance before a request fails.
        let retries = self.config.retries.max(self.fleet.urls.len() as u32 - 1);
        with_retries(retries, Duration::from_millis(500), &self.config.model, attempt)
            .await
            .map_err(|message| PolicyError::Backend { name: self.config.model.clone(), message })
    }

    fn read_choice(&self, response: CompletionResponse, request: &GenerationRequest) -> Result<Generation, Attempt> {
        let choice = response
            .choices
            .into_iter()
            .next()
            .ok_or_else(|| Attempt::GiveUp("the completion has no choices".into()))?;
        let mut text = choice.text;
        let finish = match choice.finish_reason.as_deref() {
            Some("length") => FinishReason::Length,
            _ => match choice.stop_reason.as_ref().and_then(|r| r.as_str()) {
                // Servers drop the stop string from the text; put it back.
                Some(stop) => {
                    if !text.ends_with(stop) {
                        text.push_str(stop);
                    }
                    FinishReason::Stop
                }
                None => close_open_tag(&mut text, &request.stop),
            },
        };
        let (token_ids, logprobs) = match choice.logprobs {
            Some(lp) if !lp.tokens.is_empty() => {
                let ids: Option<Vec<u32>> =
                    lp.tokens.iter().map(|t| t.strip_prefix("token_id:")?.parse().ok()).collect();
                let logprobs: Option<Vec<f32>> = lp.token_logprobs.into_iter().collect();
                (ids, logprobs)
            }
            _ => (None, None),
        };
        Ok(Generation { text, token_ids, logprobs, finish })
    }
}

/// Without `stop_reason`, an end of generation at a stop string and one at end of sequence look
/// alike. SSP's rule: if the text has an opener whose closer is a stop string and is not
/// closed, append the closer.
fn close_open_tag(text: &mut String, stops: &[String]) -> FinishReason {
    for stop in stops {
        let Some(tag) = stop.strip_prefix("</").and_then(|s| s.strip_suffix('>')) else { continue };
        let opener = format!("<{tag}>");
        if let Some(open) = text.rfind(&opener)
            && !text[open..].contains(stop.as_str())
        {
            text.push_str(stop);
            return FinishReason::Stop;
        }
    }
    FinishReason::Eos
}

impl Policy for OpenAiPolicy {
    fn name(&self) -> &str {
        &self.config.model
    }

    fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }

    fn reloaded(&self, version: u64, _checkpoint: &std::path::Path) -> Result<(), PolicyError> {
        self.version.store(version, Ordering::SeqCst);
        Ok(())
    }

    fn servers(&self) -> &[String] {
        &self.fleet.urls
    }

    fn render_chat(&self, messages: &[ChatMessage]) -> String {
        self.format.render(messages)
    }

    fn tokenize<'a>(&'a self, text: &'a str) -> BoxFuture<'a, Result<Option<Vec<u32>>, PolicyError>> {
        Box::pin(async move {
            if self.no_tokenizer.load(Ordering::Relaxed) {
                return Ok(None);
            }
            let body = json!({ "model": self.config.model, "prompt": text, "add_special_tokens": false });
            let tokens = self.tokenizer_call("tokenize", &body).await.and_then(|v| {
                v.get("tokens")?.as_array()?.iter().map(|t| t.as_u64().map(|t| t as u32)).collect::<Option<Vec<u32>>>()
            });
            if tokens.is_none() {
                tracing::warn!(model = %self.config.model, "the server does not tokenize; trajectories will be marked inexact");
                self.no_tokenizer.store(true, Ordering::Relaxed);
            }
            Ok(tokens)
        })
    }

    fn decode<'a>(&'a self, ids: &'a [u32]) -> BoxFuture<'a, Result<Option<String>, PolicyError>> {
        Box::pin(async move {
            if self.no_tokenizer.load(Ordering::Relaxed) {
                return Ok(None);
            }
            // vLLM answers the text as `prompt`, SGLang as `text`.
            let body = json!({ "model": self.config.model, "tokens": ids });
            let text = self.tokenizer_call("detokenize", &body).await;
            Ok(text.and_then(|v| Some(v.get("prompt").or_else(|| v.get("text"))?.as_str()?.to_string())))
        })
    }

    fn generate<'a>(
        &'a self,
        requests: &'a [GenerationRequest],
    ) -> BoxFuture<'a, Result<Vec<Generation>, PolicyError>> {
        Box::pin(async move {
            let runs = requests.iter().map(|request| async move {
                let _permit = self
                    .in_flight
                    .acquire()
                    .await
                    .map_err(|e| PolicyError::Backend { name: self.config.model.clone(), message: e.to_string() })?;
                self.complete(request).await
            });
            futures::future::join_all(runs).await.into_iter().collect()
        })
    }
}

#[cfg(any(test, feature = "testing"))]
pub mod fake;
#[cfg(test)]
mod tests;
