//! The outbox relay: moves outbox events, in outbox order, onto a queue
//! that does not read the outbox itself (Kafka),
//! then records how far it got and drops what it moved. A crash between the
//! two steps republishes the tail; the processor skips what it already
//! applied.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cellmesh_proto::storage::v1::QueuedEvent;

use cellmesh_telemetry::trace::{follow, traceparent};

use super::PipelineError;
use crate::failpoints::Action;
use crate::queue::{EventQueue, QueueError};
use crate::storage::{Mutation, Store};

/// Outbox events moved per round.
const RELAY_BATCH: usize = 1_024;

/// Relays until an error.
pub async fn run(store: Arc<Store>, queue: Arc<dyn EventQueue>) -> Result<(), PipelineError> {
    let signal = store.outbox_signal();
    loop {
        let pending = store.outbox_pending(RELAY_BATCH)?;
        if pending.is_empty() {
            let written = store.stats().outbox_written.load(Ordering::Relaxed);
            store.stats().relayed_through(written);
            // Woken by the committer; the timeout is only a safety net.
            let _ = tokio::time::timeout(Duration::from_secs(1), signal.notified()).await;
            continue;
        }
        let ids: Vec<u64> = pending.iter().map(|(id, _)| *id).collect();
        // A sampled write's trace gains a span for its move onto the queue.
        let mut spans = Vec::new();
        let events = pending
            .into_iter()
            .map(|(id, mut event)| {
                if !event.traceparent.is_empty() {
                    let span = tracing::info_span!(
                        "relay",
                        conv_id = event.conversation_id,
                        seq = event.seq
                    );
                    if follow(&span, &event.traceparent) {
                        event.traceparent = traceparent(&span);
                        spans.push(span);
                    }
                }
                QueuedEvent {
                    id,
                    event: Some(event),
                }
            })
            .collect();
        if store.failpoints().hit("queue.publish") == Some(Action::Error) {
            return Err(PipelineError::Queue(QueueError::Unavailable(
                "queue unavailable (fail point queue.publish)".into(),
            )));
        }
        queue.publish(events).await?;
        drop(spans);
        let mut m = Mutation::new();
        m.relayed(&ids);
        store.commit(m).await?;
        if let Some(last) = ids.last() {
            store.stats().relayed_through(*last);
        }
    }
}
