//! The mistral.rs engine behind the [`Policy`] trait (built with the `mistralrs` feature).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use futures::future::BoxFuture;
use mistralrs::core::{
    AddModelConfig, AutoDeviceMapParams, DeviceMapSetting, EngineConfig, GGUFLoaderBuilder, GGUFSpecificConfig,
    IsqOrganization, Loader, NormalLoaderBuilder, NormalSpecificConfig, TokenSource,
};
use mistralrs::{
    Constraint, CustomLogitsProcessor, DefaultSchedulerMethod, Device, ModelDType, NormalRequest, Request,
    RequestMessage, Response, SamplingParams, SchedulerConfig, StopTokens, Tensor,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::policy::sampling::sample;
use crate::policy::{
    ChatFormat, ChatMessage, FinishReason, Generation, GenerationRequest, Policy, PolicyError, Sampling,
};

/// Samples one token with its own RNG and records what it picked.
struct SeededSampler {
    sampling: Sampling,
    state: Mutex<SamplerState>,
}

struct SamplerState {
    rng: ChaCha8Rng,
    prompt_len: Option<usize>,
    picks: Vec<(u32, f32)>,
}

impl SeededSampler {
    fn new(sampling: Sampling, seed: u64) -> Self {
        SeededSampler {
            sampling,
            state: Mutex::new(SamplerState {
                rng: ChaCha8Rng::seed_from_u64(seed),
                prompt_len: None,
                picks: Vec::new(),
            }),
        }
    }

    fn picks(&self) -> Vec<(u32, f32)> {
        self.state.lock().expect("sampler lock").picks.clone()
    }
}

impl CustomLogitsProcessor for SeededSampler {
    fn apply(&self, logits: &Tensor, context: &[u32]) -> mistralrs::Result<Tensor> {
        let mut state = self.state.lock().expect("sampler lock");
        let prompt_len = *state.prompt_len.get_or_insert(context.len());
        let step = context.len().saturating_sub(prompt_len);
        let values: Vec<f32> = logits.to_dtype(mistralrs::DType::F32)?.to_vec1()?;
        let (chosen, logprob) = sample(&values, self.sampling, &mut state.rng);
        // A grammar re-sample would call again for the same step: overwrite, do not append.
        state.picks.truncate(step);
        state.picks.push((chosen, logprob));
        let mut masked = vec![f32::NEG_INFINITY; values.len()];
        masked[chosen as usize] = 0.0;
        Tensor::from_vec(masked, values.len(), logits.device())
    }
}

/// mistral.rs behind the [`Policy`] trait.
pub struct MistralRsPolicy {
    name: String,
    /// The GGUF's own chat template, or ChatML.
    chat: ChatFormat,
    device: Device,
    /// The engines; an external trainer's checkpoint replaces them all (between steps, when
    /// no request is in flight; a request holds the set it started on).
    instances: RwLock<Arc<Vec<mistralrs::Model>>>,
    free: Mutex<Vec<usize>>,
    available: tokio::sync::Semaphore,
    version: AtomicU64,
}

impl std::fmt::Debug for MistralRsPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = self.instances.read().expect("instances lock").len();
        write!(f, "MistralRsPolicy({}, {count} instances)", self.name)
    }
}

fn backend_error(name: &str, message: impl std::fmt::Display) -> PolicyError {
    PolicyError::Backend { name: name.to_string(), message: message.to_string() }
}

