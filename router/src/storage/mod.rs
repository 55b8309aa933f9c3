//! RocksDB storage of a RoutingService replica: the Raft log and vote
//! ([`LogStore`]) and the route-table state machine with its change history
//! ([`StateMachine`]), in one database with a column family per kind. The only
//! module of the router that names rocksdb.

// openraft's StorageError is large; every storage function returns it.
#![allow(clippy::result_large_err)]

mod log;
mod recent;
mod record;
mod seed;
mod state;

use std::path::Path;
use std::sync::Arc;

use openraft::{AnyError, StorageIOError};
use record::Record;
use rocksdb::{ColumnFamilyDescriptor, DB, DBCompressionType, IteratorMode, Options, WriteOptions};

pub use log::LogStore;
pub use seed::seed;
pub use state::{RouteStore, StateMachine, WatchBatch};

use crate::types::StorageError;

/// Raft log entries by big-endian index.
const CF_LOG: &str = "raft_log";
/// Vote, committed and purged log ids.
const CF_RAFT_META: &str = "raft_meta";
/// The route table: cells and route entries.
const CF_ROUTES: &str = "routes";
/// Changes by big-endian log index, for the watch stream.
const CF_CHANGES: &str = "changes";
/// Applied log id, membership, compaction point, current snapshot.
const CF_SM_META: &str = "sm_meta";

const ALL_CFS: [&str; 5] = [CF_LOG, CF_RAFT_META, CF_ROUTES, CF_CHANGES, CF_SM_META];

/// The record format this build writes (see [`record`]), kept beside the
/// vote so a database written in another format is refused at open, not
/// misread.
const FORMAT_KEY: &[u8] = b"format";
const FORMAT: &[u8] = b"cellmesh.raft.v1/protobuf";

/// Memtable size per family and the most write-ahead log kept.
struct Tuning {
    write_buffer_bytes: usize,
    max_wal_bytes: u64,
}

/// RocksDB's memtable size, and a log bound of 256 MiB: the vote and the
/// committed id are rewritten in place, so their family's memtable fills
/// slowly and would keep every later log file alive (up to four times all
/// memtables, gigabytes) for a restart to replay; past the bound the
/// families holding the oldest file are flushed.
const TUNING: Tuning = Tuning {
    write_buffer_bytes: 64 << 20,
    max_wal_bytes: 256 << 20,
};

/// Opens (creating if needed) a replica's database and returns its two halves.
pub fn open(dir: &Path, watch_history: u64) -> Result<(LogStore, StateMachine), StorageError> {
    open_tuned(dir, watch_history, &TUNING)
}

fn open_tuned(
    dir: &Path,
    watch_history: u64,
    tuning: &Tuning,
) -> Result<(LogStore, StateMachine), StorageError> {
    let mut options = Options::default();
    options.create_if_missing(true);
    options.create_missing_column_families(true);
    options.set_compression_type(DBCompressionType::None);
    options.set_max_total_wal_size(tuning.max_wal_bytes);
    let cfs = ALL_CFS.iter().map(|name| {
        let mut cf = Options::default();
        cf.set_compression_type(DBCompressionType::None);
        cf.set_write_buffer_size(tuning.write_buffer_bytes);
        ColumnFamilyDescriptor::new(*name, cf)
    });
    let db = DB::open_cf_descriptors(&options, dir, cfs).map_err(read_err)?;
    check_format(&db, dir)?;
    let db = Arc::new(db);
    Ok((
        LogStore::new(db.clone()),
        StateMachine::open(db, watch_history)?,
    ))
}

/// Stamps a new database with [`FORMAT`]; refuses one holding data in
/// another format.
fn check_format(db: &DB, dir: &Path) -> Result<(), StorageError> {
    let meta = cf(db, CF_RAFT_META);
    match db.get_cf(meta, FORMAT_KEY).map_err(read_err)? {
        Some(f) if f == FORMAT => Ok(()),
        found => {
            let empty = ALL_CFS.iter().all(|name| {
                db.iterator_cf(cf(db, name), IteratorMode::Start)
                    .next()
                    .is_none()
            });
            if !empty {
                let found = found.map_or("an unversioned (JSON) format".to_string(), |f| {
                    String::from_utf8_lossy(&f).into_owned()
                });
                return Err(read_err(std::io::Error::other(format!(
                    "router data dir {} holds records in {found}, this build reads {}: \
                     move it aside and add the replica again (it catches up from a snapshot)",
                    dir.display(),
                    String::from_utf8_lossy(FORMAT)
                ))));
            }
            db.put_cf_opt(meta, FORMAT_KEY, FORMAT, &synced())
                .map_err(write_err)
        }
    }
}

fn cf<'a>(db: &'a DB, name: &str) -> &'a rocksdb::ColumnFamily {
    db.cf_handle(name).expect("column family opened at start")
}

fn synced() -> WriteOptions {
    let mut w = WriteOptions::default();
    w.set_sync(true);
    w
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn index_of(key: &[u8]) -> u64 {
    u64::from_be_bytes(key[..8].try_into().expect("8-byte index key"))
}

fn encode<T: Record>(value: &T) -> Vec<u8> {
    value.to_bytes()
}

fn decode<T: Record>(bytes: &[u8]) -> Result<T, StorageError> {
    T::from_bytes(bytes).map_err(read_err)
}

fn get<T: Record>(db: &DB, cf_name: &str, key: &[u8]) -> Result<Option<T>, StorageError> {
    match db.get_cf(cf(db, cf_name), key).map_err(read_err)? {
        Some(bytes) => Ok(Some(decode(&bytes)?)),
        None => Ok(None),
    }
}

fn put<T: Record>(db: &DB, cf_name: &str, key: &[u8], value: &T) -> Result<(), StorageError> {
    db.put_cf_opt(cf(db, cf_name), key, encode(value), &synced())
        .map_err(write_err)
}

/// A write made durable by the next WAL sync, not by this one.
fn put_unsynced<T: Record>(
    db: &DB,
    cf_name: &str,
    key: &[u8],
    value: &T,
) -> Result<(), StorageError> {
    db.put_cf(cf(db, cf_name), key, encode(value))
        .map_err(write_err)
}

fn read_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::read(AnyError::new(&e)).into()
}

fn write_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write(AnyError::new(&e)).into()
}

#[cfg(test)]
mod tests;
