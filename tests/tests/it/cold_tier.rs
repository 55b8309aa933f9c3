//! The cold tier: history tiered to segments reads exactly as before,
//! across page boundaries and in both directions; recalls and edits of
//! cold messages show; a damaged segment is reported (`SEGMENT_CORRUPT`),
//! never served; retention deletes only past its horizon and legal hold
//! keeps everything, each deletion recorded as an operation (none without
//! its record); an S3 endpoint (moto) works as the local directory
//! does; a cell killed between upload, manifest commit and hot delete
//! loses and duplicates nothing.

use cellmesh_proto::ids::TenantId;
use cellmesh_proto::reason::Reason;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cellmesh_cell::CellConfig;
use cellmesh_cell::clock::{ManualClock, SystemClock};
use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1::*;
use cellmesh_tests::process::CellProcess;
use cellmesh_tests::*;

const T: u64 = 21;

/// Tiers everything beyond a conversation's newest 10 messages, in
/// segments of at most 25, when asked (the background pass is an hour
/// away).
fn tiered(config: &mut CellConfig) {
    let t = &mut config.tiering;
    t.enabled = true;
    t.hot_messages_per_conversation = 10;
    t.segment_max_messages = 25;
    t.interval_ms = 3_600_000;
}

async fn send_many(c: &mut Client, tenant: u64, conv: u64, n: usize, tag: &str) {
    for i in 1..=n {
        c.send(text(
            tenant,
            1,
            conv,
            &format!("{tag}-{i}"),
            &format!("{tag} message {i}"),
        ))
        .await
        .unwrap();
    }
}

/// What users 1 and 2 see paging forward by 7 and backward by 9.
async fn views(c: &mut Client, tenant: u64, conv: u64) -> Vec<Vec<Message>> {
    let mut out = Vec::new();
    for user in [1, 2] {
        out.push(pull_pages(c, tenant, user, conv, Direction::Forward, 7).await);
        out.push(pull_pages(c, tenant, user, conv, Direction::Backward, 9).await);
    }
    out
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "seg") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out.sort();
    out
}

#[tokio::test]
async fn pages_across_tiers_read_as_before_tiering() {
    let cell = TestCell::start_with(tiered, Arc::new(SystemClock)).await;
    let mut c = cell.client().await;
    let conv = create_group(&mut c, T, 1, &[2]).await;
    send_many(&mut c, T, conv, 120, "a").await;
    c.recall(RecallRequest {
        caller: caller(T, 1),
        conversation_id: conv,
        seq: 5,
    })
    .await
    .unwrap();
    c.delete_for_me(DeleteForMeRequest {
        caller: caller(T, 2),
        conversation_id: conv,
        seqs: vec![7, 60],
    })
    .await
    .unwrap();
    let before = views(&mut c, T, conv).await;
    assert_eq!(before[0].len(), 120);
    assert_eq!(before[2].len(), 118, "user 2 deleted two for themselves");

    let report = cell.cell.service.tier_once().await.unwrap();
    assert_eq!((report.segments_written, report.messages_tiered), (5, 110));
    assert_eq!(segment_files(&cell.dir.path().join("cold")).len(), 5);
    assert_eq!(
        views(&mut c, T, conv).await,
        before,
        "pages read the same across tiers"
    );
    let again = cell.cell.service.tier_once().await.unwrap();
    assert_eq!(again.messages_tiered, 0, "nothing new to tier");

    // Recall and edit of cold messages are overlays applied on read.
    let edited = c
        .edit(EditRequest {
            caller: caller(T, 1),
            conversation_id: conv,
            seq: 30,
            body: b"fixed".to_vec(),
        })
        .await
        .unwrap()
        .into_inner()
        .message
        .unwrap();
    assert_eq!((edited.seq, edited.edit_version), (30, 1));
    c.recall(RecallRequest {
        caller: caller(T, 1),
        conversation_id: conv,
        seq: 31,
    })
    .await
    .unwrap();
    let after_edits = pull_pages(&mut c, T, 1, conv, Direction::Forward, 50).await;
    assert_eq!(after_edits.len(), 120);
    assert_eq!(after_edits[29].body, b"fixed");
    assert_eq!(after_edits[30].state, MessageState::Recalled as i32);
    assert_eq!(after_edits[4].state, MessageState::Recalled as i32);
    let seqs: Vec<u64> = after_edits.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, (1..=120).collect::<Vec<_>>());

    // A restart reads the manifest and segments from disk.
    let dir = cell.stop().await;
    let cell = restart(dir, tiered).await;
    let mut c = cell.client().await;
    assert_eq!(
        pull_pages(&mut c, T, 1, conv, Direction::Forward, 50).await,
        after_edits
    );
    // Sends go on above the cold history.
    send_many(&mut c, T, conv, 3, "b").await;
    let all = pull_pages(&mut c, T, 1, conv, Direction::Backward, 100).await;
    assert_eq!(all.len(), 123);
    assert_eq!(all[0].seq, 123);
}