/// What an engine is built from.
#[derive(Clone, Copy)]
enum Weights<'a> {
    /// A GGUF file (its own quantized types).
    Gguf(&'a Path),
    /// A Hugging Face directory (config.json, safetensors, tokenizer.json): a trainer's checkpoint.
    HuggingFace(&'a Path),
}

/// A loader of `weights` (mistral.rs loaders build one pipeline each).
fn loader(weights: &Weights) -> Result<Box<dyn Loader>, String> {
    let canonical = |path: &Path| std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()));
    match weights {
        Weights::Gguf(path) => {
            let file = path.file_name().and_then(|n| n.to_str()).unwrap_or("model").to_string();
            let directory = canonical(path.parent().unwrap_or(Path::new(".")))?;
            let config = GGUFSpecificConfig { topology: None };
            Ok(GGUFLoaderBuilder::new(None, None, directory.display().to_string(), vec![file], config, false, None)
                .build())
        }
        Weights::HuggingFace(directory) => {
            let config = NormalSpecificConfig {
                topology: None,
                organization: IsqOrganization::Default,
                write_uqff: None,
                from_uqff: None,
                imatrix: None,
                calibration_file: None,
                hf_cache_path: None,
                matformer_config_path: None,
                matformer_slice_name: None,
            };
            let directory = canonical(directory)?.display().to_string();
            NormalLoaderBuilder::new(config, None, None, Some(directory), false, None)
                .build(None)
                .map_err(|e| e.to_string())
        }
    }
}

/// mistral.rs 0.8.1 reads a llama's RoPE base from `rope_theta`, which transformers 5 writes
/// inside `rope_parameters` (the reference trainer's checkpoints): such a checkpoint is read
/// through a directory of links to its files with the key put back, `None` when none is needed.
fn with_rope_theta(checkpoint: &Path) -> Result<Option<PathBuf>, String> {
    static SHADOWS: AtomicU64 = AtomicU64::new(0);
    let path = checkpoint.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut config: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    let theta = match crate::weights::rope_theta(&config) {
        Some(theta) if config.get("rope_theta").is_none() => theta,
        _ => return Ok(None),
    };
    config["rope_theta"] = serde_json::json!(theta);
    let number = SHADOWS.fetch_add(1, Ordering::SeqCst);
    let shadow = std::env::temp_dir().join(format!("sesa-checkpoint-{}-{number}", std::process::id()));
    let io = |e: std::io::Error| format!("{}: {e}", shadow.display());
    std::fs::create_dir_all(&shadow).map_err(io)?;
    for entry in std::fs::read_dir(checkpoint).map_err(|e| format!("{}: {e}", checkpoint.display()))? {
        let entry = entry.map_err(io)?;
        if entry.file_name() != "config.json" {
            let target = std::fs::canonicalize(entry.path()).map_err(io)?;
            std::os::unix::fs::symlink(target, shadow.join(entry.file_name())).map_err(io)?;
        }
    }
    std::fs::write(shadow.join("config.json"), config.to_string()).map_err(io)?;
    Ok(Some(shadow))
}

/// `count` engines of `weights` on `device`, in F32.
async fn engines(weights: Weights<'_>, count: usize, device: &Device) -> Result<Vec<mistralrs::Model>, String> {
    let shadow = match weights {
        Weights::HuggingFace(checkpoint) => with_rope_theta(checkpoint)?,
        Weights::Gguf(_) => None,
    };
    let built = build_engines(shadow.as_deref().map_or(weights, Weights::HuggingFace), count, device).await;
    // The engines hold the weights now (the links' targets stay where the trainer wrote them).
    if let Some(shadow) = shadow {
        let _ = std::fs::remove_dir_all(shadow);
    }
    built
}

async fn build_engines(weights: Weights<'_>, count: usize, device: &Device) -> Result<Vec<mistralrs::Model>, String> {
    let path = match weights {
        Weights::Gguf(path) | Weights::HuggingFace(path) => path,
    };
    let mut models = Vec::new();
    for _ in 0..count.max(1) {
        let pipeline = loader(&weights)?
            .load_model_from_hf(
                None,
                TokenSource::None,
                &ModelDType::F32,
                device,
                true,
                DeviceMapSetting::Auto(AutoDeviceMapParams::default_text()),
                None,
                None,
            )
            .map_err(|e| format!("loading {}: {e}", path.display()))?;
        let scheduler = SchedulerConfig::DefaultScheduler {
            method: DefaultSchedulerMethod::Fixed(1.try_into().expect("1 is not zero")),
        };
        // The prefix cache makes a context's logits depend on what was computed before
        // (chunked versus whole prefill), which breaks "same seed, same trajectory".
        let engine =
            EngineConfig { throughput_logging_enabled: false, no_prefix_cache: true, ..EngineConfig::default() };
        models.push(
            mistralrs::model_builder_trait::build_model_from_pipeline(pipeline, scheduler, AddModelConfig::new(engine))
                .await,
        );
    }
    Ok(models)
}

