//! The read-only web console each control-plane replica serves: one page
//! (regions as columns, cells as boxes coloured by health, migrations as
//! arrows with their progress, router replicas) that polls `/api/status`,
//! the same JSON object `cellmesh ctl status --json` prints, refreshed by a
//! background [`Sampler`](crate::status::Sampler). With a trace store
//! configured (`traces_url`), the page also draws the most recent traced
//! send as a waterfall across processes, read through `/api/traces`.

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

#[derive(Clone)]
struct Console {
    latest: watch::Receiver<Value>,
    /// The trace store's base URL; empty: none.
    traces: String,
}

async fn status(State(console): State<Console>) -> impl IntoResponse {
    let body = console.latest.borrow().clone();
    ([(header::CACHE_CONTROL, "no-store")], Json(body))
}

/// The trace store's answer for `path`, as is; `[]` when there is no store,
/// 502 when it cannot be read.
async fn traces_at(console: &Console, path: &str) -> axum::response::Response {
    let json = [(header::CONTENT_TYPE, "application/json")];
    if console.traces.is_empty() {
        return (json, "[]").into_response();
    }
    let url = format!("{}{path}", console.traces.trim_end_matches('/'));
    match cellmesh_telemetry::scrape::fetch(&url, std::time::Duration::from_secs(2)).await {
        Ok(body) => (json, body).into_response(),
        Err(e) => (axum::http::StatusCode::BAD_GATEWAY, e).into_response(),
    }
}

async fn recent_traces(State(console): State<Console>) -> axum::response::Response {
    traces_at(&console, "/traces").await
}

async fn trace(
    State(console): State<Console>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> axum::response::Response {
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_hexdigit()) {
        return (axum::http::StatusCode::BAD_REQUEST, "a trace id is hex").into_response();
    }
    traces_at(&console, &format!("/traces/{id}")).await
}

/// Serves the console on `listen` until the task is aborted; returns the
/// bound address (port 0 picks one).
pub async fn serve(
    listen: SocketAddr,
    latest: watch::Receiver<Value>,
    traces: String,
) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let app = Router::new()
        .route("/", get(index))
        .route("/api/status", get(status))
        .route("/api/traces", get(recent_traces))
        .route("/api/traces/{id}", get(trace))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(Console { latest, traces });
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "console stopped");
        }
    });
    Ok((addr, task))
}
