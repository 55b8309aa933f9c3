use cellmesh_proto::ids::{ConversationId, TenantId};
use openraft::RaftSnapshotBuilder;
use openraft::storage::RaftStateMachine;
use openraft::testing::{StoreBuilder, Suite};
use openraft::{CommittedLeaderId, EntryPayload, LogId};
use std::time::{Duration, Instant};
use tempfile::TempDir;

use super::*;
use crate::table::{Command, Key};
use crate::types::{Entry, TypeConfig};

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError> {
        let dir = tempfile::tempdir().expect("temp dir");
        let (log, sm) = open(dir.path(), 1_000)?;
        Ok((dir, log, sm))
    }
}

#[test]
fn log_store_and_state_machine_pass_the_openraft_suite() {
    Suite::test_all(Builder).expect("openraft storage suite");
}

fn entry(index: u64, command: Command) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 0), index),
        payload: EntryPayload::Normal(crate::types::Commands(vec![command])),
    }
}

#[tokio::test]
async fn the_table_and_its_history_survive_a_reopen_and_move_through_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let (_, mut sm) = open(dir.path(), 1).unwrap();
    let commands = [
        Command::RegisterCell {
            id: "eu/c1".into(),
            region: "eu".into(),
            address: "http://127.0.0.1:1".into(),
            version: "0.2.0".into(),
            owner_lease_ms: 0,
        },
        Command::AssignTenant {
            tenant: 3,
            cell: "eu/c1".into(),
            expect_epoch: 0,
        },
        // Refused (unknown cell): a result, and no change recorded.
        Command::AssignTenant {
            tenant: 4,
            cell: "eu/c9".into(),
            expect_epoch: 0,
        },
    ];
    let applied = sm
        .apply(
            commands
                .iter()
                .enumerate()
                .map(|(i, c)| entry(i as u64 + 1, c.clone())),
        )
        .await
        .unwrap();
    assert!(applied[2].results[0].is_err());
    let store = sm.store();
    assert_eq!(store.changes_from(0, 10).unwrap().len(), 2);
    let before = store.table();
    drop((sm, store));

    let (_, mut sm) = open(dir.path(), 1).unwrap();
    let store = sm.store();
    assert_eq!(store.table(), before);
    assert_eq!(store.applied_index(), 3);
    assert_eq!(
        store.read(|t| t
            .resolve(&Key::conversation(TenantId(3), ConversationId(9)))
            .unwrap()
            .entry
            .cell
            .clone()),
        "eu/c1"
    );

    // A snapshot compacts history older than `watch_history` and installs
    // into an empty replica with the same table and remaining history.
    let snapshot = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    assert_eq!(store.compacted_through(), 2);
    let other_dir = tempfile::tempdir().unwrap();
    let (_, mut other) = open(other_dir.path(), 1).unwrap();
    other
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    let other_store = other.store();
    assert_eq!(other_store.table(), before);
    assert_eq!(other_store.compacted_through(), 2);
    assert!(other_store.changes_from(0, 10).unwrap().is_empty());
    assert!(other.get_current_snapshot().await.unwrap().is_some());
}

#[tokio::test]
async fn a_database_in_another_record_format_is_refused_at_open_not_misread() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut log, _) = open(dir.path(), 10).unwrap();
        openraft::storage::RaftLogStorage::save_vote(&mut log, &openraft::Vote::new(3, 1))
            .await
            .unwrap();
    }
    // Reopened as is: the stamp matches.
    drop(open(dir.path(), 10).unwrap());
    {
        // A database from before the stamp: same data, no format record.
        let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), dir.path(), ALL_CFS).unwrap();
        db.delete_cf(cf(&db, CF_RAFT_META), FORMAT_KEY).unwrap();
    }
    let err = open(dir.path(), 10).err().expect("refused").to_string();
    assert!(err.contains("unversioned"), "{err}");
    // An empty directory is stamped and opens.
    let fresh = tempfile::tempdir().unwrap();
    drop(open(fresh.path(), 10).unwrap());
    drop(open(fresh.path(), 10).unwrap());
}

/// The vote's family written once does not keep the log alive: past the
/// bound the families holding its oldest file are flushed, so a restart
/// replays a bounded log however long the replica ran.
#[tokio::test]
async fn the_log_stays_bounded_beside_a_vote_written_once() {
    let dir = tempfile::tempdir().unwrap();
    let tuning = Tuning {
        write_buffer_bytes: 1 << 20,
        max_wal_bytes: 4 << 20,
    };
    let (mut log, mut sm) = open_tuned(dir.path(), 10, &tuning).unwrap();
    openraft::storage::RaftLogStorage::save_vote(&mut log, &openraft::Vote::new(3, 1))
        .await
        .unwrap();
    // About 40 MiB of changes (each cell's address is 4 KiB long, kept in
    // the table and in the change history), in other families.
    let address = format!("http://{}", "a".repeat(4096));
    for chunk in 0..50u64 {
        let entries = (0..100u64).map(|i| register(chunk * 100 + i + 1, &address));
        sm.apply(entries).await.unwrap();
    }
    let log_bytes = || log_bytes(dir.path());
    let bound = 3 * tuning.max_wal_bytes;
    let deadline = Instant::now() + Duration::from_secs(20);
    while log_bytes() > bound && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(log_bytes() <= bound, "{} bytes of log kept", log_bytes());
    drop((log, sm));
    let (mut log, _) = open(dir.path(), 10).unwrap();
    let vote = openraft::storage::RaftLogStorage::read_vote(&mut log).await;
    assert_eq!(vote.unwrap(), Some(openraft::Vote::new(3, 1)));
}

/// Entry `index` registers cell `eu/c{index}` at `address`.
fn register(index: u64, address: &str) -> Entry {
    entry(
        index,
        Command::RegisterCell {
            id: format!("eu/c{index}"),
            region: "eu".into(),
            address: address.to_string(),
            version: "0.3.0".into(),
            owner_lease_ms: 0,
        },
    )
}

/// Bytes in the database's write-ahead log files.
fn log_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum()
}

/// A replica stopped cleanly leaves no log to replay: its memtables are
/// flushed at close, and what it applied is read back from the tables.
#[tokio::test]
async fn a_closed_store_leaves_no_log_to_replay() {
    let dir = tempfile::tempdir().unwrap();
    let (log, mut sm) = open(dir.path(), 10).unwrap();
    let address = format!("http://{}", "a".repeat(1024));
    let entries = (1..=1_000u64).map(|n| register(n, &address));
    sm.apply(entries).await.unwrap();
    let written = log_bytes(dir.path());
    assert!(written > 1 << 20, "{written} bytes of log before the close");
    sm.store().close();
    drop((log, sm));
    let left = log_bytes(dir.path());
    assert!(
        left < 64 << 10,
        "{left} bytes of log left to replay after a close"
    );
    let (_, sm) = open(dir.path(), 10).unwrap();
    assert_eq!(sm.store().applied_index(), 1_000);
    for id in ["eu/c1", "eu/c1000"] {
        assert!(sm.store().read(|t| t.cell(id).is_some()), "{id} read back");
    }
}
