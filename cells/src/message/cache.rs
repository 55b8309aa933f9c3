//! In-memory state of the conversations being written to: the sequencer
//! state (latest assigned seq, floor) that must be read and bumped under one
//! lock, and a lock serialising the rare read-modify-write operations
//! (membership changes, recall, edit), with the membership changes queued
//! for it.
//!
//! An entry may run ahead of storage only while a send holds it (between seq
//! assignment and commit), so only entries nobody holds are evicted: a
//! reloaded entry then equals what storage has.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cellmesh_proto::storage::v1::SeqJump;
use cellmesh_proto::v1::ConversationKind;

pub(crate) struct ConvEntry {
    pub tenant: TenantId,
    pub kind: ConversationKind,
    pub seq: Mutex<SeqState>,
    pub admin: tokio::sync::Mutex<()>,
    /// Membership changes waiting for `admin`, applied together.
    pub member_changes: Mutex<super::members::MemberQueue>,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct SeqState {
    /// Highest seq assigned (possibly not yet durable).
    pub latest: u64,
    /// Seq must be assigned strictly above this.
    pub floor: u64,
    /// The conversation's floor jumps, stored with every seq write.
    pub jumps: Vec<SeqJump>,
}

impl ConvEntry {
    pub fn new(tenant: TenantId, kind: ConversationKind, seq: SeqState) -> Self {
        Self {
            tenant,
            kind,
            seq: Mutex::new(seq),
            admin: tokio::sync::Mutex::new(()),
            member_changes: Mutex::new(Default::default()),
        }
    }
}

const SHARDS: usize = 64;

pub(crate) struct ConvCache {
    shards: Vec<Mutex<HashMap<u64, Arc<ConvEntry>>>>,
    per_shard_capacity: usize,
}

impl ConvCache {
    pub fn new(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard_capacity: (capacity / SHARDS).max(16),
        }
    }

    /// The cached entry, or the one `load` builds from storage. The shard
    /// stays locked while loading so two loads of one conversation cannot race.
    pub fn get_or_load<E>(
        &self,
        id: ConversationId,
        load: impl FnOnce() -> Result<Option<ConvEntry>, E>,
    ) -> Result<Option<Arc<ConvEntry>>, E> {
        let mut shard = self.shards[id.get() as usize % SHARDS]
            .lock()
            .expect("cache shard");
        if let Some(entry) = shard.get(&id.get()) {
            return Ok(Some(entry.clone()));
        }
        let Some(entry) = load()? else {
            return Ok(None);
        };
        if shard.len() >= self.per_shard_capacity {
            // Keep only entries somebody is using; the rest reload cheaply.
            shard.retain(|_, e| Arc::strong_count(e) > 1);
        }
        let entry = Arc::new(entry);
        shard.insert(id.get(), entry.clone());
        Ok(Some(entry))
    }

    /// Forgets an entry so the next use reloads it from storage (after its
    /// history was imported by a migration).
    pub fn invalidate(&self, id: ConversationId) {
        self.shards[id.get() as usize % SHARDS]
            .lock()
            .expect("cache shard")
            .remove(&id.get());
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().expect("cache shard").len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Option<ConvEntry> {
        Some(ConvEntry::new(
            TenantId(1),
            ConversationKind::Group,
            SeqState::default(),
        ))
    }

    #[test]
    fn held_entries_survive_eviction() {
        let cache = ConvCache::new(0);
        let held: Vec<_> = (0..16u64)
            .map(|i| {
                cache
                    .get_or_load::<()>(ConversationId(i * SHARDS as u64), || Ok(entry()))
                    .unwrap()
                    .unwrap()
            })
            .collect();
        held[3].seq.lock().unwrap().latest = 42;
        // Filling the shard past capacity evicts nothing that is held.
        cache
            .get_or_load::<()>(ConversationId(99 * SHARDS as u64), || Ok(entry()))
            .unwrap();
        let again = cache
            .get_or_load::<()>(ConversationId(3 * SHARDS as u64), || {
                panic!("must not reload")
            })
            .unwrap()
            .unwrap();
        assert_eq!(again.seq.lock().unwrap().latest, 42);
    }

    #[test]
    fn unknown_conversations_are_not_cached() {
        let cache = ConvCache::new(1024);
        assert!(
            cache
                .get_or_load::<()>(ConversationId(5), || Ok(None))
                .unwrap()
                .is_none()
        );
        assert_eq!(cache.len(), 0);
    }
}
