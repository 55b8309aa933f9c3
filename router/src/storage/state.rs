//! The route-table state machine in RocksDB. Applying a batch of log entries
//! writes the changed table records, the batch's changes (for the watch
//! stream) and the applied log id in one WriteBatch; the in-memory
//! [`RouteTable`] is the read model lookups use. Snapshots carry the table and
//! the retained change history; history older than `watch_history` indices is
//! compacted when a snapshot is built.

use std::io::Cursor;
use std::sync::{Arc, RwLock};

use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use rocksdb::{DB, Direction, IteratorMode, WriteBatch};
use tokio::sync::watch;

use super::record::{SnapshotData, StoredSnapshot};
use super::{
    ALL_CFS, CF_CHANGES, CF_ROUTES, CF_SM_META, cf, decode, encode, get, index_key, index_of,
    read_err, synced, write_err,
};
use crate::table::{Change, RouteTable};
use crate::types::{
    Applied, Entry, LogId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};

const LAST_APPLIED: &[u8] = b"last_applied";
const MEMBERSHIP: &[u8] = b"membership";
const COMPACTED: &[u8] = b"compacted_through";
const SNAPSHOT: &[u8] = b"snapshot";

pub use cellmesh_route_client::client::WatchBatch;

/// The replica's route table, readable by the API while Raft applies to it.
pub struct RouteStore {
    db: Arc<DB>,
    table: RwLock<RouteTable>,
    inner: RwLock<Meta>,
    applied: watch::Sender<u64>,
    watch_history: u64,
    /// The newest watch batches, served without reading storage.
    recent: super::recent::Recent,
}

struct Meta {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    compacted_through: u64,
}

impl RouteStore {
    /// Flushes every family's memtables, so that the next open replays no
    /// log: called once Raft has stopped. A failure is logged (the next
    /// open replays the log instead).
    pub fn close(&self) {
        let families: Vec<_> = ALL_CFS.iter().map(|name| cf(&self.db, name)).collect();
        if let Err(e) = self
            .db
            .flush_cfs_opt(&families, &rocksdb::FlushOptions::default())
        {
            tracing::warn!(error = %e, "memtables not flushed at close: the next open replays the log");
        }
    }

    /// A copy of the table at one applied index.
    pub fn table(&self) -> RouteTable {
        self.table.read().expect("route table lock").clone()
    }

    /// Runs `f` over the current table without copying it.
    pub fn read<R>(&self, f: impl FnOnce(&RouteTable) -> R) -> R {
        f(&self.table.read().expect("route table lock"))
    }

    pub fn applied_index(&self) -> u64 {
        *self.applied.borrow()
    }

    /// Fires whenever the applied index moves.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }

    /// History at or below this index is gone; a watch from there restarts
    /// from a copy of the table.
    pub fn compacted_through(&self) -> u64 {
        self.inner.read().expect("meta lock").compacted_through
    }

    /// Up to `limit` change batches with index ≥ `from`, in order.
    pub fn changes_from(&self, from: u64, limit: usize) -> Result<Vec<WatchBatch>, StorageError> {
        if let Some(batches) = self.recent.since(from, limit) {
            return Ok(batches);
        }
        let start = index_key(from);
        let mut out = Vec::new();
        for item in self.db.iterator_cf(
            cf(&self.db, CF_CHANGES),
            IteratorMode::From(&start, Direction::Forward),
        ) {
            if out.len() >= limit {
                break;
            }
            let (key, bytes) = item.map_err(read_err)?;
            out.push((index_of(&key), decode(&bytes)?));
        }
        Ok(out)
    }

    /// The table and its history as a snapshot's data (what a follower
    /// installs): (applied index, bytes).
    pub fn snapshot_bytes(&self) -> Result<(u64, Vec<u8>), StorageError> {
        let (data, _, _) = self.snapshot_data()?;
        Ok((data.applied, encode(&data)))
    }

