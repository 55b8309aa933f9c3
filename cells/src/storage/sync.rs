//! Storage of what the sync service serves: per-user sync queues and their
//! pts, device cursors, conversation lists, mute flags (all keyed by
//! [`UserKey`]) and the notification and forward queues.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::storage::v1::{ConvListEntry, ForwardRecord, NotificationBatch, SyncRecord};
use prost::Message as _;

use super::keys::{self, cf};
use super::{Mutation, Op, Result, Store, corrupt};
use crate::user::UserKey;

/// A fresh, non-zero queue identity.
pub fn new_queue_id() -> u64 {
    rand::random::<u64>().max(1)
}

impl Mutation {
    pub fn put_sync(&mut self, user: UserKey, pts: u64, record: &SyncRecord) {
        self.put(cf::SYNC, keys::user_item(user, pts), record.encode_to_vec());
    }

    pub fn put_conv_list(
        &mut self,
        user: UserKey,
        conversation: ConversationId,
        entry: &ConvListEntry,
    ) {
        let key = keys::user_item(user, conversation.get());
        self.put(cf::CONV_LIST, key, entry.encode_to_vec());
    }

    pub fn set_muted(&mut self, user: UserKey, conversation: ConversationId, muted: bool) {
        let key = keys::user_item(user, conversation.get()).to_vec();
        if muted {
            self.put(cf::MUTED, key, vec![1]);
        } else {
            self.ops.push(Op::Delete(cf::MUTED, key));
        }
    }

    /// Raises (never lowers) a device's cursor.
    pub fn raise_device_cursor(&mut self, user: UserKey, device: &str, pts: u64) {
        let key = keys::device(user, device);
        self.ops.push(Op::Merge(
            cf::DEVICE_CURSOR,
            key,
            pts.to_be_bytes().to_vec(),
        ));
    }

    /// Records that notification ids up to `id` are issued (once per batch,
    /// with the notifications it queues).
    pub fn notifications_issued_through(&mut self, id: u64) {
        let value = id.to_be_bytes().to_vec();
        self.put(cf::META, keys::meta::NOTIFY_LAST_ID.to_vec(), value);
    }

    /// Queues a batch of notifications, or rewrites one (what is left of
    /// it, with attempt counts).
    pub fn put_notifications(&mut self, id: u64, batch: &NotificationBatch) {
        self.put(cf::NOTIFY, keys::u64_key(id), batch.encode_to_vec());
    }

    /// Records that forward ids of `queue` up to `id` are issued (once per
    /// batch).
    pub fn forwards_issued_through(&mut self, queue: ForwardQueue, id: u64) {
        let value = id.to_be_bytes().to_vec();
        self.put(cf::META, queue.last_id_key().to_vec(), value);
    }

    /// Queues events for another cell, or rewrites a queued record.
    pub fn put_forward(&mut self, id: u64, record: &ForwardRecord) {
        self.put(cf::FORWARD, keys::u64_key(id), record.encode_to_vec());
    }

    pub fn delete_forward(&mut self, id: u64) {
        self.ops
            .push(Op::Delete(cf::FORWARD, keys::u64_key(id).to_vec()));
    }

    /// Names `user`'s sync queue here (see [`Store::queue_id`]).
    pub fn set_queue_id(&mut self, user: UserKey, id: u64) {
        self.put(cf::QUEUE_ID, keys::user(user), id.to_be_bytes().to_vec());
    }

    pub fn delete_notifications(&mut self, id: u64) {
        self.ops
            .push(Op::Delete(cf::NOTIFY, keys::u64_key(id).to_vec()));
    }
}

impl Store {
    /// Sync events of `user` with pts above `after`, in order.
    pub fn sync_after(
        &self,
        user: UserKey,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, SyncRecord)>> {
        let held = self.unsynced.limit(user);
        if held.is_some_and(|last| last <= after) {
            return Ok(Vec::new());
        }
        let lower = keys::user_item(user, after.saturating_add(1)).to_vec();
        let upper = keys::user_item(user, held.map_or(u64::MAX, |last| last + 1)).to_vec();
        self.records(cf::SYNC, lower, upper, limit)
    }

    /// The event at `pts` of `user`'s queue, even one of a batch still
    /// waiting for its sync: what a conversation-list entry written in
    /// that same batch names (the entry is read without a hold). Not for
    /// numbering or pushing: those read through [`Self::sync_after`].
    pub fn sync_event(&self, user: UserKey, pts: u64) -> Result<Option<SyncRecord>> {
        self.get_record(cf::SYNC, &keys::user_item(user, pts))
    }

    /// The latest pts of `user`: the last key of their sync queue.
    pub fn user_pts(&self, user: UserKey) -> Result<u64> {
        let (from, to) = keys::user_items(user);
        let mut opts = rocksdb::ReadOptions::default();
        opts.set_iterate_lower_bound(from.to_vec());
        let mut iter = self.db.raw_iterator_cf_opt(self.cf(cf::SYNC), opts);
        iter.seek_for_prev(to);
        let pts = iter.key().and_then(keys::last_u64).unwrap_or(0);
        iter.status()?;
        Ok(self.unsynced.limit(user).map_or(pts, |last| pts.min(last)))
    }

