//! Notifications for users with no online device: the processor queues them
//! durably (`notify` column family); this worker hands them to a sink — an
//! HTTP webhook (JSON POST, retried with backoff) or the log — and deletes
//! each once delivered or after its last attempt.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cellmesh_proto::storage::v1::NotificationRecord;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Notify;

use super::PipelineError;
use crate::config::NotificationsConfig;
use crate::storage::{Mutation, Store};

/// Attempts per notification before it is dropped (and logged).
pub const MAX_ATTEMPTS: u32 = 8;
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(5);

#[tonic::async_trait]
pub trait NotificationSink: Send + Sync + 'static {
    async fn deliver(&self, notification: &NotificationRecord) -> Result<(), String>;
}

/// Writes each notification to the log.
pub struct LogSink;

#[tonic::async_trait]
impl NotificationSink for LogSink {
    async fn deliver(&self, n: &NotificationRecord) -> Result<(), String> {
        tracing::info!(
            user = n.user_id,
            tenant = n.tenant_id,
            conversation = n.conversation_id,
            seq = n.seq,
            sender = n.sender_id,
            "notification"
        );
        Ok(())
    }
}

/// POSTs each notification as JSON to a URL; any 2xx is delivered.
pub struct WebhookSink {
    url: hyper::Uri,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl WebhookSink {
    pub fn new(url: &str) -> Result<Self, String> {
        Ok(Self {
            url: url
                .parse()
                .map_err(|e| format!("invalid webhook url: {e}"))?,
            client: Client::builder(TokioExecutor::new()).build_http(),
        })
    }
}

#[tonic::async_trait]
impl NotificationSink for WebhookSink {
    async fn deliver(&self, n: &NotificationRecord) -> Result<(), String> {
        let body = serde_json::json!({
            "user_id": n.user_id,
            "tenant_id": n.tenant_id,
            "conversation_id": n.conversation_id,
            "seq": n.seq,
            "msg_id": n.msg_id,
            "sender_id": n.sender_id,
            "created_at_ms": n.created_at_ms,
        })
        .to_string();
        let request = hyper::Request::post(self.url.clone())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let response = tokio::time::timeout(WEBHOOK_TIMEOUT, self.client.request(request))
            .await
            .map_err(|_| "webhook timed out".to_string())?
            .map_err(|e| e.to_string())?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(format!("webhook answered {}", response.status()))
        }
    }
}

/// The sink the config asks for (the log when none is configured).
pub fn sink(config: &NotificationsConfig) -> Arc<dyn NotificationSink> {
    match config.webhook_url.as_deref().map(WebhookSink::new) {
        Some(Ok(webhook)) => Arc::new(webhook),
        Some(Err(e)) => {
            tracing::error!(error = %e, "notifications go to the log");
            Arc::new(LogSink)
        }
        None => Arc::new(LogSink),
    }
}

/// Delivers queued notifications until a storage error.
pub async fn run(
    store: Arc<Store>,
    sink: Arc<dyn NotificationSink>,
    signal: Arc<Notify>,
) -> Result<(), PipelineError> {
    let mut backoff = Duration::from_millis(100);
    loop {
        let pending = store.notifications(128)?;
        if pending.is_empty() {
            let _ = tokio::time::timeout(Duration::from_secs(1), signal.notified()).await;
            continue;
        }
        let mut m = Mutation::new();
        let mut failed = false;
        for (id, mut n) in pending {
            match sink.deliver(&n).await {
                Ok(()) => m.delete_notification(id),
                Err(e) => {
                    n.attempts += 1;
                    if n.attempts >= MAX_ATTEMPTS {
                        tracing::error!(user = n.user_id, error = %e, "notification dropped after retries");
                        m.delete_notification(id);
                    } else {
                        tracing::warn!(user = n.user_id, attempt = n.attempts, error = %e, "notification delivery failed");
                        m.put_notification(id, &n);
                        failed = true;
                        break;
                    }
                }
            }
        }
        store.commit(m).await?;
        if failed {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(30));
        } else {
            backoff = Duration::from_millis(100);
        }
    }
}
