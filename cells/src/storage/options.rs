//! How the cell's RocksDB is opened: column families, their tuning, the
//! read-state merge operator and the idempotency TTL compaction filter.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use cellmesh_proto::storage::v1::IdempotencyRecord;
use prost::Message as _;
use rocksdb::compaction_filter::Decision;
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, DBCompressionType, MergeOperands, Options,
};

use super::Result;
use super::keys::{cf, decode_u64};
use crate::config::StorageConfig;

/// Families read by key on the message and fan-out paths.
const POINT_LOOKUPS: [&str; 6] = [
    cf::IDEMPOTENCY,
    cf::MUTED,
    cf::CONV_LIST,
    cf::MEMBERS,
    cf::READ_STATE,
    cf::QUEUE_ID,
];

pub(super) fn open(dir: &Path, config: &StorageConfig) -> Result<DB> {
    let cache = Cache::new_lru_cache(config.block_cache_mb * 1024 * 1024);
    let mut db_opts = Options::default();
    db_opts.create_if_missing(true);
    db_opts.create_missing_column_families(true);
    db_opts.increase_parallelism(2);
    db_opts.set_max_background_jobs(2);
    db_opts.set_keep_log_file_num(4);
    // The two commit lanes write at once: RocksDB groups them for the WAL
    // and inserts their batches into the memtables in parallel. (Pipelined
    // writes measured slower here.)
    db_opts.set_allow_concurrent_memtable_write(true);
    // A family written once in a while would otherwise keep every log
    // file since alive (up to four times all memtables, gigabytes), and a
    // restart after a crash would replay them all.
    db_opts.set_max_total_wal_size(config.max_wal_mb as u64 * 1024 * 1024);

    let descriptors = cf::ALL.iter().map(|name| {
        let mut opts = Options::default();
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&cache);
        table.set_bloom_filter(10.0, false);
        opts.set_block_based_table_factory(&table);
        opts.set_compression_type(DBCompressionType::Lz4);
        opts.set_write_buffer_size(config.write_buffer_mb * 1024 * 1024);
        if POINT_LOOKUPS.contains(name) {
            // Most lookups here miss the memtable (a new request id, a
            // conversation nobody muted): a bloom filter answers them
            // without a skiplist search.
            opts.set_memtable_prefix_bloom_ratio(0.05);
            opts.set_memtable_whole_key_filtering(true);
        }
        // Before the callbacks: the hinted options are a copy made from
        // a string, which does not keep the callbacks' owners alive.
        let mut opts = with_insert_hints(name, opts);
        match *name {
            cf::READ_STATE | cf::DEVICE_CURSOR | cf::HIGH_WATER_MARKS => {
                opts.set_merge_operator_associative("max_u64", merge_max_u64)
            }
            cf::IDEMPOTENCY => {
                opts.set_compaction_filter("idempotency_ttl", drop_expired_idempotency);
                // Rewrite files at least daily so expired records go away even
                // when nothing else triggers a compaction.
                opts.set_periodic_compaction_seconds(24 * 3600);
            }
            _ => {}
        }
        ColumnFamilyDescriptor::new(*name, opts)
    });
    // Families this version no longer uses (RocksDB refuses to open a
    // database without all of them): opened with defaults, left alone.
    let retired: Vec<ColumnFamilyDescriptor> = DB::list_cf(&db_opts, dir)
        .unwrap_or_default()
        .into_iter()
        .filter(|name| name != "default" && !cf::ALL.contains(&name.as_str()))
        .map(|name| ColumnFamilyDescriptor::new(name, Options::default()))
        .collect();
    Ok(DB::open_cf_descriptors(
        &db_opts,
        dir,
        descriptors.chain(retired),
    )?)
}

