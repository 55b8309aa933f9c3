//! Sync events the fan-out lane has written but not yet seen synced. That
//! lane writes without a sync of its own (see [`super::wal_sync`]), and
//! RocksDB shows a write to readers as soon as it is in the memtable: for
//! up to a sync, a user's queue would show events a power loss could take
//! back, and the processor might then give their pts to other events. So
//! the lane holds each user of its batch at the pts below the batch's
//! first for them until the batch is durable, and readers of a user's
//! queue stop there. One batch is in flight at a time.

use std::sync::Mutex;

use super::keys::{self, cf};
use super::{Mutation, Op};
use crate::user::UserKey;

/// The first 16 bytes of a `sync` key: its owner (tenant, user).
type Owner = [u8; 16];

#[derive(Default)]
pub(super) struct Unsynced {
    /// (owner, the highest pts readers may see), sorted by owner: the
    /// users of the batch being synced.
    held: Mutex<Vec<(Owner, u64)>>,
}

impl Unsynced {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Owner, u64)>> {
        self.held.lock().expect("unsynced sync events")
    }

    /// Holds readers of every user whose queue `mutations` append to below
    /// what they append, until [`Self::release`]. (A batch that fails
    /// stays held: the store refuses every later write.)
    pub(super) fn hold<'a>(&self, mutations: impl Iterator<Item = &'a Mutation>) {
        let mut below: Vec<(Owner, u64)> = mutations
            .flat_map(|m| &m.ops)
            .filter_map(|op| match op {
                Op::Put(family, key, _) if *family == cf::SYNC => Some((
                    Owner::try_from(key.get(..16)?).ok()?,
                    keys::last_u64(key)?.saturating_sub(1),
                )),
                _ => None,
            })
            .collect();
        if below.is_empty() {
            return;
        }
        // Each owner's lowest first.
        below.sort_unstable();
        below.dedup_by_key(|(owner, _)| *owner);
        *self.lock() = below;
    }

    /// The batch held is durable.
    pub(super) fn release(&self) {
        self.lock().clear();
    }

    /// The highest pts of `user`'s queue a reader may see now, if held.
    pub(super) fn limit(&self, user: UserKey) -> Option<u64> {
        let owner = keys::user(user);
        let held = self.lock();
        let at = held.binary_search_by(|(o, _)| o.cmp(&owner)).ok()?;
        Some(held[at].1)
    }
}
