//! Storage of the embedded event log (the outbox itself, plus the
//! partitioned log earlier releases relayed into, drained on upgrade),
//! consumer-group offsets, and how far the outbox is no longer needed.

use cellmesh_proto::storage::v1::{OutboxEvent, QueuedEvent};
use prost::Message as _;
use rocksdb::IteratorMode;

use super::keys::{self, cf};
use super::{Mutation, Op, Result, Store, corrupt};

impl Mutation {
    pub fn put_queued(&mut self, partition: u32, offset: u64, event: &QueuedEvent) {
        self.put(
            cf::QUEUE,
            keys::queue(partition, offset),
            event.encode_to_vec(),
        );
    }

    /// Drops a partition's entries below `offset`. The entry at `offset` stays
    /// so the partition's last offset survives a restart.
    pub fn trim_queue(&mut self, partition: u32, offset: u64) {
        let from = keys::queue(partition, 0).to_vec();
        let to = keys::queue(partition, offset).to_vec();
        self.ops.push(Op::DeleteRange(cf::QUEUE, from, to));
    }

    pub fn put_queue_offset(&mut self, group: &str, partition: u32, offset: u64) {
        let key = keys::queue_offset(group, partition);
        self.put(cf::QUEUE_OFFSETS, key, offset.to_be_bytes().to_vec());
    }

    /// Records that every outbox event up to `id` is no longer needed (each
    /// group processed it) and, when `trim`, drops those below `id`. The one
    /// at `id` stays, so the last id issued survives a restart.
    pub fn outbox_consumed(&mut self, id: u64, trim: bool) {
        let cursor = id.to_be_bytes().to_vec();
        self.put(cf::META, keys::meta::RELAY_CURSOR.to_vec(), cursor);
        if trim {
            let from = keys::u64_key(0).to_vec();
            let to = keys::u64_key(id).to_vec();
            self.ops.push(Op::DeleteRange(cf::OUTBOX, from, to));
        }
    }

    /// Records that the outbox events `ids` (ascending) are on the queue and
    /// drops them. Point deletes, not a range: range tombstones in the
    /// memtable are re-fragmented by every iterator and get expensive.
    pub fn relayed(&mut self, ids: &[u64]) {
        let Some(last) = ids.last() else {
            return;
        };
        let cursor = last.to_be_bytes().to_vec();
        self.put(cf::META, keys::meta::RELAY_CURSOR.to_vec(), cursor);
        for id in ids {
            self.ops
                .push(Op::Delete(cf::OUTBOX, keys::u64_key(*id).to_vec()));
        }
    }
}

impl Store {
    /// Entries of `partition` with offsets above `after`, oldest first.
    pub fn queue_after(
        &self,
        partition: u32,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, QueuedEvent)>> {
        let lower = keys::queue(partition, after.saturating_add(1)).to_vec();
        let upper = keys::queue(partition, u64::MAX).to_vec();
        self.records(cf::QUEUE, lower, upper, limit)
    }

    /// The highest offset ever written to `partition` (0 if none remain).
    pub fn queue_last_offset(&self, partition: u32) -> Result<u64> {
        let upper = keys::queue(partition, u64::MAX);
        let mut iter = self.db.iterator_cf(
            self.cf(cf::QUEUE),
            IteratorMode::From(&upper, rocksdb::Direction::Reverse),
        );
        match iter.next() {
            Some(item) => {
                let (k, _) = item?;
                if k.len() == 12 && k[..4] == partition.to_be_bytes() {
                    return keys::last_u64(&k).ok_or_else(|| corrupt(cf::QUEUE, "short key"));
                }
                Ok(0)
            }
            None => Ok(0),
        }
    }

    /// The last offset `group` processed in `partition`.
    pub fn queue_offset(&self, group: &str, partition: u32) -> Result<u64> {
        self.get_u64(cf::QUEUE_OFFSETS, &keys::queue_offset(group, partition))
    }

    /// The partitions of the partitioned log that still hold entries.
    pub fn queue_partitions(&self) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        let mut next = 0u32;
        loop {
            let from = keys::queue(next, 0);
            let mut iter = self.db.iterator_cf(
                self.cf(cf::QUEUE),
                IteratorMode::From(&from, rocksdb::Direction::Forward),
            );
            let Some(item) = iter.next() else {
                return Ok(out);
            };
            let (k, _) = item?;
            let partition = k
                .get(..4)
                .map(|p| u32::from_be_bytes(p.try_into().expect("four bytes")))
                .ok_or_else(|| corrupt(cf::QUEUE, "short key"))?;
            out.push(partition);
            match partition.checked_add(1) {
                Some(p) => next = p,
                None => return Ok(out),
            }
        }
    }

    pub fn relay_cursor(&self) -> Result<u64> {
        Ok(self.meta_u64(keys::meta::RELAY_CURSOR)?.unwrap_or(0))
    }
}

impl Store {
    /// Outbox events not yet relayed, oldest first.
    pub fn outbox_pending(&self, limit: usize) -> Result<Vec<(u64, OutboxEvent)>> {
        self.outbox_after(self.relay_cursor()?, limit)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Mutation, keys::cf, testing};
    use cellmesh_proto::storage::v1::OutboxEvent;
    use prost::Message as _;

    /// An outbox event reaches readers once the message lane published it
    /// (after updating the caches its commit changed), not as soon as
    /// RocksDB holds it: the processor would otherwise plan it from those
    /// caches as they were before (a join read as a leave).
    #[tokio::test]
    async fn outbox_readers_see_only_events_the_lane_published() {
        let (_dir, store) = testing::store();
        let event = |conversation_id| OutboxEvent {
            conversation_id,
            ..Default::default()
        };
        let mut m = Mutation::new();
        m.emit(&event(7));
        store.commit(m).await.unwrap();
        // Id 2 as the lane writes it, before it publishes it.
        let outbox = store.db.cf_handle(cf::OUTBOX).unwrap();
        (store.db)
            .put_cf(outbox, 2u64.to_be_bytes(), event(8).encode_to_vec())
            .unwrap();
        let seen = |after| {
            let read = store.outbox_after(after, 10).unwrap();
            read.into_iter()
                .map(|(id, e)| (id, e.conversation_id))
                .collect::<Vec<_>>()
        };
        assert_eq!(seen(0), [(1, 7)]);
        assert_eq!(seen(1), []);
        assert_eq!(store.outbox_pending(10).unwrap().len(), 1);
    }
}
