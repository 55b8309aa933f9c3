//! The cell's durable state in RocksDB. This module (with its children) is
//! the only code that names RocksDB: the rest of the cell reads through the
//! domain methods of [`Store`] and writes by building a [`Mutation`] that the
//! group committer ([`commit`]) applies atomically with the WAL synced.

mod audit;
mod backup;
mod batch;
pub mod changes;
mod clear;
mod commit;
mod format;
pub mod keys;
mod manifest;
mod marks;
mod member_lists;
mod mirror;
pub mod moved;
mod options;
mod queue;
mod queue_ids;
mod receipts;
mod recent;
mod scan;
pub mod screen;
mod sync;
pub mod tally;
mod unsynced;
pub(crate) mod uploads;
mod wal_sync;
pub mod walk;

use crate::failpoints::FailPoints;
use cellmesh_proto::ids::{ConversationId, Seq, TenantId, UserId};
use std::path::Path;
use std::sync::Arc;

use cellmesh_proto::storage::v1::{
    ConversationRecord, ConversationSeq, IdempotencyRecord, MemberRecord, MessageRecord,
    OutboxEvent,
};
use prost::Message as _;
use rocksdb::{ColumnFamily, DB, Direction, IteratorMode, ReadOptions};

pub use backup::Queue;
use commit::Lane;
pub use commit::{CommitSlot, CommitStats, CommitTicket, Written};
pub use keys::IdemKind;
pub use manifest::PendingUpload;
pub use marks::Mark;
pub use scan::{EVERY_MESSAGE, ScanDirection, ScanPage, visible};
pub use sync::ForwardQueue;
pub use sync::new_queue_id;
pub use uploads::UploadWalk;

use crate::config::StorageConfig;
use keys::cf;

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("storage engine error: {0}")]
    Engine(#[from] rocksdb::Error),
    #[error("corrupt record in column family {cf}: {detail}")]
    Corrupt { cf: &'static str, detail: String },
    #[error("storage refuses writes after an unrecoverable write error: {0}")]
    Failed(String),
    #[error("storage is closed")]
    Closed,
    /// The data dir's key layout is not one this build reads or upgrades.
    #[error("{0}")]
    Format(String),
}

pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// A raw key and value read from a column family.
type KeyValue = (Box<[u8]>, Box<[u8]>);

/// Identity of an idempotent request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdemKey {
    pub kind: IdemKind,
    pub tenant: TenantId,
    pub user: UserId,
    pub client_req_id: String,
}

impl IdemKey {
    fn encode(&self) -> Vec<u8> {
        keys::idempotency(self.kind, self.tenant, self.user, &self.client_req_id)
    }
}

/// One atomic change: applied in a single WriteBatch together with its outbox
/// events, or not at all.
#[derive(Debug, Default)]
pub struct Mutation {
    ops: Vec<Op>,
    outbox: Vec<Vec<u8>>,
}

