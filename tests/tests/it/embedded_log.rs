//! The embedded event log is the outbox read in place: a cell upgraded from
//! a release that relayed the outbox into a partitioned log drains what is
//! left there first, in order, then reads the outbox; processed events are
//! trimmed, and ids are never issued twice across a restart.

use cellmesh_proto::ids::ConversationId;
use std::sync::Arc;
use std::time::Duration;

use cellmesh_cell::queue::embedded::{EmbeddedQueue, OUTBOX_PARTITION};
use cellmesh_cell::queue::{EventConsumer, EventQueue, partition_of};
use cellmesh_cell::storage::{Mutation, Store};
use cellmesh_proto::storage::v1::{OutboxEvent, QueuedEvent};
use cellmesh_tests::test_config;

fn event(conversation: u64, seq: u64) -> QueuedEvent {
    QueuedEvent {
        id: 0,
        event: Some(OutboxEvent {
            conversation_id: conversation,
            seq,
            ..Default::default()
        }),
    }
}

/// Everything the consumer has, in one list of (conversation, seq, id).
async fn drain(consumer: &mut Box<dyn EventConsumer>) -> Vec<(u64, u64, u64)> {
    let mut out = Vec::new();
    loop {
        let got = consumer.poll(1_000, Duration::ZERO).await.unwrap();
        if got.is_empty() {
            return out;
        }
        consumer.commit(&got).await.unwrap();
        out.extend(got.iter().map(|d| {
            let e = d.event.event.as_ref().unwrap();
            (e.conversation_id, e.seq, d.event.id)
        }));
    }
}

#[tokio::test]
async fn an_upgraded_cell_drains_the_old_log_before_the_outbox() {
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(dir.path());
    let store = Store::open(&dir.path().join("db"), &config.storage).unwrap();
    let queue = EmbeddedQueue::open(store.clone()).unwrap();

    // What an earlier release left: ids 1..=6 relayed into four partitions,
    // the first two already processed by the group.
    queue
        .publish((1..=6).map(|seq| event(10 + seq % 2, seq)).collect())
        .await
        .unwrap();
    let relayed = store.outbox_after(0, 100).unwrap();
    let mut m = Mutation::new();
    let mut offsets = [0u64; 4];
    for (id, e) in &relayed {
        let p = partition_of(ConversationId(e.conversation_id), 4);
        offsets[p as usize] += 1;
        let queued = QueuedEvent {
            id: *id,
            event: Some(e.clone()),
        };
        m.put_queued(p, offsets[p as usize], &queued);
    }
    m.relayed(&relayed.iter().map(|(id, _)| *id).collect::<Vec<_>>());
    for p in 0..4 {
        let first = relayed
            .iter()
            .filter(|(_, e)| partition_of(ConversationId(e.conversation_id), 4) == p)
            .take_while(|(id, _)| *id <= 2)
            .count();
        m.put_queue_offset("processor", p, first as u64);
    }
    store.commit(m).await.unwrap();
    assert!(store.outbox_after(0, 10).unwrap().is_empty());

    // This release's sends land in the outbox.
    queue
        .publish((7..=9).map(|seq| event(10 + seq % 2, seq)).collect())
        .await
        .unwrap();
    let mut consumer = queue.consumer("processor").await.unwrap();
    let got = drain(&mut consumer).await;
    let ids: Vec<u64> = got.iter().map(|(_, _, id)| *id).collect();
    assert_eq!(ids.len(), 7, "ids 3..=9 once each: {got:?}");
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(sorted, (3..=9).collect::<Vec<_>>());
    assert_eq!(&ids[4..], &[7, 8, 9], "the outbox after the old log");
    for conversation in [10, 11] {
        let seqs: Vec<u64> = got
            .iter()
            .filter(|(c, _, _)| *c == conversation)
            .map(|(_, s, _)| *s)
            .collect();
        assert!(seqs.is_sorted(), "conversation {conversation}: {seqs:?}");
    }

    // A new consumer of the group resumes after what was committed.
    queue.publish(vec![event(10, 10)]).await.unwrap();
    let mut again = queue.consumer("processor").await.unwrap();
    let got = drain(&mut again).await;
    assert_eq!(got, vec![(10, 10, 10)]);
    store.close();
}

