//! The embedded event log: the cell's outbox column family itself. A send's
//! commit is its publication: consumers read the outbox in id order (one
//! partition, [`OUTBOX_PARTITION`]), so no relay copies events and no second
//! write precedes the fan-out. Positions per consumer group live in
//! `queue_offsets`; once every group named at open has processed an event the
//! outbox no longer needs it (the relay cursor) and it is trimmed in ranges.
//!
//! Earlier releases relayed the outbox into a partitioned log (`queue`
//! column family); a consumer drains what is left there before it reads the
//! outbox, so an upgrade neither loses nor reorders an event.

use std::sync::Arc;
use std::time::Duration;

use cellmesh_proto::storage::v1::QueuedEvent;
use tokio::sync::{Notify, watch};

use super::partitioned::{TRIM_EVERY, read_partitions, stage_position};
use super::{Delivery, EventConsumer, EventQueue, QueueError, last_offsets};
use crate::failpoints::Action;
use crate::storage::{Mutation, Store};

/// The partition number deliveries from the outbox carry.
pub const OUTBOX_PARTITION: u32 = u32::MAX;

pub struct EmbeddedQueue {
    store: Arc<Store>,
    /// The groups that must have processed an event before it is dropped.
    groups: Arc<[String]>,
}

impl EmbeddedQueue {
    /// Drops only what every one of `groups` has processed (by default,
    /// what the group committing has).
    pub fn with_groups(mut self, groups: Vec<String>) -> Self {
        self.groups = groups.into();
        self
    }

    pub fn open(store: Arc<Store>) -> Result<Self, QueueError> {
        Ok(Self {
            store,
            groups: Arc::new([]),
        })
    }
}

#[tonic::async_trait]
impl EventQueue for EmbeddedQueue {
    /// Appends events to the outbox like any other writer; the committer
    /// numbers them (the events' own ids are not kept).
    async fn publish(&self, events: Vec<QueuedEvent>) -> Result<(), QueueError> {
        let mut m = Mutation::new();
        for event in events.iter().filter_map(|e| e.event.as_ref()) {
            m.emit(event);
        }
        if !m.is_empty() {
            self.store.commit(m).await?;
        }
        Ok(())
    }

    fn reads_outbox(&self) -> bool {
        true
    }

    async fn consumer(&self, group: &str) -> Result<Box<dyn EventConsumer>, QueueError> {
        let legacy = self
            .store
            .queue_partitions()?
            .into_iter()
            .map(|p| Ok((p, self.store.queue_offset(group, p)?)))
            .collect::<Result<Vec<_>, QueueError>>()?;
        Ok(Box::new(EmbeddedConsumer {
            position: outbox_position(&self.store, group)?,
            written: self.store.outbox_written(),
            store: self.store.clone(),
            group: group.to_string(),
            legacy,
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

/// Where `group` stands in the outbox: its own position, or the point up
/// to which the outbox was already handled (relayed into the partitioned
/// log by an earlier release, or processed by every group).
fn outbox_position(store: &Store, group: &str) -> Result<u64, QueueError> {
    let own = store.queue_offset(group, OUTBOX_PARTITION)?;
    Ok(own.max(store.relay_cursor()?))
}

struct EmbeddedConsumer {
    store: Arc<Store>,
    group: String,
    /// Last outbox id handed out.
    position: u64,
    written: watch::Receiver<u64>,
    /// Partitions of the earlier partitioned log with their last offset
    /// handed out; empty once drained (nothing is written there any more).
    legacy: Vec<(u32, u64)>,
    /// Where the next legacy read starts, so no partition starves.
    next_partition: usize,
    /// The other groups whose positions bound a trim.
    others: Vec<String>,
}

impl EmbeddedConsumer {
    fn read(&mut self, max: usize) -> Result<Vec<Delivery>, QueueError> {
        if self.store.failpoints().hit("queue.publish") == Some(Action::Error) {
            return Err(QueueError::Unavailable(
                "queue unavailable (fail point queue.publish)".into(),
            ));
        }
        if !self.legacy.is_empty() {
            let out = self.read_legacy(max)?;
            if !out.is_empty() {
                return Ok(out);
            }
            self.legacy.clear();
        }
        let mut out = Vec::new();
        for (id, event) in self.store.outbox_after(self.position, max)? {
            self.position = id;
            out.push(Delivery {
                partition: OUTBOX_PARTITION,
                offset: id,
                event: QueuedEvent {
                    id,
                    event: Some(event),
                },
            });
        }
        // Nothing waits between the outbox and the queue.
        self.store.stats().relayed_through(self.position);
        Ok(out)
    }

    fn read_legacy(&mut self, max: usize) -> Result<Vec<Delivery>, QueueError> {
        read_partitions(&self.store, &mut self.legacy, &mut self.next_partition, max)
    }
}

#[tonic::async_trait]
impl EventConsumer for EmbeddedConsumer {
    async fn poll_or_woken(
        &mut self,
        max: usize,
        wait: Duration,
        wake: &Notify,
    ) -> Result<Vec<Delivery>, QueueError> {
        // Marked seen before reading: a commit after the read wakes the wait.
        self.written.borrow_and_update();
        let out = self.read(max)?;
        if !out.is_empty() {
            return Ok(out);
        }
        tokio::select! {
            _ = tokio::time::timeout(wait, self.written.changed()) => {}
            _ = wake.notified() => {}
        }
        self.read(max)
    }

    async fn commit(&mut self, deliveries: &[Delivery]) -> Result<(), QueueError> {
        let mut m = Mutation::new();
        self.stage_commit(deliveries, &mut m)?;
        if !m.is_empty() {
            self.store.commit(m).await?;
        }
        Ok(())
    }

    fn stage_commit(
        &mut self,
        deliveries: &[Delivery],
        m: &mut Mutation,
    ) -> Result<bool, QueueError> {
        for (partition, offset) in last_offsets(deliveries) {
            if partition == OUTBOX_PARTITION {
                m.put_queue_offset(&self.group, partition, offset);
                self.consumed(m, offset)?;
                continue;
            }
            stage_position(&self.store, &self.group, &self.others, partition, offset, m)?;
        }
        Ok(true)
    }
}

impl EmbeddedConsumer {
    /// Moves the relay cursor to what every group has processed, once this
    /// group has processed up to `offset`, trimming at every
    /// [`TRIM_EVERY`]. Positions only grow, so a cursor computed from a
    /// stale read of another group's is lower than the truth, never higher.
    fn consumed(&self, m: &mut Mutation, offset: u64) -> Result<(), QueueError> {
        let before = self.store.relay_cursor()?;
        let mut upto = offset;
        for group in &self.others {
            upto = upto.min(outbox_position(&self.store, group)?);
        }
        if upto > before {
            m.outbox_consumed(upto, upto / TRIM_EVERY > before / TRIM_EVERY);
        }
        Ok(())
    }
}
