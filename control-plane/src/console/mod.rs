//! The read-only web console each control-plane replica serves: one page
//! (regions as columns, cells as boxes coloured by health, migrations as
//! arrows with their progress, router replicas) that polls `/api/status`,
//! the same JSON object `cellmesh ctl status --json` prints, refreshed by a
//! background [`Sampler`](crate::status::Sampler).

use std::net::SocketAddr;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;

const INDEX: &str = include_str!("index.html");

async fn index() -> Html<&'static str> {
    Html(INDEX)
}

async fn status(State(latest): State<watch::Receiver<Value>>) -> impl IntoResponse {
    let body = latest.borrow().clone();
    ([(header::CACHE_CONTROL, "no-store")], Json(body))
}

/// Serves the console on `listen` until the task is aborted; returns the
/// bound address (port 0 picks one).
pub async fn serve(
    listen: SocketAddr,
    latest: watch::Receiver<Value>,
) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let app = Router::new()
        .route("/", get(index))
        .route("/api/status", get(status))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(latest);
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "console stopped");
        }
    });
    Ok((addr, task))
}
