//! The read-only web console each control-plane replica serves: one page
//! (regions as columns, cells as boxes coloured by health, migrations as
//! arrows with their progress, router replicas) that polls `/api/status`,
//! the same JSON object `cellmesh ctl status --json` prints, refreshed by a
//! background [`Sampler`](crate::status::Sampler). With a trace store
//! configured (`traces_url`), the page also draws the most recent traced
//! send as a waterfall across processes, read through `/api/traces`.
//! With a `console_token`, every page but `/healthz` asks for it (HTTP
//! basic, any user name, the token as password — what a browser prompts
//! for — or `Authorization: Bearer`): 401 without it.

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

/// Whether `authorization` (a request's header) carries `token`.
fn presents(authorization: Option<&str>, token: &str) -> bool {
    use base64::Engine as _;
    let Some(value) = authorization else {
        return false;
    };
    let given = if let Some(bearer) = value.strip_prefix("Bearer ") {
        bearer.as_bytes().to_vec()
    } else if let Some(basic) = value.strip_prefix("Basic ") {
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(basic.trim()) else {
            return false;
        };
        match decoded.iter().position(|b| *b == b':') {
            Some(at) => decoded[at + 1..].to_vec(),
            None => return false,
        }
    } else {
        return false;
    };
    given.len() == token.len()
        && given
            .iter()
            .zip(token.as_bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

async fn require_token(
    State(token): State<std::sync::Arc<str>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if presents(authorization, &token) {
        return next.run(request).await;
    }
    (
        axum::http::StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Basic realm=\"cellmesh console\"")],
        "the console asks for its token",
    )
        .into_response()
}

/// Serves the console on `listen` until the task is aborted; returns the
/// bound address (port 0 picks one). A non-empty `token` is asked of every
/// page but `/healthz`.
pub async fn serve(
    listen: SocketAddr,
    latest: watch::Receiver<Value>,
    traces: String,
    token: String,
) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let mut pages = Router::new()
        .route("/", get(index))
        .route("/api/status", get(status))
        .route("/api/traces", get(recent_traces))
        .route("/api/traces/{id}", get(trace))
        .with_state(Console { latest, traces });
    if !token.is_empty() {
        pages = pages.layer(axum::middleware::from_fn_with_state(
            std::sync::Arc::<str>::from(token),
            require_token,
        ));
    }
    let app = pages.route("/healthz", get(|| async { "ok" }));
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "console stopped");
        }
    });
    Ok((addr, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_taken_as_basic_password_or_bearer() {
        use base64::Engine as _;
        let token = "a-console-token-16";
        let basic = |s: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(s)
            )
        };
        assert!(presents(Some(&basic("ops:a-console-token-16")), token));
        assert!(presents(Some(&basic(":a-console-token-16")), token));
        assert!(presents(Some("Bearer a-console-token-16"), token));
        assert!(!presents(Some(&basic("ops:a-console-token-17")), token));
        assert!(!presents(Some("Bearer a-console-token"), token));
        assert!(!presents(Some("Basic !!!"), token));
        assert!(!presents(None, token));
    }

    #[tokio::test]
    async fn a_console_with_a_token_asks_for_it() {
        let (_tx, latest) = watch::channel(serde_json::json!({"cells": []}));
        let (addr, task) = serve(
            "127.0.0.1:0".parse().unwrap(),
            latest,
            String::new(),
            "a-console-token-16".into(),
        )
        .await
        .unwrap();
        let get = |path: &str, auth: Option<&str>| {
            let url = format!("http://{addr}{path}");
            let auth = auth.map(str::to_string);
            async move {
                let mut request = hyper::Request::get(&url);
                if let Some(auth) = auth {
                    request = request.header("authorization", auth);
                }
                let client = hyper_util::client::legacy::Client::builder(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .build_http::<http_body_util::Empty<bytes::Bytes>>();
                client
                    .request(request.body(http_body_util::Empty::new()).unwrap())
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            }
        };
        assert_eq!(get("/api/status", None).await, 401);
        assert_eq!(get("/", Some("Bearer wrong-token-of-16b")).await, 401);
        assert_eq!(
            get("/api/status", Some("Bearer a-console-token-16")).await,
            200
        );
        assert_eq!(get("/healthz", None).await, 200);
        task.abort();
    }
}
