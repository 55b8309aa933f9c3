//! The cell's event queue between the outbox and the fan-out processor.
//! Two backends behind one trait: the embedded log, which is the outbox in
//! the cell's RocksDB read in place (the default, [`embedded`]), and Kafka
//! (`kafka`), which the outbox relay publishes to. Events are
//! partitioned by conversation, so a conversation's events stay in order;
//! a consumer commits positions only after the effects of what it consumed
//! are durable, so a crash redelivers rather than loses.

pub mod embedded;
pub mod kafka;
pub mod partitioned;

use cellmesh_proto::ids::ConversationId;
use std::time::Duration;

use cellmesh_proto::storage::v1::QueuedEvent;
use tokio::sync::Notify;

use crate::storage::StorageError;

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("queue storage: {0}")]
    Storage(#[from] StorageError),
    #[error("kafka: {0}")]
    Kafka(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("malformed queue record: {0}")]
    Malformed(String),
}

/// One consumed event and where it sits in the queue.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub partition: u32,
    pub offset: u64,
    pub event: QueuedEvent,
}

#[tonic::async_trait]
pub trait EventQueue: Send + Sync + 'static {
    /// Appends events durably; returns once the queue holds them.
    async fn publish(&self, events: Vec<QueuedEvent>) -> Result<(), QueueError>;

    /// Whether consumers read the cell's outbox directly, so no relay
    /// copies it onto this queue.
    fn reads_outbox(&self) -> bool {
        false
    }

    /// Joins consumer group `group`.
    async fn consumer(&self, group: &str) -> Result<Box<dyn EventConsumer>, QueueError>;
}

#[tonic::async_trait]
pub trait EventConsumer: Send {
    /// Up to `max` events after this consumer's position, waiting at most
    /// `wait` for the first one, and no longer once `wake` is notified
    /// (the processor has other work waiting). Nothing is taken from the
    /// queue by a wait that ends empty.
    async fn poll_or_woken(
        &mut self,
        max: usize,
        wait: Duration,
        wake: &Notify,
    ) -> Result<Vec<Delivery>, QueueError>;

    /// [`Self::poll_or_woken`] with nothing to wake it.
    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<Delivery>, QueueError> {
        self.poll_or_woken(max, wait, &Notify::new()).await
    }

    /// Records `deliveries` as processed. Call only once their effects are
    /// durable.
    async fn commit(&mut self, deliveries: &[Delivery]) -> Result<(), QueueError>;

    /// Adds the record that `deliveries` are processed to `m`, the mutation
    /// that makes their effects durable, so both land in one commit; says
    /// whether it did (a queue that keeps positions elsewhere does not, and
    /// the caller then [`commit`](Self::commit)s after).
    fn stage_commit(
        &mut self,
        _deliveries: &[Delivery],
        _m: &mut crate::storage::Mutation,
    ) -> Result<bool, QueueError> {
        Ok(false)
    }
}

/// The partition of a conversation's events.
pub fn partition_of(conversation: ConversationId, partitions: u32) -> u32 {
    // Fibonacci hashing spreads sequential ids evenly.
    let h = conversation.get().wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((h >> 32) % u64::from(partitions.max(1))) as u32
}

/// The highest offset per partition among `deliveries`.
pub fn last_offsets(deliveries: &[Delivery]) -> std::collections::BTreeMap<u32, u64> {
    let mut out = std::collections::BTreeMap::new();
    for d in deliveries {
        let e = out.entry(d.partition).or_insert(d.offset);
        *e = (*e).max(d.offset);
    }
    out
}
