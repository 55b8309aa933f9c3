//! The admin HTTP port every role may open (`metrics_listen`): Prometheus
//! text at `/metrics` and a liveness answer at `/healthz`. It serves only
//! reads of the process's own figures.

use std::net::SocketAddr;

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::task::JoinHandle;

/// The content types of the two expositions.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// OpenMetrics to a scraper that asks for it (Prometheus does), the classic
/// text format to anyone else.
async fn metrics(headers: axum::http::HeaderMap) -> impl IntoResponse {
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    if openmetrics {
        (
            [(header::CONTENT_TYPE, OPENMETRICS)],
            crate::registry::encode(),
        )
    } else {
        (
            [(header::CONTENT_TYPE, PROMETHEUS_TEXT)],
            crate::registry::encode_prometheus(),
        )
    }
}

/// Serves `/metrics` and `/healthz` on `listen`; the bound address and the
/// server task (abort it to stop).
pub async fn serve(listen: SocketAddr) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    crate::registry::enable();
    let addr = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }));
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "admin HTTP server stopped");
        }
    });
    tracing::info!(%addr, "metrics at http://{addr}/metrics");
    Ok((addr, task))
}

/// Serves on `listen` unless it is empty (metrics off).
pub async fn serve_configured(
    listen: &str,
) -> Result<Option<(SocketAddr, JoinHandle<()>)>, String> {
    if listen.is_empty() {
        return Ok(None);
    }
    let addr: SocketAddr = listen
        .parse()
        .map_err(|e| format!("metrics_listen {listen:?}: {e}"))?;
    serve(addr)
        .await
        .map(Some)
        .map_err(|e| format!("metrics_listen {addr}: {e}"))
}