    fn snapshot_data(
        &self,
    ) -> Result<(SnapshotData, Option<LogId>, StoredMembership), StorageError> {
        // Compact the history first, then copy table and history under the
        // table lock so both describe one applied index.
        let table = self.table.read().expect("route table lock");
        let mut meta = self.inner.write().expect("meta lock");
        // Everything applied so far becomes durable before any log entry
        // it covers may be purged.
        self.db.flush_wal(true).map_err(write_err)?;
        let keep_from = table.applied.saturating_sub(self.watch_history);
        if keep_from > meta.compacted_through {
            let mut batch = WriteBatch::default();
            batch.delete_range_cf(
                cf(&self.db, CF_CHANGES),
                index_key(0),
                index_key(keep_from + 1),
            );
            batch.put_cf(cf(&self.db, CF_SM_META), COMPACTED, encode(&keep_from));
            self.db.write_opt(batch, &synced()).map_err(write_err)?;
            meta.compacted_through = keep_from;
        }
        let history = self.changes_from(meta.compacted_through + 1, usize::MAX)?;
        Ok((
            SnapshotData {
                applied: table.applied,
                table: table.as_changes(),
                history,
                compacted_through: meta.compacted_through,
            },
            meta.last_applied,
            meta.membership.clone(),
        ))
    }
}

/// The openraft state machine over a shared [`RouteStore`].
#[derive(Clone)]
pub struct StateMachine {
    store: Arc<RouteStore>,
}

impl StateMachine {
    pub(super) fn open(db: Arc<DB>, watch_history: u64) -> Result<Self, StorageError> {
        let last_applied: Option<LogId> =
            get::<Option<LogId>>(&db, CF_SM_META, LAST_APPLIED)?.flatten();
        let membership: StoredMembership = get(&db, CF_SM_META, MEMBERSHIP)?.unwrap_or_default();
        let compacted_through: u64 = get(&db, CF_SM_META, COMPACTED)?.unwrap_or(0);
        let mut table = RouteTable::default();
        for item in db.iterator_cf(cf(&db, CF_ROUTES), IteratorMode::Start) {
            let (_, bytes) = item.map_err(read_err)?;
            table.apply_change(&decode::<Change>(&bytes)?);
        }
        table.applied = last_applied.map_or(0, |l| l.index);
        let table_applied = table.applied;
        let (applied, _) = watch::channel(table.applied);
        Ok(Self {
            store: Arc::new(RouteStore {
                db,
                table: RwLock::new(table),
                inner: RwLock::new(Meta {
                    last_applied,
                    membership,
                    compacted_through,
                }),
                recent: super::recent::Recent::new(table_applied + 1),
                applied,
                watch_history,
            }),
        })
    }

    pub fn store(&self) -> Arc<RouteStore> {
        self.store.clone()
    }
}

/// Where a change's record lives in the routes column family; `None` for a
/// removal's key.
fn record_key(change: &Change) -> Vec<u8> {
    match change {
        Change::Cell(cell) => [b"c/".as_slice(), cell.id.as_bytes()].concat(),
        Change::Route(entry) => route_key(&entry.key),
        Change::Removed(key) => route_key(key),
        Change::ClusterVersion(_) => b"v/cluster".to_vec(),
    }
}

fn route_key(key: &crate::table::Key) -> Vec<u8> {
    let scope = match key.scope {
        crate::table::Scope::Tenant => [0u8; 9],
        crate::table::Scope::Conversation(c) => {
            let mut b = [1u8; 9];
            b[1..].copy_from_slice(&c.to_be_bytes());
            b
        }
        crate::table::Scope::User(u) => {
            let mut b = [2u8; 9];
            b[1..].copy_from_slice(&u.to_be_bytes());
            b
        }
    };
    [b"r/".as_slice(), &key.tenant.to_be_bytes(), &scope].concat()
}