/// Memtable inserts of one family keep a position per key prefix and
/// start there: a user's sync events and list entries, a conversation's
/// messages, each land next to the previous one of the same prefix, so a
/// fan-out's inserts skip most of the skiplist search (the largest single
/// cost of a busy cell). The prefix is the key's owner: (tenant, user)
/// for per-user families (after the kind for answers), the conversation
/// for messages. Families that rewrite the same keys over and over (a
/// conversation's seq, a member's read position, a user's list entry of
/// one conversation) use the whole key: a key's new version goes just
/// before its last one, so the hint needs no search at all. (The outbox,
/// written in key order, needs none: an insert without a hint starts
/// where the last one ended.) RocksDB keeps one hint per prefix a memtable
/// holds, outside the memtable's size: at most one per key here.
fn with_insert_hints(name: &str, opts: Options) -> Options {
    let prefix = match name {
        cf::CONV_LIST => 24,
        cf::SYNC | cf::DEVICE_CURSOR | cf::READ_STATE => 16,
        cf::IDEMPOTENCY => 17,
        cf::MESSAGES | cf::CONV_SEQ => 8,
        _ => return opts,
    };
    let hint = format!("memtable_insert_with_hint_prefix_extractor=rocksdb.FixedPrefix.{prefix}");
    let mut base = opts;
    match base.get_options_from_string(&hint) {
        Ok(hinted) => hinted,
        Err(e) => {
            tracing::warn!(family = name, error = %e, "memtable insert hints unavailable");
            base
        }
    }
}

/// Merge operator of `read_state`, `device_cursor` and `high_water_marks`:
/// the value is the largest u64 ever written, so a read position or a mark
/// cannot move backwards whatever the order of writes.
fn merge_max_u64(
    _key: &[u8],
    existing: Option<&[u8]>,
    operands: &MergeOperands,
) -> Option<Vec<u8>> {
    let max = existing
        .into_iter()
        .chain(operands.iter())
        .filter_map(decode_u64)
        .max()
        .unwrap_or(0);
    Some(max.to_be_bytes().to_vec())
}

