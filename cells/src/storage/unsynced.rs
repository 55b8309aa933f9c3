//! Sync events the fan-out lane has written but not yet seen synced. That
//! lane writes without a sync of its own (see [`super::wal_sync`]), and
//! RocksDB shows a write to readers as soon as it is in the memtable: for
//! up to a sync, a user's queue would show events a power loss could take
//! back, and the processor might then give their pts to other events. So
//! the lane holds each user of its batch at the pts below the batch's
//! first for them until the batch is durable, and readers of a user's
//! queue stop there. One batch is in flight at a time.

use std::collections::HashMap;
use std::sync::Mutex;

use super::keys::{self, cf};
use super::{Mutation, Op};

/// The first 16 bytes of a `sync` key: its owner (tenant, user).
type Owner = [u8; 16];

#[derive(Default)]
pub(super) struct Unsynced {
    /// Owner → the highest pts readers may see.
    held: Mutex<HashMap<Owner, u64>>,
}

impl Unsynced {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Owner, u64>> {
        self.held.lock().expect("unsynced sync events")
    }

    /// Holds readers of every user whose queue `mutations` append to below
    /// what they append; returns the owners held, for [`Self::release`].
    pub(super) fn hold<'a>(&self, mutations: impl Iterator<Item = &'a Mutation>) -> Vec<Owner> {
        let mut below: HashMap<Owner, u64> = HashMap::new();
        for op in mutations.flat_map(|m| &m.ops) {
            let Op::Put(family, key, _) = op else {
                continue;
            };
            if *family != cf::SYNC {
                continue;
            }
            let (Some(owner), Some(pts)) = (
                key.get(..16).and_then(|k| Owner::try_from(k).ok()),
                keys::last_u64(key),
            ) else {
                continue;
            };
            let limit = below.entry(owner).or_insert(u64::MAX);
            *limit = (*limit).min(pts.saturating_sub(1));
        }
        if below.is_empty() {
            return Vec::new();
        }
        let owners = below.keys().copied().collect();
        self.lock().extend(below);
        owners
    }

    /// The batch that held `owners` is durable.
    pub(super) fn release(&self, owners: &[Owner]) {
        if owners.is_empty() {
            return;
        }
        let mut held = self.lock();
        for owner in owners {
            held.remove(owner);
        }
    }

    /// The highest pts of `owner`'s queue a reader may see now, if held.
    pub(super) fn limit(&self, owner: &[u8]) -> Option<u64> {
        let owner = Owner::try_from(owner.get(..16)?).ok()?;
        self.lock().get(&owner).copied()
    }
}
