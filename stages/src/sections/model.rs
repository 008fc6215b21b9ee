//! `model:` and `judge:`: which policy serves, and opening it (a named local model is fetched
//! into the cache first).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use sesa_engine::{ConfigProblem, Requirement, Section};

use super::MAX_TOKENS;
use sesa_engine::deserialize_tagged;
use sesa_models::cache;
use sesa_models::policy::{
    CandleConfig, CandlePolicy, MistralRsConfig, OpenAiConfig, OpenAiPolicy, Policy, PolicyError, ServerTemplate,
};

/// The policy: a local model served in process, or an OpenAI-compatible server.
#[derive(Debug, Clone, PartialEq, JsonSchema)]
#[serde(tag = "backend", rename_all = "snake_case", deny_unknown_fields)]
pub enum ModelSection {
    /// mistral.rs in process (CPU, or CUDA with the `cuda` feature).
    Mistralrs(MistralRsConfig),
    /// sesa's batched CPU forward pass (F32 weights dequantized from the GGUF), continuous
    /// batching, KV caches kept across turns, JSON-Schema-constrained decoding (llama-family
    /// GGUF).
    Candle(CandleConfig),
    /// Any OpenAI-compatible completions server.
    Openai(OpenAiConfig),
}

// Errors inside the settings name the setting (`model: dtype: unknown variant ...`).
deserialize_tagged!(ModelSection, "backend", {
    "mistralrs" => Mistralrs(settings),
    "candle" => Candle(settings),
    "openai" => Openai(settings),
});

impl Section for ModelSection {
    const KEY: &'static str = "model";

    fn check(&self) -> Vec<ConfigProblem> {
        match self {
            ModelSection::Mistralrs(config) => {
                let mut problems = Vec::new();
                if config.instances == 0 || config.instances > 64 {
                    problems.push(ConfigProblem::new(
                        "instances",
                        format!("must be between 1 and 64, got {}", config.instances),
                    ));
                }
                problems.extend(check_local_model(&config.model));
                problems
            }
            ModelSection::Candle(config) => check_local_model(&config.model)
                .into_iter()
                .chain(ConfigProblem::size("cache_tokens", config.cache_tokens, 0..=16 * MAX_TOKENS))
                .collect(),
            ModelSection::Openai(config) => {
                let mut problems = Vec::new();
                if let ServerTemplate::From(reference) = &config.chat_template
                    && let Some(Err(message)) = cache::HubReference::parse(reference)
                {
                    problems.push(ConfigProblem::new("chat_template.from", message));
                }
                for url in config.base_url.as_slice() {
                    if !url.starts_with("http://") && !url.starts_with("https://") {
                        problems.push(ConfigProblem::new(
                            "base_url",
                            format!("`{url}` must be an http:// or https:// URL"),
                        ));
                    }
                }
                problems.extend(ConfigProblem::size("max_concurrency", config.max_concurrency, 1..=4_096));
                problems
            }
        }
    }

    fn requirements(&self) -> Vec<Requirement> {
        match self {
            ModelSection::Openai(config) => {
                let mut requirements = model_servers(config);
                if let ServerTemplate::From(reference) = &config.chat_template
                    && cache::HubReference::parse(reference).is_none()
                {
                    requirements.push(Requirement::path(
                        "chat_template.from",
                        reference,
                        "name the served model's Hugging Face directory, its tokenizer_config.json, its GGUF file, \
                         or hf://ORG/REPO",
                    ));
                }
                requirements
            }
            // A local model is checked with the spec: a file, or a known name fetched on use.
            ModelSection::Mistralrs(_) | ModelSection::Candle(_) => Vec::new(),
        }
    }
}

/// Each OpenAI-compatible server must answer `GET /models` and list the model asked for.
fn model_servers(config: &OpenAiConfig) -> Vec<Requirement> {
    let model = &config.model;
    config
        .base_url
        .as_slice()
        .iter()
        .map(|url| {
            Requirement::server(
                "base_url",
                format!("{}/models", url.trim_end_matches('/')),
                Some(model.clone()),
                format!(
                    "start an OpenAI-compatible server that serves `{model}` at {url} (vLLM: `vllm serve {model}`, \
                     SGLang: `python -m sglang.launch_server --model-path {model}`), or set this key to the URL of \
                     yours",
                ),
            )
        })
        .collect()
}