    pub fn conv_list_entry(
        &self,
        user: UserKey,
        conversation: ConversationId,
    ) -> Result<Option<ConvListEntry>> {
        self.get_record(cf::CONV_LIST, &keys::user_item(user, conversation.get()))
    }

    /// Every conversation-list entry of `user`.
    pub fn conv_list(&self, user: UserKey) -> Result<Vec<(u64, ConvListEntry)>> {
        let (lower, upper) = keys::user_items(user);
        self.records(cf::CONV_LIST, lower.to_vec(), upper.to_vec(), usize::MAX)
    }

    pub fn muted(&self, user: UserKey, conversation: ConversationId) -> Result<bool> {
        let key = keys::user_item(user, conversation.get());
        Ok(self.db.get_pinned_cf(self.cf(cf::MUTED), key)?.is_some())
    }

    pub fn device_cursor(&self, user: UserKey, device: &str) -> Result<u64> {
        self.get_u64(cf::DEVICE_CURSOR, &keys::device(user, device))
    }

    /// The identity of `user`'s sync queue here (0: none yet). A queue
    /// started afresh (after a failover) has a new one, a copied queue
    /// (a user-home move) keeps it: a cursor is only meaningful in the
    /// queue it came from.
    pub fn queue_id(&self, user: UserKey) -> Result<u64> {
        let key = keys::user(user);
        (self.views.queue_ids).get(key, || self.get_u64(cf::QUEUE_ID, &key))
    }

    /// The users of `tenant` with a sync queue here.
    pub fn homes_of_tenant(&self, tenant: TenantId) -> Result<Vec<UserId>> {
        let lower = keys::pair_key(tenant.get(), 0).to_vec();
        let upper = match tenant.get().checked_add(1).map(TenantId) {
            Some(next) => keys::pair_key(next.get(), 0).to_vec(),
            None => vec![0xff; 17],
        };
        self.range(cf::QUEUE_ID, lower, upper, usize::MAX)?
            .into_iter()
            .map(|(k, _)| {
                let user = keys::last_u64(&k).ok_or_else(|| corrupt(cf::QUEUE_ID, "short key"))?;
                Ok(UserId(user))
            })
            .collect()
    }

    /// Every device cursor of `user`.
    pub fn device_cursors(&self, user: UserKey) -> Result<Vec<(String, u64)>> {
        let (lower, upper) = keys::devices_of(user);
        self.range(cf::DEVICE_CURSOR, lower, upper, usize::MAX)?
            .into_iter()
            .map(|(k, v)| {
                let device =
                    keys::device_of(&k).ok_or_else(|| corrupt(cf::DEVICE_CURSOR, "short key"))?;
                let device = String::from_utf8_lossy(device).into_owned();
                let pts =
                    keys::decode_u64(&v).ok_or_else(|| corrupt(cf::DEVICE_CURSOR, "bad length"))?;
                Ok((device, pts))
            })
            .collect()
    }

    /// Pending notification batches after id `after`, oldest first.
    /// Delivered ones are deleted, so a reader keeps its place instead of
    /// seeking from 0 over their tombstones.
    pub fn notifications(&self, after: u64, limit: usize) -> Result<Vec<(u64, NotificationBatch)>> {
        let (lower, upper) = (
            keys::u64_key(after.saturating_add(1)),
            keys::u64_key(u64::MAX),
        );
        self.records(cf::NOTIFY, lower.to_vec(), upper.to_vec(), limit)
    }

    /// Queued forwards of `queue` after id `after`, oldest first.
    pub fn forwards(
        &self,
        queue: ForwardQueue,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, ForwardRecord)>> {
        let (base, end) = queue.ids();
        let (lower, upper) = (
            keys::u64_key(after.max(base).saturating_add(1)),
            keys::u64_key(end),
        );
        self.records(cf::FORWARD, lower.to_vec(), upper.to_vec(), limit)
    }

    /// The highest id `queue` has issued (its base when none).
    pub fn forward_last_id(&self, queue: ForwardQueue) -> Result<u64> {
        Ok((self.meta_u64(queue.last_id_key())?).unwrap_or(queue.ids().0))
    }

    pub fn notify_last_id(&self) -> Result<u64> {
        Ok(self.meta_u64(keys::meta::NOTIFY_LAST_ID)?.unwrap_or(0))
    }
}

/// The two queues of events for other cells. They share a column family
/// but not ids (the standbys' ids have the top bit set), and each has its
/// own forwarder: the copies a cell ships to its standbys (meta, answers)
/// never hold up its users' events on their way to their home cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardQueue {
    /// Events for users whose home is another cell.
    Homes,
    /// Conversation meta and answers for this cell's standbys.
    Standbys,
}

impl ForwardQueue {
    const STANDBY_BASE: u64 = 1 << 63;

    /// Ids above the first, up to (not including) the second.
    fn ids(self) -> (u64, u64) {
        match self {
            Self::Homes => (0, Self::STANDBY_BASE),
            Self::Standbys => (Self::STANDBY_BASE, u64::MAX),
        }
    }

    fn last_id_key(self) -> &'static [u8] {
        match self {
            Self::Homes => keys::meta::FORWARD_LAST_ID,
            Self::Standbys => keys::meta::STANDBY_FORWARD_LAST_ID,
        }
    }
}
