//! Fake OpenAI-compatible servers for tests (here and, with the feature `testing`, in the crates
//! above): one standing in for vLLM (token ids, log-probabilities, `/tokenize`, `/detokenize`) and a plain one
//! that gives neither, both writing a search, then after the search results the answer "Orla".

use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};

use super::{OpenAiConfig, ServerTemplate, ServerUrls};

/// The turn the fake model writes for a context, and the stop string it ends at.
fn fake_turn(prompt: &str) -> (&'static str, &'static str) {
    if prompt.contains("<information>") {
        ("<answer>Orla", "</answer>")
    } else {
        ("<search>capital of Veltria", "</search>")
    }
}

async fn vllm_completions(Json(body): Json<Value>) -> Json<Value> {
    let (text, stop) = fake_turn(body["prompt"].as_str().unwrap());
    let text = if body["include_stop_str_in_output"] == true { format!("{text}{stop}") } else { text.to_string() };
    let tokens: Vec<String> = text.bytes().map(|b| format!("token_id:{b}")).collect();
    let logprobs: Vec<f32> = tokens.iter().map(|_| -0.5).collect();
    Json(json!({ "choices": [{ "text": text, "finish_reason": "stop", "stop_reason": stop,
        "logprobs": { "tokens": tokens, "token_logprobs": logprobs } }] }))
}

async fn vllm_tokenize(Json(body): Json<Value>) -> Json<Value> {
    let tokens: Vec<u32> = body["prompt"].as_str().unwrap().bytes().map(u32::from).collect();
    Json(json!({ "tokens": tokens }))
}

async fn vllm_detokenize(Json(body): Json<Value>) -> Json<Value> {
    let bytes: Vec<u8> = body["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u8).collect();
    Json(json!({ "prompt": String::from_utf8(bytes).unwrap() }))
}

/// What a plain server answers to a completion request: the fake turn, no token ids.
pub async fn plain_completions(Json(body): Json<Value>) -> Json<Value> {
    let (text, _) = fake_turn(body["prompt"].as_str().unwrap());
    Json(
        json!({ "choices": [{ "text": text, "finish_reason": "stop", "logprobs": { "tokens": ["x"], "token_logprobs": [-0.1] } }] }),
    )
}

/// Serves `app` on a free local port; its base URL.
pub async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}/v1")
}

/// A policy config for the server at `base_url`, with short timeouts.
pub fn config(base_url: String) -> OpenAiConfig {
    OpenAiConfig {
        base_url: ServerUrls::one(base_url),
        model: "fake".into(),
        api_key_env: None,
        chat_template: ServerTemplate::Chatml,
        timeout_secs: 5.0,
        retries: 0,
        max_concurrency: 4,
    }
}

/// A vLLM-like server (exact token ids and log-probabilities); its base URL.
pub async fn vllm_like() -> String {
    serve(
        Router::new()
            .route("/v1/completions", post(vllm_completions))
            .route("/tokenize", post(vllm_tokenize))
            .route("/detokenize", post(vllm_detokenize)),
    )
    .await
}

/// A server that gives neither token ids nor a tokenizer; its base URL.
pub async fn plain() -> String {
    serve(Router::new().route("/v1/completions", post(plain_completions))).await
}