/// A local model must be a file or a name `sesa model fetch` knows.
fn check_local_model(model: &str) -> Option<ConfigProblem> {
    if let Some(reference) = cache::HubReference::parse(model) {
        return reference.err().map(|message| ConfigProblem::new("model", message));
    }
    if Path::new(model).exists() || cache::KNOWN_MODELS.iter().any(|m| m.name == model) {
        return None;
    }
    let known: Vec<&str> = cache::KNOWN_MODELS.iter().map(|m| m.name).collect();
    Some(ConfigProblem::new(
        "model",
        format!(
            "`{model}` is neither a file, a known model ({}) nor an hf://ORG/REPO[/FILE] reference",
            known.join(", ")
        ),
    ))
}

impl ModelSection {
    /// Builds the policy, fetching a named local model into the cache if it is missing.
    pub async fn open(&self) -> Result<Arc<dyn Policy>, PolicyError> {
        match self {
            #[cfg(feature = "mistralrs")]
            ModelSection::Mistralrs(config) => {
                let file = local_gguf(&config.model).await?;
                Ok(Arc::new(sesa_models::policy::MistralRsPolicy::load(&file, config.instances).await?))
            }
            #[cfg(not(feature = "mistralrs"))]
            ModelSection::Mistralrs(config) => Err(PolicyError::Backend {
                name: config.model.clone(),
                message: "this sesa was built without mistral.rs: rebuild it with `--features mistralrs`, or serve \
                          the model with `backend: candle`"
                    .into(),
            }),
            ModelSection::Candle(config) => {
                let file = local_model(&config.model).await?;
                let config = config.clone();
                tokio::task::spawn_blocking(move || CandlePolicy::load(&file, &config))
                    .await
                    .map_err(|e| PolicyError::Backend { name: "candle".into(), message: e.to_string() })?
                    .map(|policy| Arc::new(policy) as Arc<dyn Policy>)
            }
            ModelSection::Openai(config) => Ok(Arc::new(OpenAiPolicy::new(config.clone()).await?)),
        }
    }
}

/// A Hugging Face directory named in a spec, or else the GGUF file of the local model.
pub async fn local_model(model: &str) -> Result<PathBuf, PolicyError> {
    let error = |message: String| PolicyError::Backend { name: model.to_string(), message };
    let path = cache::resolve_or_fetch(model).await.map_err(|e| error(e.to_string()))?;
    if path.is_dir() && path.join("config.json").exists() {
        return Ok(path);
    }
    gguf_in(&path).map_err(error)
}

/// The GGUF file of a local model named in a spec, fetched into the model cache if needed.
#[cfg(feature = "mistralrs")]
async fn local_gguf(model: &str) -> Result<std::path::PathBuf, PolicyError> {
    let error = |message: String| PolicyError::Backend { name: model.to_string(), message };
    let path = cache::resolve_or_fetch(model).await.map_err(|e| error(e.to_string()))?;
    gguf_in(&path).map_err(error)
}

/// The judge: answers the RAG check and judges answers when asked, and distils skills. Any
/// policy backend; without this section, the policy judges.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct JudgeSection(pub ModelSection);

impl Section for JudgeSection {
    const KEY: &'static str = "judge";

    fn check(&self) -> Vec<ConfigProblem> {
        self.0.check()
    }

    fn requirements(&self) -> Vec<Requirement> {
        self.0.requirements()
    }
}

/// The proposer's own policy (`proposer_model:`), any policy backend: the proposer proposes
/// with it and training stages train it on the proposer's samples, while `model:` serves and
/// trains the solver (and verifies, and judges without a judge). Without this section both
/// roles share `model:`, as in SSP.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct ProposerModelSection(pub ModelSection);

impl Section for ProposerModelSection {
    const KEY: &'static str = "proposer_model";

    fn check(&self) -> Vec<ConfigProblem> {
        self.0.check()
    }

    fn requirements(&self) -> Vec<Requirement> {
        self.0.requirements()
    }
}

/// The GGUF file at `path`, or the only one in the directory `path`.
fn gguf_in(path: &Path) -> Result<PathBuf, String> {
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    let files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    match files.as_slice() {
        [file] => Ok(file.clone()),
        [] => Err(format!("no .gguf file in {}", path.display())),
        _ => Err(format!("several .gguf files in {}; name one", path.display())),
    }
}