impl MistralRsPolicy {
    /// Loads `instances` copies of the GGUF file at `path` in F32: on the first GPU when built
    /// with `cuda` and one is there, else on the CPU (a `cuda` build on a machine without a
    /// usable GPU says so and goes on, as the other builds do).
    pub async fn load(path: &Path, instances: usize) -> Result<MistralRsPolicy, PolicyError> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("model").to_string();
        let device = Device::cuda_if_available(0).unwrap_or_else(|e| {
            tracing::warn!(model = %name, "no GPU to use ({e}): mistral.rs runs on the CPU");
            Device::Cpu
        });
        tracing::info!(model = %name, device = ?device.location(), "mistral.rs loads the model");
        let models = engines(Weights::Gguf(path), instances, &device).await.map_err(|e| backend_error(&name, e))?;
        let count = models.len();
        let chat = crate::policy::candle::gguf_template_source(path)
            .map_err(|e| backend_error(&name, e))?
            .format_or_chatml(&name);
        Ok(MistralRsPolicy {
            name,
            chat,
            device,
            instances: RwLock::new(Arc::new(models)),
            free: Mutex::new((0..count).collect()),
            available: tokio::sync::Semaphore::new(count),
            version: AtomicU64::new(0),
        })
    }

    async fn detokenize(&self, model: &mistralrs::Model, ids: &[u32]) -> Result<String, PolicyError> {
        model.detokenize(ids.to_vec(), true).await.map_err(|e| backend_error(&self.name, e))
    }

    fn engines(&self) -> Arc<Vec<mistralrs::Model>> {
        self.instances.read().expect("instances lock").clone()
    }

    async fn continue_one(
        &self,
        model: &mistralrs::Model,
        request: &GenerationRequest,
    ) -> Result<Generation, PolicyError> {
        if request.ignore_eos {
            return Err(backend_error(
                &self.name,
                "mistral.rs cannot generate past end-of-sequence; use the candle or openai backend",
            ));
        }
        let context = match &request.context_ids {
            Some(ids) => ids.clone(),
            None => model
                .tokenize(either::Either::Right(request.context.clone()), None, false, false, None)
                .await
                .map_err(|e| backend_error(&self.name, e))?,
        };
        let sampler = Arc::new(SeededSampler::new(request.sampling, request.seed));
        let mut sampling = SamplingParams::neutral();
        sampling.temperature = Some(1.0);
        // One token more than asked: a stop string is detected one token late.
        sampling.max_len = Some(request.max_tokens + 1);
        if !request.stop.is_empty() {
            sampling.stop_toks = Some(StopTokens::Seqs(request.stop.clone()));
        }
        let (sender, mut receiver) = tokio::sync::mpsc::channel(1);
        let inner = model.inner();
        let normal = NormalRequest {
            messages: RequestMessage::CompletionTokens(context),
            sampling_params: sampling,
            response: sender,
            return_logprobs: false,
            is_streaming: false,
            id: inner.next_request_id(),
            constraint: request.json_schema.clone().map_or(Constraint::None, Constraint::JsonSchema),
            suffix: None,
            tools: None,
            tool_choice: None,
            logits_processors: Some(vec![sampler.clone() as Arc<dyn CustomLogitsProcessor>]),
            return_raw_logits: false,
            web_search_options: None,
            model_id: None,
            truncate_sequence: false,
        };
        inner
            .get_sender(None)
            .map_err(|e| backend_error(&self.name, e))?
            .send(Request::Normal(Box::new(normal)))
            .await
            .map_err(|e| backend_error(&self.name, e))?;
        let engine_finish = match receiver.recv().await {
            Some(Response::CompletionDone(done)) => {
                done.choices.first().map(|c| c.finish_reason.clone()).unwrap_or_default()
            }
            Some(Response::InternalError(e)) | Some(Response::ValidationError(e)) => {
                return Err(backend_error(&self.name, e));
            }
            Some(Response::CompletionModelError(message, _)) => return Err(backend_error(&self.name, message)),
            Some(_) => return Err(backend_error(&self.name, "unexpected response kind")),
            None => return Err(backend_error(&self.name, "the engine dropped the request")),
        };
        let mut picks = sampler.picks();
        let mut finish = if engine_finish == "eos" { FinishReason::Eos } else { FinishReason::Length };
        // Cut after the first token whose prefix text contains a stop string (binary search on
        // the length of the prefix, since containing a stop string is monotone in it).
        let ids: Vec<u32> = picks.iter().map(|(id, _)| *id).collect();
        let full = self.detokenize(model, &ids).await?;
        if request.stop.iter().any(|s| full.contains(s.as_str())) {
            let (mut low, mut high) = (1, ids.len());
            while low < high {
                let middle = (low + high) / 2;
                let prefix = self.detokenize(model, &ids[..middle]).await?;
                if request.stop.iter().any(|s| prefix.contains(s.as_str())) { high = middle } else { low = middle + 1 }
            }
            picks.truncate(low);
            finish = FinishReason::Stop;
        } else if picks.len() > request.max_tokens {
            picks.truncate(request.max_tokens);
            finish = FinishReason::Length;
        }
        let ids: Vec<u32> = picks.iter().map(|(id, _)| *id).collect();
        // The text is exactly what the ids decode to, even where the token that completes a
        // stop string carries a character or two after it: ids and text must agree.
        let text = self.detokenize(model, &ids).await?;
        Ok(Generation { text, token_ids: Some(ids), logprobs: Some(picks.iter().map(|(_, lp)| *lp).collect()), finish })
    }
}