fn put_change(db: &DB, batch: &mut WriteBatch, change: &Change) -> Result<(), StorageError> {
    let key = record_key(change);
    match change {
        Change::Removed(_) => batch.delete_cf(cf(db, CF_ROUTES), key),
        _ => batch.put_cf(cf(db, CF_ROUTES), key, encode(change)),
    }
    Ok(())
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let (data, last_applied, membership) = self.store.snapshot_data()?;
        let bytes = encode(&data);
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership: membership,
            snapshot_id: format!(
                "{}-{}",
                data.applied,
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis())
            ),
        };
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: bytes.clone(),
        };
        super::put(&self.store.db, CF_SM_META, SNAPSHOT, &stored)?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let meta = self.store.inner.read().expect("meta lock");
        Ok((meta.last_applied, meta.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let started = std::time::Instant::now();
        let db = &self.store.db;
        let mut table = self.store.table.write().expect("route table lock");
        let mut meta = self.store.inner.write().expect("meta lock");
        let mut batch = WriteBatch::default();
        let mut responses = Vec::new();
        let mut watched = Vec::new();
        for entry in entries {
            let index = entry.log_id.index;
            let results: Vec<_> = match &entry.payload {
                EntryPayload::Blank => Vec::new(),
                EntryPayload::Normal(commands) => {
                    commands.0.iter().map(|c| table.apply(c, index)).collect()
                }
                EntryPayload::Membership(m) => {
                    meta.membership = StoredMembership::new(Some(entry.log_id), m.clone());
                    Vec::new()
                }
            };
            table.applied = index;
            // The entry's changes, in command order, are one watch batch.
            let changes: Vec<Change> = results
                .iter()
                .filter_map(|r| r.as_ref().ok())
                .flatten()
                .cloned()
                .collect();
            if !changes.is_empty() {
                for change in &changes {
                    put_change(db, &mut batch, change)?;
                }
                batch.put_cf(cf(db, CF_CHANGES), index_key(index), encode(&changes));
                watched.push((index, changes));
            }
            meta.last_applied = Some(entry.log_id);
            responses.push(Applied { index, results });
        }
        batch.put_cf(cf(db, CF_SM_META), LAST_APPLIED, encode(&meta.last_applied));
        batch.put_cf(cf(db, CF_SM_META), MEMBERSHIP, encode(&meta.membership));
        // Not synced: the applied id travels in the same batch, so a power
        // loss only rewinds the state machine to a point the (synced) log
        // replays from. Snapshots sync the WAL before the log is purged.
        db.write(batch).map_err(write_err)?;
        self.store.recent.push(watched);
        let applied = table.applied;
        drop(meta);
        drop(table);
        self.store.applied.send_replace(applied);
        crate::metrics::phases()
            .apply
            .observe(started.elapsed().as_secs_f64());
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let bytes = snapshot.into_inner();
        let data: SnapshotData = decode(&bytes)?;
        let db = &self.store.db;
        let mut table = RouteTable::default();
        let mut batch = WriteBatch::default();
        for c in [CF_ROUTES, CF_CHANGES] {
            batch.delete_range_cf(cf(db, c), &[0u8; 0][..], &[0xffu8; 32][..]);
        }
        for change in &data.table {
            table.apply_change(change);
            put_change(db, &mut batch, change)?;
        }
        for (index, changes) in &data.history {
            batch.put_cf(cf(db, CF_CHANGES), index_key(*index), encode(changes));
        }
        table.applied = meta.last_log_id.map_or(0, |l| l.index);
        batch.put_cf(cf(db, CF_SM_META), LAST_APPLIED, encode(&meta.last_log_id));
        batch.put_cf(
            cf(db, CF_SM_META),
            MEMBERSHIP,
            encode(&meta.last_membership),
        );
        batch.put_cf(
            cf(db, CF_SM_META),
            COMPACTED,
            encode(&data.compacted_through),
        );
        batch.put_cf(
            cf(db, CF_SM_META),
            SNAPSHOT,
            encode(&StoredSnapshot {
                meta: meta.clone(),
                data: bytes.clone(),
            }),
        );
        let mut current = self.store.table.write().expect("route table lock");
        let mut m = self.store.inner.write().expect("meta lock");
        db.write_opt(batch, &synced()).map_err(write_err)?;
        let applied = table.applied;
        // The batches it kept describe another history now.
        self.store.recent.reset(applied + 1);
        *current = table;
        m.last_applied = meta.last_log_id;
        m.membership = meta.last_membership.clone();
        m.compacted_through = data.compacted_through;
        drop(m);
        drop(current);
        self.store.applied.send_replace(applied);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let stored: Option<StoredSnapshot> = get(&self.store.db, CF_SM_META, SNAPSHOT)?;
        Ok(stored.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(Cursor::new(s.data)),
        }))
    }
}
