//! The retriever client against the server, over loopback.

use std::sync::Arc;

use super::{ServerLimits, serve};
use crate::search::{Bm25Index, RetrieverClient, RetrieverConfig, Search};

async fn start(limits: ServerLimits) -> (tempfile::TempDir, Arc<Bm25Index>, String, tokio::sync::oneshot::Sender<()>) {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    let lines: Vec<String> = (0..50)
        .map(|i| format!(r#"{{"id": "{i}", "title": "Town {i}", "text": "Town {i} lies on river number{i} and has {i} bridges."}}"#))
        .collect();
    std::fs::write(&corpus, lines.join("\n")).unwrap();
    Bm25Index::build(&corpus, &dir.path().join("index"), |_| {}).unwrap();
    let index = Arc::new(Bm25Index::open(&dir.path().join("index")).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/retrieve", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(index.clone(), listener, limits, async {
        let _ = stopped.await;
    }));
    (dir, index, url, stop)
}

#[tokio::test]
async fn the_client_gets_what_the_index_gives() {
    let (_dir, index, url, _stop) = start(ServerLimits::default()).await;
    let client = RetrieverClient::new(RetrieverConfig::new(url)).unwrap();
    let queries: Vec<String> = vec!["river number7".into(), "number42 bridges".into(), "".into()];
    let remote = client.search(&queries, 3).await.unwrap();
    let local = index.search_batch(&queries, 3).unwrap();
    assert_eq!(remote.len(), 3);
    assert_eq!(remote[0][0].doc.id, "7");
    assert_eq!(remote[1][0].doc.title, "Town 42");
    assert!(remote[2].is_empty());
    let ids = |results: &Vec<Vec<crate::search::Hit>>| -> Vec<Vec<String>> {
        results.iter().map(|hits| hits.iter().map(|h| h.doc.id.clone()).collect()).collect()
    };
    assert_eq!(ids(&remote), ids(&local));
    assert_eq!(remote[0][0].doc, local[0][0].doc);
}

#[tokio::test]
async fn requests_over_the_limits_are_refused_with_a_reason() {
    let limits = ServerLimits { max_queries: 2, max_topk: 5, ..ServerLimits::default() };
    let (_dir, _index, url, _stop) = start(limits).await;
    let client = RetrieverClient::new(RetrieverConfig { retries: 0, ..RetrieverConfig::new(url.clone()) }).unwrap();
    let three: Vec<String> = vec!["a".into(), "b".into(), "c".into()];
    let error = client.search(&three, 3).await.unwrap_err().to_string();
    assert!(error.contains("3 queries; at most 2"), "{error}");
    let error = client.search(&three[..1], 50).await.unwrap_err().to_string();
    assert!(error.contains("topk 50; at most 5"), "{error}");
    let raw = reqwest::Client::new()
        .post(&url)
        .body("{not json")
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 400);
    let status = reqwest::get(url.replace("/retrieve", "/status")).await.unwrap().text().await.unwrap();
    assert_eq!(status, "\"ok\"");
}

#[tokio::test]
async fn an_unreachable_retriever_is_named_after_bounded_retries() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/retrieve", listener.local_addr().unwrap());
    drop(listener);
    let config = RetrieverConfig { retries: 2, backoff_ms: 10, ..RetrieverConfig::new(url.clone()) };
    let error = RetrieverClient::new(config).unwrap().search(&["x".to_string()], 3).await.unwrap_err().to_string();
    assert!(error.starts_with(&format!("retriever `{url}`: unreachable")), "{error}");
    assert!(error.contains("after 3 attempts"), "{error}");
}
