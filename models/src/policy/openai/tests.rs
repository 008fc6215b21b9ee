//! The OpenAI-compatible backend against HTTP test servers: several of them, overloaded, dying,
//! or serving their own chat template.

use std::sync::Arc;

use axum::routing::post;
use axum::{Json, Router};
use serde_json::Value;

use super::fake::{config, plain_completions, serve};
use super::*;
use crate::policy::Sampling;

#[tokio::test]
async fn an_unreachable_server_is_named() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    drop(listener);
    let policy = OpenAiPolicy::new(config(url.clone())).await.unwrap();
    let request = GenerationRequest {
        context: "hi".into(),
        context_ids: None,
        max_tokens: 4,
        stop: vec![],
        sampling: Sampling::GREEDY,
        seed: 0,
        json_schema: None,
        ignore_eos: false,
    };
    let error = policy.generate(std::slice::from_ref(&request)).await.unwrap_err().to_string();
    assert!(error.contains(&format!("{url}/completions is unreachable")), "{error}");
}

#[tokio::test]
async fn a_missing_api_key_variable_is_named() {
    let mut config = config("http://127.0.0.1:9/v1".into());
    config.api_key_env = Some("SESA_TEST_SURELY_UNSET_KEY".into());
    let error = OpenAiPolicy::new(config).await.unwrap_err().to_string();
    assert!(error.contains("SESA_TEST_SURELY_UNSET_KEY"), "{error}");
}

/// A completions server that numbers the requests it gets (from 0) and answers each with
/// `answer(number, body)`: its URL, and the count of requests so far.
async fn numbered_server<F, Fut>(answer: F) -> (String, Arc<std::sync::atomic::AtomicUsize>)
where
    F: Fn(usize, Value) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = axum::response::Response> + Send,
{
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = calls.clone();
    let app = Router::new().route(
        "/v1/completions",
        post(move |Json(body): Json<Value>| {
            let (counter, answer) = (counter.clone(), answer.clone());
            async move { answer(counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst), body).await }
        }),
    );
    (serve(app).await, calls)
}

#[tokio::test]
async fn an_overloaded_server_is_retried_after_the_wait_it_asks_for() {
    use axum::response::IntoResponse;
    use std::sync::atomic::Ordering;
    let (url, calls) = numbered_server(|number, body| async move {
        if number == 0 {
            return (axum::http::StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")], "busy").into_response();
        }
        plain_completions(Json(body)).await.into_response()
    })
    .await;
    let policy = OpenAiPolicy::new(OpenAiConfig { retries: 2, ..config(url) }).await.unwrap();
    let request = question(0);
    let started = std::time::Instant::now();
    let generation = policy.generate(std::slice::from_ref(&request)).await.unwrap().remove(0);
    let waited = started.elapsed();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert!(generation.text.contains("capital of Veltria"), "{}", generation.text);
    // The first pause alone would be at most 0.5 s; the server asked for a second.
    assert!(waited >= std::time::Duration::from_secs(1), "retried after {waited:?}");
}

fn question(seed: u64) -> GenerationRequest {
    GenerationRequest {
        context: "What is the capital of Veltria?".into(),
        context_ids: None,
        max_tokens: 8,
        stop: vec![],
        sampling: Sampling::GREEDY,
        seed,
        json_schema: None,
        ignore_eos: false,
    }
}

/// A server that answers completions, each after `delay_ms`, and after `dies_after` of them
/// hangs (as a server whose process stopped while its socket stays open).
async fn counting_server(delay_ms: u64, dies_after: usize) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use axum::response::IntoResponse;
    numbered_server(move |number, body| async move {
        if number >= dies_after {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
        plain_completions(Json(body)).await.into_response()
    })
    .await
}

#[tokio::test]
async fn a_fleet_of_servers_shares_the_requests() {
    use std::sync::atomic::Ordering;
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(counting_server(50, usize::MAX).await);
    }
    let urls = ServerUrls::many(servers.iter().map(|(url, _)| url.clone()).collect()).unwrap();
    let policy =
        OpenAiPolicy::new(OpenAiConfig { base_url: urls, max_concurrency: 30, ..config(String::new()) }).await.unwrap();
    let requests: Vec<GenerationRequest> = (0..30).map(question).collect();
    let generations = policy.generate(&requests).await.unwrap();
    assert!(generations.iter().all(|g| g.text.contains("capital of Veltria")));
    let answered: Vec<usize> = servers.iter().map(|(_, calls)| calls.load(Ordering::SeqCst)).collect();
    assert_eq!(answered.iter().sum::<usize>(), 30);
    // All 30 are in flight together, so the fewest-in-flight rule deals them out evenly.
    assert_eq!(answered, [10, 10, 10]);
    assert_eq!(policy.servers().len(), 3);
}

