//! Reloading a policy served by several servers.

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;

use super::*;

async fn serve(status: StatusCode) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let app = Router::new().route("/reload", post(move || async move { status }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}/reload")
}

fn trainer(dir: &Path, reload_command: Option<Vec<String>>, reload_url: Option<ServerUrls>) -> ExternalTrainer {
    ExternalTrainer { command: vec!["true".into()], dir: dir.into(), timeout_s: 5, reload_command, reload_url }
}

#[tokio::test]
async fn the_reload_command_is_told_every_server_of_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let told = dir.path().join("servers.txt");
    let command = vec!["sh".into(), "-c".into(), format!("echo \"$SESA_MODEL: $SESA_SERVERS\" > {}", told.display())];
    let servers = ["http://gpu-1:8000/v1".to_string(), "http://gpu-2:8000/v1".to_string()];
    let log = dir.path().join("reload.log");
    trainer(dir.path(), Some(command), None).reload(TrainedModel::Model, &servers, "/ckpt", 1, &log).await.unwrap();
    assert_eq!(std::fs::read_to_string(&told).unwrap(), "model: http://gpu-1:8000/v1 http://gpu-2:8000/v1\n");
}

#[tokio::test]
async fn a_server_that_cannot_reload_fails_the_step_and_names_those_that_did() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (serve(StatusCode::OK).await, serve(StatusCode::INTERNAL_SERVER_ERROR).await);
    let third = serve(StatusCode::OK).await;
    let urls = ServerUrls::many(vec![first.clone(), second.clone(), third.clone()]).unwrap();
    let log = dir.path().join("reload.log");
    let error = trainer(dir.path(), None, Some(urls))
        .reload(TrainedModel::Model, &[], "/ckpt", 1, &log)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains(&format!("reloading the policy at {second}: HTTP 500")), "{error}");
    assert!(error.contains(&format!("({first} did reload)")), "{error}");
    assert!(!error.contains(&third), "the servers after the failing one are not asked: {error}");
    let urls = ServerUrls::many(vec![first, third]).unwrap();
    trainer(dir.path(), None, Some(urls)).reload(TrainedModel::Model, &[], "/ckpt", 1, &log).await.unwrap();
}
