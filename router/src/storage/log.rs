//! The Raft log and vote in RocksDB. Appends are written at once and made
//! durable by a group WAL sync; an entry is reported flushed to openraft only
//! once it is on disk.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Condvar, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader, Vote};
use rocksdb::{DB, Direction, IteratorMode, WriteBatch};

use super::{
    CF_LOG, CF_RAFT_META, cf, decode, encode, get, index_key, put, put_unsynced, read_err, synced,
    write_err,
};
use crate::types::{Entry, LogId, NodeId, StorageError, TypeConfig};

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const LAST_PURGED: &[u8] = b"last_purged";

#[derive(Clone)]
pub struct LogStore {
    db: Arc<DB>,
    flusher: Arc<Flusher>,
}

/// Group fsync of the log: appends are written (readable at once) and
/// queue their callbacks; one thread syncs the WAL for everything queued so
/// far and then reports them all durable.
struct Flusher {
    pending: Mutex<Vec<LogFlushed<TypeConfig>>>,
    wake: Condvar,
}

impl Flusher {
    fn start(db: Arc<DB>) -> Arc<Self> {
        let flusher = Arc::new(Self {
            pending: Mutex::new(Vec::new()),
            wake: Condvar::new(),
        });
        let weak = Arc::downgrade(&flusher);
        // Weak: the thread must not keep the database open after its store.
        let db = Arc::downgrade(&db);
        std::thread::Builder::new()
            .name("raft-log-fsync".into())
            .spawn(move || {
                loop {
                    let Some(f) = weak.upgrade() else { return };
                    let waiting = {
                        let mut pending = f.pending.lock().expect("flush queue");
                        while pending.is_empty() {
                            let (p, timeout) = f
                                .wake
                                .wait_timeout(pending, std::time::Duration::from_millis(200))
                                .expect("flush queue");
                            pending = p;
                            if timeout.timed_out()
                                && pending.is_empty()
                                && Arc::strong_count(&f) == 1
                            {
                                return;
                            }
                        }
                        std::mem::take(&mut *pending)
                    };
                    drop(f);
                    let started = std::time::Instant::now();
                    let result = match db.upgrade() {
                        Some(db) => db.flush_wal(true).map_err(|e| e.to_string()),
                        None => Err("the log store is closed".to_string()),
                    };
                    crate::metrics::phases()
                        .log_sync
                        .observe(started.elapsed().as_secs_f64());
                    for callback in waiting {
                        callback.log_io_completed(result.clone().map_err(std::io::Error::other));
                    }
                }
            })
            .expect("log fsync thread");
        flusher
    }
}

impl LogStore {
    pub(super) fn new(db: Arc<DB>) -> Self {
        Self {
            flusher: Flusher::start(db.clone()),
            db,
        }
    }

    fn last_entry_id(&self) -> Result<Option<LogId>, StorageError> {
        match self
            .db
            .iterator_cf(cf(&self.db, CF_LOG), IteratorMode::End)
            .next()
        {
            Some(item) => {
                let (_, bytes) = item.map_err(read_err)?;
                Ok(Some(decode::<Entry>(&bytes)?.log_id))
            }
            None => Ok(None),
        }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i + 1,
            Bound::Unbounded => 0,
        };
        let from = index_key(start);
        let mut entries = Vec::new();
        for item in self.db.iterator_cf(
            cf(&self.db, CF_LOG),
            IteratorMode::From(&from, Direction::Forward),
        ) {
            let (key, bytes) = item.map_err(read_err)?;
            if !range.contains(&super::index_of(&key)) {
                break;
            }
            entries.push(decode(&bytes)?);
        }
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId> = get(&self.db, CF_RAFT_META, LAST_PURGED)?;
        let last_log_id = self.last_entry_id()?.or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        put(&self.db, CF_RAFT_META, VOTE, vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        get(&self.db, CF_RAFT_META, VOTE)
    }

    /// Not synced: openraft awaits this on every commit advance, in its core
    /// loop, so an fsync here would stall replication and leadership checks
    /// behind one disk flush per commit. The committed id only tells a
    /// restarted replica how far it may re-apply; the next WAL sync (of an
    /// append or a vote) makes it durable, and one lost to a power cut is an
    /// older committed id — the replica learns the current one from the
    /// leader.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        put_unsynced(&self.db, CF_RAFT_META, COMMITTED, &committed)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(get::<Option<LogId>>(&self.db, CF_RAFT_META, COMMITTED)?.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = WriteBatch::default();
        for entry in entries {
            batch.put_cf(
                cf(&self.db, CF_LOG),
                index_key(entry.log_id.index),
                encode(&entry),
            );
        }
        // Written now (readable when this returns), durable when the
        // flusher's next WAL sync reports it.
        if let Err(e) = self.db.write(batch) {
            callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
            return Err(write_err(e));
        }
        self.flusher
            .pending
            .lock()
            .expect("flush queue")
            .push(callback);
        self.flusher.wake.notify_one();
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(
            cf(&self.db, CF_LOG),
            index_key(log_id.index),
            index_key(u64::MAX),
        );
        batch.delete_cf(cf(&self.db, CF_LOG), index_key(u64::MAX));
        self.db.write_opt(batch, &synced()).map_err(write_err)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        put(&self.db, CF_RAFT_META, LAST_PURGED, &log_id)?;
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(
            cf(&self.db, CF_LOG),
            index_key(0),
            index_key(log_id.index + 1),
        );
        self.db.write_opt(batch, &synced()).map_err(write_err)
    }
}
