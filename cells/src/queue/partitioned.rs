//! The embedded event log as releases before 0.2.0 wrote it, kept for a
//! deployment whose cluster version has not reached
//! [`OUTBOX_QUEUE`](cellmesh_proto::version::OUTBOX_QUEUE): the relay copies
//! the outbox into partitions of the cell's RocksDB (`queue` column
//! family), offsets per consumer group in `queue_offsets`, so a cell can go
//! back to the release before at any time. Publishing goes through the
//! group committer like every other write. It serves the cell's consumer
//! groups (the fan-out processor, the search indexer); entries are trimmed
//! once every group named at open has processed them. A cell that starts
//! after the finalize reads the outbox in place ([`super::embedded`]),
//! draining what is left here first.

use cellmesh_proto::ids::ConversationId;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellmesh_proto::storage::v1::QueuedEvent;
use tokio::sync::Notify;

use super::{Delivery, EventConsumer, EventQueue, QueueError, last_offsets, partition_of};
use crate::storage::{Mutation, Store};

/// Trim a partition, or the outbox, every this many processed offsets.
pub(super) const TRIM_EVERY: u64 = 4_096;

pub struct PartitionedQueue {
    store: Arc<Store>,
    partitions: u32,
    /// Last offset written per partition.
    last: Mutex<Vec<u64>>,
    published: Arc<Notify>,
    /// The groups that must have processed an entry before it is trimmed.
    groups: Arc<[String]>,
}

impl PartitionedQueue {
    /// Trims only what every one of `groups` has processed (by default,
    /// what the group committing has).
    pub fn with_groups(mut self, groups: Vec<String>) -> Self {
        self.groups = groups.into();
        self
    }

    pub fn open(store: Arc<Store>, partitions: u32) -> Result<Self, QueueError> {
        let partitions = partitions.max(1);
        let last = (0..partitions)
            .map(|p| store.queue_last_offset(p))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            store,
            partitions,
            last: Mutex::new(last),
            published: Arc::new(Notify::new()),
            groups: Arc::new([]),
        })
    }
}

#[tonic::async_trait]
impl EventQueue for PartitionedQueue {
    async fn publish(&self, events: Vec<QueuedEvent>) -> Result<(), QueueError> {
        if events.is_empty() {
            return Ok(());
        }
        let slot = self.store.reserve().await?;
        let ticket = {
            let mut last = self.last.lock().expect("queue offsets lock");
            let mut m = Mutation::new();
            for event in &events {
                let conversation = event.event.as_ref().map_or(0, |e| e.conversation_id);
                let p = partition_of(ConversationId(conversation), self.partitions);
                last[p as usize] += 1;
                m.put_queued(p, last[p as usize], event);
            }
            slot.submit(m)
        };
        ticket.wait().await?;
        self.published.notify_waiters();
        Ok(())
    }

    async fn consumer(&self, group: &str) -> Result<Box<dyn EventConsumer>, QueueError> {
        let positions = (0..self.partitions)
            .map(|p| Ok((p, self.store.queue_offset(group, p)?)))
            .collect::<Result<Vec<_>, QueueError>>()?;
        Ok(Box::new(PartitionedConsumer {
            store: self.store.clone(),
            group: group.to_string(),
            positions,
            published: self.published.clone(),
            next_partition: 0,
            others: self
                .groups
                .iter()
                .filter(|g| *g != group)
                .cloned()
                .collect(),
        }))
    }
}

struct PartitionedConsumer {
    store: Arc<Store>,
    group: String,
    /// Each partition with the last offset handed out.
    positions: Vec<(u32, u64)>,
    published: Arc<Notify>,
    /// Where the next poll starts, so no partition starves.
    next_partition: usize,
    /// The other groups whose positions bound a trim.
    others: Vec<String>,
}

impl PartitionedConsumer {
    fn read(&mut self, max: usize) -> Result<Vec<Delivery>, QueueError> {
        read_partitions(
            &self.store,
            &mut self.positions,
            &mut self.next_partition,
            max,
        )
    }
}

/// Up to `max` entries after each partition's position, taken round-robin
/// from `*next` (which moves on, so no partition starves); the positions
/// move past what is handed out.
pub(super) fn read_partitions(
    store: &Store,
    positions: &mut [(u32, u64)],
    next: &mut usize,
    max: usize,
) -> Result<Vec<Delivery>, QueueError> {
    let n = positions.len();
    let mut out = Vec::new();
    for i in 0..n {
        if out.len() >= max {
            break;
        }
        let (p, after) = &mut positions[(*next + i) % n];
        for (offset, event) in store.queue_after(*p, *after, max - out.len())? {
            *after = offset;
            out.push(Delivery {
                partition: *p,
                offset,
                event,
            });
        }
    }
    *next = (*next + 1) % n.max(1);
    Ok(out)
}

/// Stages `group`'s position in `partition` at `offset`, and at every
/// [`TRIM_EVERY`] a trim of what every one of `others` has processed too.
pub(super) fn stage_position(
    store: &Store,
    group: &str,
    others: &[String],
    partition: u32,
    offset: u64,
    m: &mut Mutation,
) -> Result<(), QueueError> {
    let before = store.queue_offset(group, partition)?;
    m.put_queue_offset(group, partition, offset);
    if offset / TRIM_EVERY > before / TRIM_EVERY {
        let mut upto = offset;
        for other in others {
            upto = upto.min(store.queue_offset(other, partition)?);
        }
        m.trim_queue(partition, upto);
    }
    Ok(())
}

#[tonic::async_trait]
impl EventConsumer for PartitionedConsumer {
    async fn poll_or_woken(
        &mut self,
        max: usize,
        wait: Duration,
        wake: &Notify,
    ) -> Result<Vec<Delivery>, QueueError> {
        let published = self.published.clone();
        let notified = published.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let out = self.read(max)?;
        if !out.is_empty() {
            return Ok(out);
        }
        tokio::select! {
            _ = tokio::time::timeout(wait, notified) => {}
            _ = wake.notified() => {}
        }
        self.read(max)
    }

    async fn commit(&mut self, deliveries: &[Delivery]) -> Result<(), QueueError> {
        let mut m = Mutation::new();
        for (partition, offset) in last_offsets(deliveries) {
            stage_position(
                &self.store,
                &self.group,
                &self.others,
                partition,
                offset,
                &mut m,
            )?;
        }
        if !m.is_empty() {
            self.store.commit(m).await?;
        }
        Ok(())
    }
}
