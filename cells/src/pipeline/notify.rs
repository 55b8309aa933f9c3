//! Notifications for users with no online device. With a webhook the
//! processor queues them durably, one record per fan-out batch
//! (`notify_batch` column family); this worker hands them to a sink — the
//! HTTP webhook (JSON POST, retried with backoff) — and deletes a batch
//! once each of its notifications is delivered or past its last attempt.
//! Without one the processor writes them to the log as it makes them
//! ([`direct_log`]): there is nothing to retry, so nothing to store.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cellmesh_proto::storage::v1::{NotificationBatch, NotificationRecord};
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
    async fn deliver(&self, notification: &NotificationRecord) -> Result<(), NotifyError>;
}

/// Why a notification was not delivered.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("invalid webhook url: {0}")]
    Url(#[from] hyper::http::uri::InvalidUri),
    #[error("webhook request: {0}")]
    Request(#[from] hyper::http::Error),
    #[error("webhook call: {0}")]
    Call(#[from] hyper_util::client::legacy::Error),
    #[error("webhook timed out")]
    TimedOut,
    #[error("webhook answered {0}")]
    Status(hyper::StatusCode),
    /// A sink that refused for its own reason (tests, other sinks).
    #[error("refused: {0}")]
    Refused(&'static str),
}

/// Writes each notification to the log: one debug line each (they come at
/// the rate of messages times offline members), and an info line with the
/// count at most every ten seconds.
#[derive(Default)]
pub struct LogSink {
    summary: Mutex<(u64, Option<Instant>)>,
}

const LOG_SUMMARY_EVERY: Duration = Duration::from_secs(10);

impl LogSink {
    /// Logs `n` (never fails).
    pub fn write(&self, n: &NotificationRecord) {
        tracing::debug!(
            user = n.user_id,
            tenant = n.tenant_id,
            conversation = n.conversation_id,
            seq = n.seq,
            sender = n.sender_id,
            "notification"
        );
        let mut summary = self.summary.lock().expect("summary lock");
        summary.0 += 1;
        let now = Instant::now();
        if summary.1.is_none_or(|at| now - at >= LOG_SUMMARY_EVERY) {
            tracing::info!(
                delivered = summary.0,
                "notifications written to the log (one debug line each)"
            );
            *summary = (0, Some(now));
        }
    }
}

#[tonic::async_trait]
impl NotificationSink for LogSink {
    async fn deliver(&self, n: &NotificationRecord) -> Result<(), NotifyError> {
        self.write(n);
        Ok(())
    }
}

/// The log the processor writes notifications to itself when no webhook
/// is configured (none: they are queued for the webhook).
pub fn direct_log(config: &NotificationsConfig) -> Option<Arc<LogSink>> {
    config
        .webhook_url
        .is_none()
        .then(|| Arc::new(LogSink::default()))
}

/// POSTs each notification as JSON to a URL; any 2xx is delivered.
pub struct WebhookSink {
    url: hyper::Uri,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl WebhookSink {
    pub fn new(url: &str) -> Result<Self, NotifyError> {
        Ok(Self {
            url: url.parse()?,
            client: Client::builder(TokioExecutor::new()).build_http(),
        })
    }
}

#[tonic::async_trait]
impl NotificationSink for WebhookSink {
    async fn deliver(&self, n: &NotificationRecord) -> Result<(), NotifyError> {
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
            .body(Full::new(Bytes::from(body)))?;
        let response = tokio::time::timeout(WEBHOOK_TIMEOUT, self.client.request(request))
            .await
            .map_err(|_| NotifyError::TimedOut)??;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(NotifyError::Status(response.status()))
        }
    }
}

/// The sink the config asks for (the log when none is configured).
pub fn sink(config: &NotificationsConfig) -> Arc<dyn NotificationSink> {
    match config.webhook_url.as_deref().map(WebhookSink::new) {
        Some(Ok(webhook)) => Arc::new(webhook),
        Some(Err(e)) => {
            tracing::error!(error = %e, "notifications go to the log");
            Arc::new(LogSink::default())
        }
        None => Arc::new(LogSink::default()),
    }
}

/// Delivers queued notifications until a storage error. Batches go in
/// order, and within a batch notifications go in order; one that fails is
/// retried with backoff (what is left of its batch is rewritten with its
/// attempt count) and holds back the rest, up to [`MAX_ATTEMPTS`].
pub async fn run(
    store: Arc<Store>,
    sink: Arc<dyn NotificationSink>,
    signal: Arc<Notify>,
) -> Result<(), PipelineError> {
    let mut backoff = Duration::from_millis(100);
    // Batches up to here are delivered or dropped (and deleted).
    let mut done_through = 0;
    loop {
        let pending = store.notifications(done_through, 16)?;
        if pending.is_empty() {
            let _ = tokio::time::timeout(Duration::from_secs(1), signal.notified()).await;
            continue;
        }
        let mut failed = false;
        for (id, batch) in pending {
            let mut m = Mutation::new();
            match deliver_batch(sink.as_ref(), batch).await {
                None => {
                    m.delete_notifications(id);
                    store.commit(m).await?;
                    done_through = id;
                }
                Some(rest) => {
                    m.put_notifications(id, &rest);
                    store.commit(m).await?;
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(30));
        } else {
            backoff = Duration::from_millis(100);
        }
    }
}

/// Delivers a batch in order; what is left after a failed attempt (the
/// failed notification first, its attempts counted), or `None` when all
/// are delivered or dropped after their last attempt.
async fn deliver_batch(
    sink: &dyn NotificationSink,
    batch: NotificationBatch,
) -> Option<NotificationBatch> {
    let mut rest = batch.notifications.into_iter();
    while let Some(mut n) = rest.next() {
        let Err(e) = sink.deliver(&n).await else {
            continue;
        };
        n.attempts += 1;
        if n.attempts >= MAX_ATTEMPTS {
            tracing::error!(tenant = n.tenant_id, user = n.user_id, error = %e, "notification dropped after retries");
            continue;
        }
        tracing::warn!(tenant = n.tenant_id, user = n.user_id, attempt = n.attempts, error = %e, "notification delivery failed");
        let notifications = std::iter::once(n).chain(rest).collect();
        return Some(NotificationBatch { notifications });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records what it is given; fails the calls whose numbers it holds.
    #[derive(Default)]
    struct Flaky {
        calls: Mutex<Vec<u64>>,
        fail: Vec<usize>,
    }

    #[tonic::async_trait]
    impl NotificationSink for Flaky {
        async fn deliver(&self, n: &NotificationRecord) -> Result<(), NotifyError> {
            let mut calls = self.calls.lock().unwrap();
            calls.push(n.user_id);
            if self.fail.contains(&calls.len()) {
                return Err(NotifyError::Refused("the test sink refuses this call"));
            }
            Ok(())
        }
    }

    fn batch(users: &[u64]) -> NotificationBatch {
        let notifications = users
            .iter()
            .map(|u| NotificationRecord {
                user_id: *u,
                ..Default::default()
            })
            .collect();
        NotificationBatch { notifications }
    }

    #[tokio::test]
    async fn a_failed_notification_keeps_itself_and_what_follows_only() {
        let sink = Flaky {
            fail: vec![2],
            ..Default::default()
        };
        let rest = deliver_batch(&sink, batch(&[1, 2, 3])).await.unwrap();
        let left: Vec<_> = rest.notifications.iter().map(|n| n.user_id).collect();
        assert_eq!(left, [2, 3], "the delivered one is not kept");
        assert_eq!(rest.notifications[0].attempts, 1);
        assert_eq!(rest.notifications[1].attempts, 0);
        assert!(deliver_batch(&sink, rest).await.is_none());
        assert_eq!(*sink.calls.lock().unwrap(), [1, 2, 2, 3]);
    }

    #[tokio::test]
    async fn a_notification_is_dropped_after_its_last_attempt() {
        let sink = Flaky {
            fail: vec![1],
            ..Default::default()
        };
        let mut last = batch(&[7, 8]);
        last.notifications[0].attempts = MAX_ATTEMPTS - 1;
        assert!(deliver_batch(&sink, last).await.is_none());
        assert_eq!(*sink.calls.lock().unwrap(), [7, 8], "the next one goes on");
    }
}