/// Compaction filter of `idempotency`: drops records past their expiry.
fn drop_expired_idempotency(_level: u32, _key: &[u8], value: &[u8]) -> Decision {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    match IdempotencyRecord::decode(value) {
        Ok(record) if record.expires_at_ms <= now_ms => Decision::Remove,
        _ => Decision::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{IdemKey, IdemKind, Mutation, Store, testing};
    use super::cf;
    use crate::config::StorageConfig;
    use cellmesh_proto::ids::{TenantId, UserId};
    use cellmesh_proto::storage::v1::IdempotencyRecord;
    use std::time::{Duration, Instant};

    /// RocksDB's record of the options each family was opened with: the
    /// newest OPTIONS file (it keeps the last two; their numbers are
    /// zero-padded, so the largest name is the newest).
    fn options_file(dir: &std::path::Path) -> String {
        let mut found = Vec::new();
        let mut dirs = vec![dir.to_path_buf()];
        while let Some(d) = dirs.pop() {
            for entry in std::fs::read_dir(&d).unwrap().flatten() {
                let path = entry.path();
                let name = entry.file_name().to_string_lossy().into_owned();
                if path.is_dir() {
                    dirs.push(path);
                } else if name.starts_with("OPTIONS-") && !name.ends_with(".dbtmp") {
                    found.push((name, path));
                }
            }
        }
        let (_, newest) = found.into_iter().max().expect("an OPTIONS file");
        std::fs::read_to_string(newest).unwrap()
    }

    /// Each family's section of an OPTIONS file.
    fn section<'a>(options: &'a str, family: &str) -> &'a str {
        let head = format!("[CFOptions \"{family}\"]");
        let start = options.find(&head).expect("the family's section") + head.len();
        let rest = &options[start..];
        &rest[..rest.find("\n[").unwrap_or(rest.len())]
    }

    /// The families written per owner insert next to the owner's last
    /// key (its prefix), those rewriting the same keys next to the key's
    /// last version (the whole key), the others without a hint.
    #[test]
    fn families_written_per_owner_insert_with_their_owners_prefix() {
        let (dir, _store) = testing::store();
        let options = options_file(dir.path());
        let hint = |family| {
            section(&options, family)
                .lines()
                .find_map(|l| {
                    l.trim()
                        .strip_prefix("memtable_insert_with_hint_prefix_extractor=")
                })
                .map(str::to_string)
        };
        for (family, prefix) in [
            (cf::SYNC, 16),
            (cf::CONV_LIST, 24),
            (cf::DEVICE_CURSOR, 16),
            (cf::IDEMPOTENCY, 17),
            (cf::MESSAGES, 8),
            (cf::CONV_SEQ, 8),
            (cf::READ_STATE, 16),
        ] {
            let expected = format!("rocksdb.FixedPrefix.{prefix}");
            assert_eq!(hint(family).as_deref(), Some(expected.as_str()), "{family}");
        }
        assert_eq!(hint(cf::OUTBOX).as_deref(), Some("nullptr"));
    }

    /// Compaction drops expired answers and keeps the others: the TTL
    /// filter is in force on the family that also has insert hints.
    #[tokio::test]
    async fn compaction_drops_expired_answers_and_keeps_live_ones() {
        let (_dir, store) = testing::store();
        let key = |req: &str| IdemKey {
            kind: IdemKind::Send,
            tenant: TenantId(1),
            user: UserId(2),
            client_req_id: req.into(),
        };
        let answer = |expires_at_ms| IdempotencyRecord {
            expires_at_ms,
            ..Default::default()
        };
        let mut m = Mutation::new();
        m.put_idempotency(&key("expired"), &answer(1));
        m.put_idempotency(&key("live"), &answer(u64::MAX));
        store.commit(m).await.unwrap();
        let family = store.db.cf_handle(cf::IDEMPOTENCY).unwrap();
        store.db.flush_cf(family).unwrap();
        store
            .db
            .compact_range_cf(family, None::<&[u8]>, None::<&[u8]>);
        let stored = |req| store.db.get_cf(family, key(req).encode()).unwrap();
        assert!(stored("expired").is_none(), "an expired answer is dropped");
        assert!(stored("live").is_some(), "a live answer is kept");
    }

    /// Bytes of the write-ahead log files under `dir` (RocksDB's own
    /// info log is `LOG`).
    fn log_bytes(dir: &std::path::Path) -> u64 {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
            .map(|e| e.metadata().map_or(0, |m| m.len()))
            .sum()
    }

    /// A family written once keeps no log alive for good: past
    /// `max_wal_mb` the families holding the oldest log file are flushed,
    /// so what a restart replays stays bounded however long the cell ran.
    #[tokio::test]
    async fn the_log_stays_bounded_beside_a_family_written_once() {
        let dir = tempfile::tempdir().unwrap();
        let config = StorageConfig {
            write_buffer_mb: 1,
            max_wal_mb: 4,
            ..testing::config()
        };
        let store = Store::open(dir.path(), &config).unwrap();
        let mut m = Mutation::new();
        m.put_meta_u64(b"written once", 1);
        store.commit(m).await.unwrap();
        // 40 MiB through another family, whose memtables flush each MiB.
        for i in 0..400u64 {
            let mut m = Mutation::new();
            m.put(cf::MESSAGES, i.to_be_bytes().to_vec(), vec![7; 100 * 1024]);
            store.commit(m).await.unwrap();
        }
        // Flushes and the removal of the logs they free run behind.
        let bound = 3 * (4 << 20);
        let deadline = Instant::now() + Duration::from_secs(20);
        while log_bytes(dir.path()) > bound && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let kept = log_bytes(dir.path());
        assert!(kept <= bound, "{kept} bytes of log kept (bound {bound})");
        assert_eq!(store.meta_u64(b"written once").unwrap(), Some(1));
    }

    /// A store closed cleanly has flushed every family: nothing is left
    /// only in its log for the next open to replay, and nothing is lost.
    #[tokio::test]
    async fn a_closed_store_leaves_no_log_to_replay() {
        let (dir, store) = testing::store();
        let mut m = Mutation::new();
        m.put_meta_u64(b"kept", 42);
        m.put(
            cf::MESSAGES,
            1u64.to_be_bytes().to_vec(),
            vec![1; 64 * 1024],
        );
        store.commit(m).await.unwrap();
        store.close();
        for family in cf::ALL {
            let handle = store.db.cf_handle(family).unwrap();
            for property in [
                "rocksdb.num-entries-active-mem-table",
                "rocksdb.num-entries-imm-mem-tables",
            ] {
                let left = store.db.property_int_value_cf(handle, property).unwrap();
                assert_eq!(left, Some(0), "{family}: {property} after a clean close");
            }
        }
        drop(store);
        let store = Store::open(dir.path(), &testing::config()).unwrap();
        assert_eq!(store.meta_u64(b"kept").unwrap(), Some(42));
    }
}