#[tokio::test]
async fn a_server_that_dies_mid_run_costs_a_retry_not_the_step() {
    use std::sync::atomic::Ordering;
    let (healthy, healthy_calls) = counting_server(10, usize::MAX).await;
    let (dying, dying_calls) = counting_server(10, 2).await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let unreachable = format!("http://{}/v1", listener.local_addr().unwrap());
    drop(listener);
    let urls = ServerUrls::many(vec![unreachable, dying, healthy]).unwrap();
    // No retries asked for: a request still tries every server once before it fails.
    let config =
        OpenAiConfig { base_url: urls, timeout_secs: 1.0, retries: 0, max_concurrency: 3, ..config(String::new()) };
    let policy = OpenAiPolicy::new(config).await.unwrap();
    let requests: Vec<GenerationRequest> = (0..12).map(question).collect();
    let generations = policy.generate(&requests).await.unwrap();
    assert_eq!(generations.len(), 12);
    assert!(generations.iter().all(|g| g.text.contains("capital of Veltria")));
    let (served_by_dying, healthy) = (dying_calls.load(Ordering::SeqCst).min(2), healthy_calls.load(Ordering::SeqCst));
    assert_eq!(served_by_dying + healthy, 12, "every request answered once, by a live server");
    assert!(served_by_dying >= 1, "the dying server answered before it died");
}

#[tokio::test]
async fn a_list_of_urls_is_read_and_written_as_the_spec_has_it() {
    let one: OpenAiConfig = serde_yaml::from_str("{base_url: 'http://a/v1', model: m}").unwrap();
    assert_eq!(one.base_url.as_slice(), ["http://a/v1"]);
    assert_eq!(serde_yaml::to_string(&one.base_url).unwrap().trim(), "http://a/v1");
    let two: OpenAiConfig = serde_yaml::from_str("{base_url: ['http://a/v1', 'http://b/v1'], model: m}").unwrap();
    assert_eq!(two.base_url.to_string(), "http://a/v1, http://b/v1");
    let error = serde_yaml::from_str::<OpenAiConfig>("{base_url: [], model: m}").unwrap_err().to_string();
    assert!(error.contains("empty"), "{error}");
}

/// Llama 3 Instruct's template, as its `tokenizer_config.json` holds it (the BOS token as an
/// added token's object).
const LLAMA3_TOKENIZER_CONFIG: &str = r#"{
  "bos_token": {"content": "<|begin_of_text|>", "special": true},
  "eos_token": "<|eot_id|>",
  "chat_template": "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
}"#;

#[tokio::test]
async fn a_served_models_own_template_renders_the_prompts() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer_config.json"), LLAMA3_TOKENIZER_CONFIG).unwrap();
    let messages = [ChatMessage::new("system", "Search first."), ChatMessage::new("user", "Question: Who?")];
    let expected = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nSearch first.<|eot_id|>\
                    <|start_header_id|>user<|end_header_id|>\n\nQuestion: Who?<|eot_id|>\
                    <|start_header_id|>assistant<|end_header_id|>\n\n";
    // The model's directory, or its tokenizer_config.json.
    for from in [dir.path().to_path_buf(), dir.path().join("tokenizer_config.json")] {
        let config = OpenAiConfig {
            chat_template: ServerTemplate::From(from.display().to_string()),
            ..config("http://127.0.0.1:9/v1".into())
        };
        let policy = OpenAiPolicy::new(config).await.unwrap();
        assert_eq!(policy.render_chat(&messages), expected, "from {}", from.display());
    }
    // The default stays ChatML.
    let policy = OpenAiPolicy::new(config("http://127.0.0.1:9/v1".into())).await.unwrap();
    assert!(policy.render_chat(&messages).starts_with("<|im_start|>system\nSearch first.<|im_end|>\n"));
}

#[tokio::test]
async fn a_template_that_cannot_be_read_is_an_error_that_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer_config.json"), r#"{"eos_token": "</s>"}"#).unwrap();
    let missing = dir.path().join("nowhere").join("tokenizer_config.json");
    for (from, why) in [(dir.path().to_path_buf(), "no `chat_template`"), (missing.clone(), "")] {
        let config = OpenAiConfig {
            chat_template: ServerTemplate::From(from.display().to_string()),
            ..config("http://x/v1".into())
        };
        let error = OpenAiPolicy::new(config).await.unwrap_err().to_string();
        assert!(
            error.contains("`chat_template`") && error.contains("tokenizer_config.json") && error.contains(why),
            "{error}"
        );
    }
}