async fn restart(dir: tempfile::TempDir, tune: fn(&mut CellConfig)) -> TestCell {
    TestCell::start_in(dir, tune, Arc::new(SystemClock)).await
}

#[tokio::test]
async fn a_damaged_segment_is_reported_and_never_served() {
    let uncached = |c: &mut CellConfig| {
        tiered(c);
        c.tiering.cache_segments = 0;
    };
    let cell = TestCell::start_with(uncached, Arc::new(SystemClock)).await;
    let mut c = cell.client().await;
    let conv = create_group(&mut c, T, 1, &[2]).await;
    send_many(&mut c, T, conv, 40, "c").await;
    cell.cell.service.tier_once().await.unwrap();
    let files = segment_files(&cell.dir.path().join("cold"));
    assert_eq!(files.len(), 2);
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&files[0], bytes).unwrap();

    let status = c
        .pull(PullRequest {
            caller: caller(T, 1),
            conversation_id: conv,
            since_seq: 0,
            direction: Direction::Forward as i32,
            limit: 10,
        })
        .await
        .unwrap_err();
    assert_eq!(
        error_detail(&status).reason,
        Reason::SegmentCorrupt.as_str(),
        "{status:?}"
    );
    // The hot tail and the intact segment still serve.
    let tail = c
        .pull(PullRequest {
            caller: caller(T, 1),
            conversation_id: conv,
            since_seq: 25,
            direction: Direction::Forward as i32,
            limit: 100,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(tail.messages.len(), 15);
    assert_eq!(tail.messages[0].seq, 26);
}

/// The operation records in the coordination directory `dir`.
async fn operations(dir: &Path) -> Vec<ops::Operation> {
    let local = cellmesh_coord::local::LocalCoordination::open(dir).unwrap();
    let store = ops::OperationStore::new(Arc::new(local));
    store.list().await.unwrap().into_values().collect()
}

use cellmesh_control_plane::operations as ops;

#[tokio::test]
async fn retention_deletes_only_past_its_horizon_and_legal_hold_keeps_all() {
    const HELD: u64 = 22;
    let day = 86_400_000;
    let clock = Arc::new(ManualClock::new(100 * day + 1_000));
    // A record a crash left open, closed when the cell starts.
    let coordination = tempfile::tempdir().unwrap();
    let journal = ops::OperationStore::new(Arc::new(
        cellmesh_coord::local::LocalCoordination::open(coordination.path()).unwrap(),
    ));
    let expire = ops::Spec::ExpireHistory {
        tenant: T,
        cell: "local/c1".into(),
        retention_days: 3,
    };
    let stale = journal.create(expire.clone()).await.unwrap();
    journal
        .update(&stale.id, |op| op.state = ops::State::Running)
        .await
        .unwrap();
    let policy = |c: &mut CellConfig| {
        tiered(c);
        c.routing.coordination_dir = coordination.path().display().to_string();
        c.tiering.hot_age_secs = 86_400;
        c.tiering.hot_messages_per_conversation = 0;
        for (tenant, legal_hold) in [(T, false), (HELD, true)] {
            c.tiering.tenants.insert(
                tenant.to_string(),
                cellmesh_cell::cold::TenantRetention {
                    retention_days: 3,
                    legal_hold,
                },
            );
        }
    };
    let cell = TestCell::start_with(policy, clock.clone()).await;
    let mut c = cell.client().await;
    let kept = create_group(&mut c, T, 1, &[2]).await;
    let held = create_group(&mut c, HELD, 1, &[2]).await;
    send_many(&mut c, T, kept, 30, "old").await;
    send_many(&mut c, HELD, held, 30, "old").await;
    clock.advance_ms(2 * day);
    send_many(&mut c, T, kept, 5, "new").await;
    send_many(&mut c, HELD, held, 5, "new").await;

    // Day 102: the first 30 are older than the hot age, within retention.
    let report = cell.cell.service.tier_once().await.unwrap();
    assert_eq!(report.messages_tiered, 60);
    assert_eq!(report.segments_expired, 0);
    assert!(
        eventually(Duration::from_secs(10), || async {
            let op = journal.get(&stale.id).await.unwrap().unwrap();
            op.state == ops::State::Failed && op.message.contains("interrupted")
        })
        .await,
        "the record a crash left open is closed at start"
    );
    // Day 104: the first day's segment is past 3 days; the newer not. While
    // the deletion cannot be recorded, nothing is deleted.
    clock.advance_ms(2 * day);
    let records = coordination.path().join("records");
    let away = coordination.path().join("records.away");
    std::fs::rename(&records, &away).unwrap();
    std::fs::write(&records, b"not a directory").unwrap();
    let report = cell.cell.service.tier_once().await.unwrap();
    assert_eq!(report.segments_expired, 0, "unrecorded: {report:?}");
    assert_eq!(
        pull_pages(&mut c, T, 1, kept, Direction::Forward, 100)
            .await
            .len(),
        35
    );
    std::fs::remove_file(&records).unwrap();
    std::fs::rename(&away, &records).unwrap();
    let report = cell.cell.service.tier_once().await.unwrap();
    assert_eq!(report.segments_expired, 2, "{report:?}");
    let recorded: Vec<_> = operations(coordination.path())
        .await
        .into_iter()
        .filter(|op| op.id != stale.id)
        .collect();
    assert_eq!(
        recorded.len(),
        1,
        "one record per tenant and pass: {recorded:?}"
    );
    let op = &recorded[0];
    assert_eq!(op.spec, expire);
    assert_eq!(op.state, ops::State::Succeeded, "{op:?}");
    assert_eq!((op.done, op.total, op.rows), (2, 2, 30), "{op:?}");
    assert_eq!(
        op.to_pb().description,
        "delete history of tenant 21 older than 3 days on local/c1"
    );
    let left = pull_pages(&mut c, T, 1, kept, Direction::Forward, 100).await;
    let seqs: Vec<u64> = left.iter().map(|m| m.seq).collect();
    assert_eq!(
        seqs,
        (31..=35).collect::<Vec<_>>(),
        "only the first day went"
    );
    assert_eq!(
        pull_pages(&mut c, HELD, 1, held, Direction::Forward, 100)
            .await
            .len(),
        35,
        "legal hold keeps all"
    );
    // Left: the kept tenant's newer segment (tiered on day 104), the held
    // tenant's two old ones and its newer one.
    let files = segment_files(&cell.dir.path().join("cold"));
    let of = |t: u64| {
        files
            .iter()
            .filter(|f| f.display().to_string().contains(&format!("/t{t}/")))
            .count()
    };
    assert_eq!((of(T), of(HELD)), (1, 3), "{files:?}");
    // The search index forgets what retention deleted, and only that.
    let search = cell.cell.service.search_indexes().unwrap();
    let docs = |t| search.tenant(t).unwrap().num_docs();
    let forgot = eventually(Duration::from_secs(10), || async {
        (docs(TenantId(T)), docs(TenantId(HELD))) == (5, 35)
    })
    .await;
    assert!(
        forgot,
        "indexed: {} and {}",
        docs(TenantId(T)),
        docs(TenantId(HELD))
    );
}

#[tokio::test]
async fn an_s3_bucket_serves_as_the_cold_tier() {
    let moto = cellmesh_tests::moto::Moto::start("cellmesh-cold").await;
    let on_s3 = |c: &mut CellConfig| {
        tiered(c);
        moto.configure(c);
        c.tiering.cache_segments = 0;
    };
    let cell = TestCell::start_with(on_s3, Arc::new(SystemClock)).await;
    let mut c = cell.client().await;
    let conv = create_group(&mut c, T, 1, &[2]).await;
    send_many(&mut c, T, conv, 60, "s3").await;
    let before = views(&mut c, T, conv).await;
    let report = cell.cell.service.tier_once().await.unwrap();
    assert_eq!((report.segments_written, report.messages_tiered), (2, 50));
    assert!(
        segment_files(&cell.dir.path().join("cold")).is_empty(),
        "nothing on local disk"
    );
    let objects = cell
        .cell
        .service
        .cold()
        .unwrap()
        .list(Some(TenantId(T)))
        .await
        .unwrap();
    assert_eq!(objects.len(), 2, "{objects:?}");
    assert_eq!(views(&mut c, T, conv).await, before);
}

/// Sends `n` messages tagged `tag` to `conv` (0: a new group) through a
/// cell process over `dir` that does not tier yet, then SIGKILLs it.
async fn fill(dir: &Path, config: &CellConfig, conv: u64, tag: &str, n: usize) -> u64 {
    let mut quiet = config.clone();
    quiet.tiering.interval_ms = 3_600_000;
    let mut cell = CellProcess::start_configured(dir, &quiet).await;
    let mut c = connect(&cell.endpoint).await;
    let conv = match conv {
        0 => create_group(&mut c, T, 1, &[2]).await,
        conv => conv,
    };
    send_many(&mut c, T, conv, n, tag).await;
    cell.kill();
    conv
}

/// Starts a cell process over `dir` with `failpoint` set and waits until
/// its tierer reached it and the process aborted.
async fn crash_at(dir: &Path, config: &CellConfig, failpoint: &str) {
    std::fs::write(dir.join("failpoints"), format!("{failpoint}=abort\n")).unwrap();
    let mut cell = CellProcess::start_configured(dir, config).await;
    let died = eventually(Duration::from_secs(30), || {
        let exited = cell.exited();
        async move { exited }
    })
    .await;
    assert!(died, "the cell did not reach fail point {failpoint}");
    std::fs::remove_file(dir.join("failpoints")).unwrap();
}

#[tokio::test]
async fn a_cell_killed_between_upload_commit_and_delete_loses_and_duplicates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    tiered(&mut config);
    config.tiering.interval_ms = 300;
    config.tiering.orphan_grace_secs = 0;
    let cold = dir.path().join("cold");
    let seqs = |m: &[Message]| m.iter().map(|m| m.seq).collect::<Vec<_>>();
    let bodies = |m: &[Message]| {
        m.iter()
            .map(|m| String::from_utf8_lossy(&m.body).into_owned())
            .collect::<Vec<_>>()
    };
    let conv = fill(dir.path(), &config, 0, "k", 60).await;
    // Killed after the upload, before the manifest commit: the hot rows
    // stay, the orphan object is swept at the restart.
    crash_at(dir.path(), &config, "tiering.uploaded").await;
    assert_eq!(
        segment_files(&cold).len(),
        1,
        "one segment uploaded, then the crash"
    );
    let mut watched = config.clone();
    let metrics: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    watched.metrics_listen = metrics.to_string();
    let mut cell = CellProcess::start_configured(dir.path(), &watched).await;
    let mut c = connect(&cell.endpoint).await;
    let mut expected: Vec<String> = (1..=60).map(|i| format!("k message {i}")).collect();
    let all = pull_pages(&mut c, T, 1, conv, Direction::Forward, 13).await;
    assert_eq!(bodies(&all), expected);
    // The restarted tierer does the job (no fail point now): two segments
    // committed.
    let tiered_all = eventually(Duration::from_secs(30), || async move {
        cellmesh_tests::http::get(metrics, "/metrics")
            .await
            .is_ok_and(|(_, text)| text.contains("cellmesh_cold_segments_written_total 2"))
    })
    .await;
    assert!(tiered_all, "segments: {:?}", segment_files(&cold));
    assert_eq!(segment_files(&cold).len(), 2);
    cell.kill();

    // Killed right after a commit: the segment is whole and its hot rows
    // gone; nothing doubles.
    fill(dir.path(), &config, conv, "k2", 20).await;
    expected.extend((1..=20).map(|i| format!("k2 message {i}")));
    let mut small = config.clone();
    small.tiering.segment_max_messages = 5;
    crash_at(dir.path(), &small, "tiering.committed").await;
    assert_eq!(segment_files(&cold).len(), 3);
    let cell = CellProcess::start_configured(dir.path(), &config).await;
    let mut c = connect(&cell.endpoint).await;
    for (direction, limit) in [(Direction::Forward, 7), (Direction::Backward, 11)] {
        let mut got = pull_pages(&mut c, T, 1, conv, direction, limit).await;
        if direction == Direction::Backward {
            got.reverse();
        }
        assert_eq!(seqs(&got), (1..=80).collect::<Vec<u64>>());
        assert_eq!(bodies(&got), expected);
    }
}