#[derive(Debug)]
pub(crate) enum Op {
    Put(&'static str, Vec<u8>, Vec<u8>),
    Delete(&'static str, Vec<u8>),
    Merge(&'static str, Vec<u8>, Vec<u8>),
    /// Deletes keys in [from, to).
    DeleteRange(&'static str, Vec<u8>, Vec<u8>),
}

/// Families written through the message lane only: the views in memory
/// apply their writes in the order the lanes report them, and two lanes
/// writing the same key at once may report in the other order than
/// RocksDB wrote (message rows, member keys, queue ids; read positions
/// only ever rise by merge, in any order).
const ONE_LANE: [&str; 3] = [cf::MESSAGES, cf::MEMBERS, cf::QUEUE_ID];

impl Op {
    /// The column family written.
    pub fn family(&self) -> &'static str {
        match self {
            Op::Put(name, ..)
            | Op::Delete(name, _)
            | Op::Merge(name, ..)
            | Op::DeleteRange(name, ..) => name,
        }
    }

    /// The key written (a range delete's first key).
    pub fn key(&self) -> &[u8] {
        match self {
            Op::Put(_, key, _)
            | Op::Delete(_, key)
            | Op::Merge(_, key, _)
            | Op::DeleteRange(_, key, _) => key,
        }
    }
}

impl Mutation {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty() && self.outbox.is_empty()
    }

    /// Keys written (puts, deletes, merges, outbox events).
    pub fn len(&self) -> usize {
        self.ops.len() + self.outbox.len()
    }

    fn put(&mut self, cf: &'static str, key: impl Into<Vec<u8>>, value: Vec<u8>) {
        self.ops.push(Op::Put(cf, key.into(), value));
    }

    pub fn put_meta_u64(&mut self, key: &[u8], value: u64) {
        self.put(cf::META, key.to_vec(), value.to_be_bytes().to_vec());
    }

    pub fn put_conversation(&mut self, id: ConversationId, record: &ConversationRecord) {
        self.put(
            cf::CONVERSATIONS,
            keys::u64_key(id.get()),
            record.encode_to_vec(),
        );
    }

    pub fn put_conv_seq(&mut self, id: ConversationId, record: &ConversationSeq) {
        self.put(
            cf::CONV_SEQ,
            keys::u64_key(id.get()),
            record.encode_to_vec(),
        );
    }

    pub fn put_member(
        &mut self,
        conversation: ConversationId,
        user: UserId,
        record: &MemberRecord,
    ) {
        let key = keys::member(conversation, user);
        self.put(cf::MEMBERS, key, record.encode_to_vec());
    }

    pub fn delete_member(&mut self, conversation: ConversationId, user: UserId) {
        let key = keys::member(conversation, user).to_vec();
        self.ops.push(Op::Delete(cf::MEMBERS, key));
    }

    pub fn put_message(&mut self, conversation: ConversationId, seq: u64, record: &MessageRecord) {
        let key = keys::message(conversation, Seq(seq));
        self.put(cf::MESSAGES, key, record.encode_to_vec());
    }

    pub fn put_idempotency(&mut self, key: &IdemKey, record: &IdempotencyRecord) {
        self.put(cf::IDEMPOTENCY, key.encode(), record.encode_to_vec());
    }

    /// Raises (never lowers) a user's read position in a conversation.
    pub fn raise_read_seq(&mut self, conversation: ConversationId, user: UserId, seq: u64) {
        let key = keys::member(conversation, user).to_vec();
        let value = seq.to_be_bytes().to_vec();
        self.ops.push(Op::Merge(cf::READ_STATE, key, value));
    }

    pub fn hide(&mut self, conversation: ConversationId, user: UserId, seq: u64) {
        self.put(
            cf::HIDDEN,
            keys::hidden(conversation, user, Seq(seq)),
            Vec::new(),
        );
    }

    /// Appends an event to the outbox; the committer assigns its id.
    pub fn emit(&mut self, event: &OutboxEvent) {
        self.outbox.push(event.encode_to_vec());
    }
}

/// The cell's database.
pub struct Store {
    db: Arc<DB>,
    committer: commit::Committer,
    failpoints: Arc<FailPoints>,
    changes: Arc<changes::Changes>,
    /// Read counts and first screens, kept up by every commit.
    views: Arc<mirror::Views>,
    /// Users whose queues the fan-out lane appended to, until durable.
    unsynced: Arc<unsynced::Unsynced>,
    /// Counts seals of keys handed over by a move (see [`moved`]), from 1
    /// when the store opened holding handed-over homes: what a cache of
    /// per-user state must drop when it changes, and 0 while no home here
    /// can be a stale copy.
    handovers: std::sync::atomic::AtomicU64,
}

impl Store {
    /// Opens (creating if needed) the database under `dir`, upgrading an
    /// older key layout (see [`format`]), and starts the group committer.
    pub fn open(dir: &Path, config: &StorageConfig) -> Result<Arc<Self>> {
        let db = options::open(dir, config)?;
        format::ensure(&db)?;
        let db = Arc::new(db);
        let failpoints = Arc::new(FailPoints::default());
        let changes = Arc::new(changes::Changes::new());
        let views = Arc::new(mirror::Views::default());
        let unsynced = Arc::new(unsynced::Unsynced::default());
        let committer = commit::Committer::start(
            db.clone(),
            config,
            failpoints.clone(),
            changes.clone(),
            views.clone(),
            unsynced.clone(),
        )?;
        let store = Arc::new(Self {
            db,
            committer,
            failpoints,
            changes,
            views,
            unsynced,
            handovers: Default::default(),
        });
        if store.holds_handed_over_homes()? {
            store.note_handover();
        }
        Ok(store)
    }

    /// How many times keys were sealed here for a move, so far (see the
    /// field).
    pub fn handovers(&self) -> u64 {
        self.handovers.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Records that keys were just sealed here for a move.
    pub fn note_handover(&self) {
        (self.handovers).fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// What changed, for the rounds of a tenant move.
    pub fn changes(&self) -> &changes::Changes {
        &self.changes
    }

    /// Read counts kept up to date (see [`tally`]).
    pub(crate) fn read_tallies(&self) -> &tally::ReadTallies {
        &self.views.tallies
    }

    /// This cell's fault-injection points (inert without the `failpoints`
    /// feature).
    pub fn failpoints(&self) -> &Arc<FailPoints> {
        &self.failpoints
    }

    /// Flushes and compacts the message column family (benchmarks measure
    /// the disk a tiering pass gives back).
    pub fn compact(&self) {
        let _ = self.db.flush();
        self.db
            .compact_range_cf(self.cf(cf::MESSAGES), None::<&[u8]>, None::<&[u8]>);
    }

    /// Bytes of the message column family's SST files (the hot tier on
    /// disk, after a flush).
    pub fn message_bytes(&self) -> u64 {
        self.db
            .property_int_value_cf(self.cf(cf::MESSAGES), "rocksdb.total-sst-files-size")
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    /// Stops accepting writes, waits for queued ones and flushes every
    /// family's memtables, so that the next open replays no log.
    pub fn close(&self) {
        self.committer.stop();
        let families: Vec<_> = cf::ALL.iter().map(|name| self.cf(name)).collect();
        if let Err(e) = self
            .db
            .flush_cfs_opt(&families, &rocksdb::FlushOptions::default())
        {
            tracing::warn!(error = %e, "memtables not flushed at close: the next open replays the log");
        }
    }

    pub fn stats(&self) -> &CommitStats {
        self.committer.stats()
    }

    /// Whether a write has failed and the store refuses further writes.
    pub fn failed(&self) -> Option<String> {
        self.committer.failed()
    }

    /// Applies `mutation` durably, in the message lane.
    pub async fn commit(&self, mutation: Mutation) -> Result<()> {
        self.reserve().await?.submit(mutation).wait().await
    }

    /// Applies the fan-out processor's `mutation` durably, in its own lane
    /// (see [`commit`](self::commit)); one with outbox events goes through the message
    /// lane, which numbers them, and so does one that writes a family of
    /// [`ONE_LANE`].
    pub async fn commit_fan_out(&self, mutation: Mutation) -> Result<()> {
        let one_lane = (mutation.ops.iter()).any(|op| ONE_LANE.contains(&op.family()));
        let lane = if mutation.outbox.is_empty() && !one_lane {
            Lane::FanOut
        } else {
            Lane::Message
        };
        let slot = self.committer.reserve(lane).await?;
        slot.submit(mutation).wait().await
    }

    /// Reserves a place in the message lane's queue, so that a caller
    /// holding a lock can enqueue without waiting (see
    /// [`CommitSlot::submit`]).
    pub async fn reserve(&self) -> Result<CommitSlot> {
        self.committer.reserve(Lane::Message).await
    }

    fn cf(&self, name: &'static str) -> &ColumnFamily {
        self.db
            .cf_handle(name)
            .expect("every column family is created at open")
    }

    fn get_record<T: prost::Message + Default>(
        &self,
        name: &'static str,
        key: &[u8],
    ) -> Result<Option<T>> {
        match self.db.get_pinned_cf(self.cf(name), key)? {
            None => Ok(None),
            Some(bytes) => decode_record(name, &bytes).map(Some),
        }
    }

    pub fn conversation(&self, id: ConversationId) -> Result<Option<ConversationRecord>> {
        self.get_record(cf::CONVERSATIONS, &keys::u64_key(id.get()))
    }

    /// Conversation records with ids above `after`, by id.
    pub fn conversations_after(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, ConversationRecord)>> {
        let lower = keys::u64_key(after.saturating_add(1)).to_vec();
        self.records(
            cf::CONVERSATIONS,
            lower,
            keys::u64_key(u64::MAX).to_vec(),
            limit,
        )
    }

    /// The conversation's seq state; zeroes for a conversation never written to.
    pub fn conv_seq(&self, id: ConversationId) -> Result<ConversationSeq> {
        Ok(self
            .get_record(cf::CONV_SEQ, &keys::u64_key(id.get()))?
            .unwrap_or_default())
    }

    pub fn is_member(&self, conversation: ConversationId, user: UserId) -> Result<bool> {
        if let Some(list) = self.views.member_lists.peek(conversation) {
            return Ok(list.binary_search(&user.get()).is_ok());
        }
        let key = keys::member(conversation, user);
        Ok(self.db.get_pinned_cf(self.cf(cf::MEMBERS), key)?.is_some())
    }

    /// Every member of `conversation`, ascending: from memory for a
    /// conversation of at most [`member_lists::MAX_LIST`] members read
    /// before (kept exact by the commit lanes), else from storage.
    pub fn member_list(&self, conversation: ConversationId) -> Result<Arc<[u64]>> {
        (self.views.member_lists).get(conversation, || {
            Ok(self.members(conversation, 0, usize::MAX)?.0)
        })
    }

    /// Members with ids above `after`, at most `limit`; and whether more follow.
    pub fn members(
        &self,
        conversation: ConversationId,
        after: u64,
        limit: usize,
    ) -> Result<(Vec<u64>, bool)> {
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(keys::member(conversation, UserId(u64::MAX)).to_vec());
        let start = keys::member(conversation, UserId(after.saturating_add(1)));
        let iter = self.db.iterator_cf_opt(
            self.cf(cf::MEMBERS),
            opts,
            IteratorMode::From(&start, Direction::Forward),
        );
        let mut out = Vec::new();
        for item in iter {
            let (key, _) = item?;
            if out.len() == limit {
                return Ok((out, true));
            }
            out.push(keys::last_u64(&key).ok_or_else(|| corrupt(cf::MEMBERS, "short key"))?);
        }
        Ok((out, false))
    }

    /// Stages a replicated copy of a conversation's meta: its record and
    /// exactly the members listed (a member added here joins when the
    /// conversation was created).
    pub fn stage_meta(
        &self,
        m: &mut Mutation,
        conversation: ConversationId,
        record: &ConversationRecord,
        members: &[UserId],
    ) -> Result<()> {
        m.put_conversation(conversation, record);
        let (current, _) = self.members(conversation, 0, usize::MAX)?;
        for user in current.iter().filter(|&&u| !members.contains(&UserId(u))) {
            m.delete_member(conversation, UserId(*user));
        }
        for user in members.iter().filter(|u| !current.contains(&u.get())) {
            m.put_member(
                conversation,
                *user,
                &MemberRecord {
                    joined_at_ms: record.created_at_ms,
                },
            );
        }
        Ok(())
    }

    pub fn message(&self, conversation: ConversationId, seq: u64) -> Result<Option<MessageRecord>> {
        let key = keys::message(conversation, Seq(seq));
        match self.views.recent.get(&key) {
            Some(row) => decode_record(cf::MESSAGES, &row).map(Some),
            None => self.get_record(cf::MESSAGES, &key),
        }
    }

    pub fn idempotency(&self, key: &IdemKey) -> Result<Option<IdempotencyRecord>> {
        self.get_record(cf::IDEMPOTENCY, &key.encode())
    }

    pub fn read_seq(&self, conversation: ConversationId, user: UserId) -> Result<u64> {
        self.get_u64(cf::READ_STATE, &keys::member(conversation, user))
    }

    /// Outbox events with ids above `after`, oldest first, up to the last
    /// one the message lane published. It publishes after updating the
    /// caches its commit changed (a conversation's members, users' queue
    /// ids), so an event is never planned from those caches as they were
    /// before it: a join read as a leave, say.
    pub fn outbox_after(&self, after: u64, limit: usize) -> Result<Vec<(u64, OutboxEvent)>> {
        let published = self.committer.outbox_published();
        if published <= after {
            return Ok(Vec::new());
        }
        let lower = keys::u64_key(after + 1).to_vec();
        let upper = keys::u64_key(published.saturating_add(1)).to_vec();
        self.records(cf::OUTBOX, lower, upper, limit)
    }

    /// Signalled after every commit that appended outbox events.
    pub fn outbox_signal(&self) -> Arc<tokio::sync::Notify> {
        self.committer.outbox_signal()
    }

    /// The id of the last outbox event made durable, watched: every
    /// receiver sees each change, so any number of consumers can wait on it.
    pub fn outbox_written(&self) -> tokio::sync::watch::Receiver<u64> {
        self.committer.outbox_written()
    }

    /// The id of the last outbox event made durable, counting every event
    /// a reader can already see: an empty commit through the message lane
    /// (which numbers the events) waits out the batches before it.
    pub async fn outbox_settled(&self) -> Result<u64> {
        self.commit(Mutation::new()).await?;
        Ok(*self.committer.outbox_written().borrow())
    }

    fn get_u64(&self, name: &'static str, key: &[u8]) -> Result<u64> {
        match self.db.get_pinned_cf(self.cf(name), key)? {
            None => Ok(0),
            Some(v) => keys::decode_u64(&v).ok_or_else(|| corrupt(name, "bad length")),
        }
    }

    /// Key/value pairs of `name` in [lower, upper), at most `limit`.
    fn range(
        &self,
        name: &'static str,
        lower: Vec<u8>,
        upper: Vec<u8>,
        limit: usize,
    ) -> Result<Vec<KeyValue>> {
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(upper);
        let iter = self.db.iterator_cf_opt(
            self.cf(name),
            opts,
            IteratorMode::From(&lower, Direction::Forward),
        );
        iter.take(limit)
            .map(|item| item.map_err(Into::into))
            .collect()
    }

    /// Records of `name` in [lower, upper) with the u64 that ends each key
    /// (an id, offset, pts or conversation), at most `limit`.
    fn records<T: prost::Message + Default>(
        &self,
        name: &'static str,
        lower: Vec<u8>,
        upper: Vec<u8>,
        limit: usize,
    ) -> Result<Vec<(u64, T)>> {
        self.range(name, lower, upper, limit)?
            .into_iter()
            .map(|(k, v)| {
                let id = keys::last_u64(&k).ok_or_else(|| corrupt(name, "short key"))?;
                Ok((id, T::decode(v.as_ref()).map_err(|e| corrupt(name, e))?))
            })
            .collect()
    }

    pub fn meta_u64(&self, key: &[u8]) -> Result<Option<u64>> {
        match self.db.get_pinned_cf(self.cf(cf::META), key)? {
            None => Ok(None),
            Some(v) => keys::decode_u64(&v)
                .map(Some)
                .ok_or_else(|| corrupt(cf::META, "bad length")),
        }
    }

    /// Writes a cell-level value outside the commit queue, synced.
    pub fn put_meta_u64_sync(&self, key: &[u8], value: u64) -> Result<()> {
        let mut opts = rocksdb::WriteOptions::default();
        opts.set_sync(true);
        self.db
            .put_cf_opt(self.cf(cf::META), key, value.to_be_bytes(), &opts)?;
        Ok(())
    }
}

/// A stored record of family `name`, decoded.
fn decode_record<T: prost::Message + Default>(name: &'static str, bytes: &[u8]) -> Result<T> {
    T::decode(bytes).map_err(|e| corrupt(name, e))
}

fn corrupt(cf: &'static str, detail: impl ToString) -> StorageError {
    StorageError::Corrupt {
        cf,
        detail: detail.to_string(),
    }
}

/// Small stores on temp dirs, for the storage tests.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::Arc;

    use super::{Mutation, Store};
    use crate::config::StorageConfig;

    pub fn config() -> StorageConfig {
        StorageConfig {
            block_cache_mb: 8,
            write_buffer_mb: 4,
            ..StorageConfig::default()
        }
    }

    /// A fresh store, and the directory that holds it.
    pub fn store() -> (tempfile::TempDir, Arc<Store>) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &config()).unwrap();
        (dir, store)
    }

    /// Commits `one` and `other` at once, one in each lane (which lane
    /// gets which alternates with `round`).
    pub async fn commit_racing(store: &Store, one: Mutation, other: Mutation, round: usize) {
        let (message, fan_out) = if round.is_multiple_of(2) {
            (one, other)
        } else {
            (other, one)
        };
        let (a, b) = tokio::join!(store.commit(message), store.commit_fan_out(fan_out));
        a.unwrap();
        b.unwrap();
    }
}