impl Policy for MistralRsPolicy {
    fn name(&self) -> &str {
        &self.name
    }

    fn render_chat(&self, messages: &[ChatMessage]) -> String {
        self.chat.render(messages)
    }

    fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }

    /// Rebuilds every engine from the checkpoint (a Hugging Face directory) on the same device.
    fn reloaded(&self, version: u64, checkpoint: &Path) -> Result<(), PolicyError> {
        let count = self.engines().len();
        let built =
            tokio::runtime::Handle::current().block_on(engines(Weights::HuggingFace(checkpoint), count, &self.device));
        *self.instances.write().expect("instances lock") = Arc::new(built.map_err(|e| backend_error(&self.name, e))?);
        self.version.store(version, Ordering::SeqCst);
        Ok(())
    }

    fn tokenize<'a>(&'a self, text: &'a str) -> BoxFuture<'a, Result<Option<Vec<u32>>, PolicyError>> {
        Box::pin(async move {
            let instances = self.engines();
            let ids = instances[0]
                .tokenize(either::Either::Right(text.to_string()), None, false, false, None)
                .await
                .map_err(|e| backend_error(&self.name, e))?;
            Ok(Some(ids))
        })
    }

    fn decode<'a>(&'a self, ids: &'a [u32]) -> BoxFuture<'a, Result<Option<String>, PolicyError>> {
        Box::pin(async move {
            let instances = self.engines();
            self.detokenize(&instances[0], ids).await.map(Some)
        })
    }

    fn generate<'a>(
        &'a self,
        requests: &'a [GenerationRequest],
    ) -> BoxFuture<'a, Result<Vec<Generation>, PolicyError>> {
        Box::pin(async move {
            let runs = requests.iter().map(|request| async move {
                let _permit = self.available.acquire().await.map_err(|e| backend_error(&self.name, e))?;
                let index = self.free.lock().expect("pool lock").pop().expect("a permit means a free instance");
                let instances = self.engines();
                let result = self.continue_one(&instances[index], request).await;
                self.free.lock().expect("pool lock").push(index);
                result
            });
            futures::future::join_all(runs).await.into_iter().collect()
        })
    }
}