#[tokio::test]
async fn processed_events_are_trimmed_and_ids_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(dir.path());
    let path = dir.path().join("db");
    let store = Store::open(&path, &config.storage).unwrap();
    let queue = Arc::new(EmbeddedQueue::open(store.clone()).unwrap());
    queue
        .publish((1..=9_000).map(|seq| event(7, seq)).collect())
        .await
        .unwrap();
    let mut consumer = queue.consumer("processor").await.unwrap();
    let got = drain(&mut consumer).await;
    assert_eq!(got.len(), 9_000);
    assert_eq!(store.relay_cursor().unwrap(), 9_000);
    assert_eq!(
        store.queue_offset("processor", OUTBOX_PARTITION).unwrap(),
        9_000
    );
    let left = store.outbox_after(0, 10_000).unwrap();
    assert!(
        left.len() < 9_000 - 4_096,
        "processed events are trimmed: {} left",
        left.len()
    );
    assert!(store.outbox_pending(1).unwrap().is_empty());
    drop(consumer);
    drop(queue);
    store.close();
    drop(store);

    let store = Store::open(&path, &config.storage).unwrap();
    let queue = EmbeddedQueue::open(store.clone()).unwrap();
    queue.publish(vec![event(7, 9_001)]).await.unwrap();
    let mut consumer = queue.consumer("processor").await.unwrap();
    let got = drain(&mut consumer).await;
    assert_eq!(got, vec![(7, 9_001, 9_001)], "the next id, read once");
    store.close();
}

/// The messages a device of user 2 is pushed from pts 0, as seqs, until
/// `n` arrived; and that nothing else follows.
async fn pushed_once(endpoint: &str, conv: u64, n: usize) -> Vec<u64> {
    use cellmesh_tests::sync::{connect_sync, message_seqs, messages, next_push, subscribe};
    let mut sync = connect_sync(endpoint).await;
    let mut stream = subscribe(&mut sync, 1, 2, "phone", 0).await;
    let events = messages(&mut stream, n, Duration::from_secs(20)).await;
    let extra = next_push(&mut stream, Duration::from_millis(500)).await;
    let extra_message = extra.and_then(|p| match p.push {
        Some(cellmesh_proto::v1::sync_push::Push::Event(e)) => {
            (e.kind == cellmesh_proto::v1::SyncEventKind::Message as i32).then_some(e.seq)
        }
        _ => None,
    });
    assert_eq!(extra_message, None, "a message pushed twice");
    assert!(events.iter().all(|e| e.conversation_id == conv));
    message_seqs(&events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_keeps_the_partitioned_log_until_it_may_read_the_outbox() {
    use cellmesh_cell::config::EmbeddedLog;
    use cellmesh_tests::{TestCell, create_group, send_direct, text};
    let clock = || Arc::new(cellmesh_cell::clock::SystemClock);
    // Before the finalize: what an earlier release can read.
    let cell =
        TestCell::start_with(|c| c.queue.embedded_log = EmbeddedLog::Partitioned, clock()).await;
    let mut client = cell.client().await;
    let conv = create_group(&mut client, 1, 1, &[2]).await;
    for i in 0..20 {
        send_direct(&mut client, text(1, 1, conv, &format!("a{i}"), "before")).await;
    }
    assert_eq!(
        pushed_once(&cell.endpoint, conv, 20).await,
        (1..=20).collect::<Vec<_>>()
    );
    let store = cell.cell.service.store().clone();
    assert!(
        !store.queue_partitions().unwrap().is_empty(),
        "the events went through the partitioned log"
    );
    drop(store);
    // Events acknowledged but not yet relayed when the cell stops wait in
    // the outbox: the next start takes them after what is left in the
    // partitioned log.
    std::fs::write(cell.dir.path().join("failpoints"), "queue.publish=error\n").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..5 {
        send_direct(&mut client, text(1, 1, conv, &format!("b{i}"), "stopping")).await;
    }
    let dir = cell.stop().await;
    std::fs::remove_file(dir.path().join("failpoints")).unwrap();

    // After it: the outbox in place, the old log drained first.
    let cell =
        TestCell::start_in(dir, |c| c.queue.embedded_log = EmbeddedLog::Outbox, clock()).await;
    let mut client = cell.client().await;
    for i in 0..15 {
        send_direct(&mut client, text(1, 1, conv, &format!("c{i}"), "after")).await;
    }
    assert_eq!(
        pushed_once(&cell.endpoint, conv, 40).await,
        (1..=40).collect::<Vec<_>>()
    );
    let dir = cell.stop().await;

    // Once consumed in place, never back: a pinned partitioned log would
    // hand the outbox's events out again.
    let cell = TestCell::start_in(
        dir,
        |c| c.queue.embedded_log = EmbeddedLog::Partitioned,
        clock(),
    )
    .await;
    let mut client = cell.client().await;
    for i in 0..5 {
        send_direct(&mut client, text(1, 1, conv, &format!("d{i}"), "pinned")).await;
    }
    assert_eq!(
        pushed_once(&cell.endpoint, conv, 45).await,
        (1..=45).collect::<Vec<_>>()
    );
    cell.stop().await;
}
