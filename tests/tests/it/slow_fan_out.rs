//! Fan-out under slow commits: with every group commit slowed down, sends
//! from several senders keep arriving during each fan-out commit, so the
//! processor's batches mix conversations and senders and its cached pts and
//! list entries run ahead of what it last read from storage. Every member
//! still gets every message once, with gapless pts, in each conversation's
//! order, both in storage and on the devices' streams.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use cellmesh_cell::UserKey;
use cellmesh_proto::ids::{TenantId, UserId};
use cellmesh_proto::v1::{SyncEventKind, sync_push};
use cellmesh_tests::sync::{connect_sync, subscribe};
use cellmesh_tests::{TestCell, create_group, eventually, send_direct, text};

const SENDERS: u64 = 4;
const EACH: u64 = 25;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_fan_out_commits_lose_and_repeat_nothing() {
    let cell = TestCell::start().await;
    let mut client = cell.client().await;
    let groups = [
        create_group(&mut client, 1, 1, &[2, 3, 4]).await,
        create_group(&mut client, 1, 1, &[2, 3, 4]).await,
    ];
    let mut sync = connect_sync(&cell.endpoint).await;
    let streams = [
        subscribe(&mut sync, 1, 2, "phone", 0).await,
        subscribe(&mut sync, 1, 3, "phone", 0).await,
    ];

    cell.arm_failpoint("storage.slow_write", "delay(20ms)")
        .await;
    let store = cell.cell.service.store().clone();

    let senders = (1..=SENDERS).map(|sender| {
        let mut client = client.clone();
        tokio::spawn(async move {
            for i in 0..EACH {
                let conv = groups[(i % 2) as usize];
                let tag = format!("{sender}-{i}");
                send_direct(&mut client, text(1, sender, conv, &tag, &tag)).await;
            }
        })
    });
    let readers = streams.map(|mut stream| {
        tokio::spawn(async move {
            let mut events = Vec::new();
            let mut messages = 0;
            while messages < SENDERS * EACH {
                let push = tokio::time::timeout(Duration::from_secs(30), stream.message())
                    .await
                    .expect("every message is pushed within 30 s")
                    .expect("the stream stays up")
                    .expect("the stream does not end");
                if let Some(sync_push::Push::Event(e)) = push.push {
                    messages += u64::from(e.kind == SyncEventKind::Message as i32);
                    events.push((e.pts, e.kind, e.conversation_id, e.seq));
                }
            }
            events
        })
    });
    for sender in senders {
        sender.await.unwrap();
    }
    for reader in readers {
        let pushed = reader.await.unwrap();
        check(&pushed, "pushed");
    }
    std::fs::remove_file(cell.dir.path().join("failpoints")).unwrap();
    for user in 1..=4 {
        let key = UserKey::new(TenantId(1), UserId(user));
        let stored = eventually(Duration::from_secs(20), || async {
            let queue = store.sync_after(key, 0, 10_000).unwrap();
            let messages = queue
                .iter()
                .filter(|(_, r)| r.kind == SyncEventKind::Message as i32);
            messages.count() as u64 >= SENDERS * EACH
        })
        .await;
        assert!(stored, "user {user}'s queue holds every message");
        let queue = store.sync_after(key, 0, 10_000).unwrap();
        let events: Vec<_> = queue
            .iter()
            .map(|(pts, r)| (*pts, r.kind, r.conversation_id, r.seq))
            .collect();
        check(&events, &format!("stored for user {user}"));
        assert_eq!(store.user_pts(key).unwrap(), events.len() as u64);
    }
}

/// Gapless pts from 1, each message once, each conversation's in order.
fn check(events: &[(u64, i32, u64, u64)], what: &str) {
    let pts: Vec<u64> = events.iter().map(|e| e.0).collect();
    let expected: Vec<u64> = (1..=events.len() as u64).collect();
    assert_eq!(pts, expected, "{what}: gapless pts from 1");
    let mut seen = HashSet::new();
    let mut last: BTreeMap<u64, u64> = BTreeMap::new();
    for &(pts, kind, conv, seq) in events {
        if kind != SyncEventKind::Message as i32 {
            continue;
        }
        assert!(
            seen.insert((conv, seq)),
            "{what}: message {conv}/{seq} twice (pts {pts})"
        );
        let before = last.insert(conv, seq).unwrap_or(0);
        assert!(seq > before, "{what}: {conv}/{seq} after {before}");
    }
    assert_eq!(seen.len() as u64, SENDERS * EACH, "{what}: every message");
}
