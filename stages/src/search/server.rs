//! `sesa serve-retriever`: a sesa index behind the Search-R1 retriever API, so that existing
//! Search-R1 and SSP tooling can use it. Requests are bounded (body size, queries, topk).

use std::future::Future;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::Bm25Index;

/// Bounds on what one request may ask.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// The largest request body, in bytes.
    pub max_body_bytes: usize,
    /// The most queries in one request.
    pub max_queries: usize,
    /// The largest `topk`.
    pub max_topk: usize,
    /// `topk` when the request says `null` or nothing.
    pub default_topk: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits { max_body_bytes: 1 << 20, max_queries: 512, max_topk: 100, default_topk: 3 }
    }
}

#[derive(Deserialize)]
struct RetrieveRequest {
    queries: Vec<String>,
    topk: Option<usize>,
    #[serde(default)]
    return_scores: bool,
}

struct ServerState {
    index: Arc<Bm25Index>,
    limits: ServerLimits,
}

fn refuse(status: StatusCode, message: String) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

async fn retrieve(
    State(state): State<Arc<ServerState>>,
    request: Result<Json<RetrieveRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Json(request) = match request {
        Ok(request) => request,
        Err(rejection) => return refuse(rejection.status(), rejection.body_text()),
    };
    let limits = state.limits;
    if request.queries.len() > limits.max_queries {
        return refuse(
            StatusCode::BAD_REQUEST,
            format!("{} queries; at most {} per request", request.queries.len(), limits.max_queries),
        );
    }
    let topk = request.topk.unwrap_or(limits.default_topk);
    if topk > limits.max_topk {
        return refuse(StatusCode::BAD_REQUEST, format!("topk {topk}; at most {}", limits.max_topk));
    }
    let index = state.index.clone();
    let queries = request.queries;
    let results = match tokio::task::spawn_blocking(move || index.search_batch(&queries, topk)).await {
        Ok(Ok(results)) => results,
        Ok(Err(error)) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
        Err(error) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
    };
    let result: Vec<Vec<serde_json::Value>> = results
        .into_iter()
        .map(|hits| {
            hits.into_iter()
                .map(|hit| {
                    let document = json!({ "id": hit.doc.id, "contents": hit.doc.contents() });
                    if request.return_scores { json!({ "document": document, "score": hit.score }) } else { document }
                })
                .collect()
        })
        .collect();
    Json(json!({ "result": result })).into_response()
}

/// Serves `index` on `listener` until `shutdown` completes.
pub async fn serve(
    index: Arc<Bm25Index>,
    listener: tokio::net::TcpListener,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let state = Arc::new(ServerState { index, limits });
    let app = Router::new()
        .route("/retrieve", post(retrieve))
        .route("/status", get(|| async { Json("ok") }))
        .layer(DefaultBodyLimit::max(limits.max_body_bytes))
        .with_state(state);
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

#[cfg(test)]
mod tests;
