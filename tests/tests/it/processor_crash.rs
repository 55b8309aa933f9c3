//! A processor that dies after making a batch's effects durable but before
//! committing its queue positions: the restarted processor gets the batch
//! again and every member still ends up with the message exactly once.

use cellmesh_proto::ids::{TenantId, UserId};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cellmesh_cell::clock::SystemClock;
use cellmesh_cell::homes::StaticHomes;
use cellmesh_cell::message::{Caller, CreateCommand, MessageService, SendCommand};
use cellmesh_cell::ownership::OwnAll;
use cellmesh_cell::pipeline::processor::{Processor, Signals};
use cellmesh_cell::pipeline::relay;
use cellmesh_cell::queue::{EventQueue, embedded::EmbeddedQueue, kafka::KafkaQueue};
use cellmesh_cell::storage::Store;
use cellmesh_cell::sync::Hub;
use cellmesh_proto::v1::{ConversationKind, MessageType, SyncEventKind};
use cellmesh_tests::backends::Kafka;
use cellmesh_tests::{eventually, test_config};

const T: u64 = 9;

async fn crash_between_apply_and_commit(kafka: Option<&Kafka>) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    if let Some(k) = kafka {
        k.configure(&mut config);
    }
    let config = Arc::new(config);
    let store = Store::open(&dir.path().join("db"), &config.storage).unwrap();
    let clock = Arc::new(SystemClock);
    let messages = MessageService::new(
        store.clone(),
        config.clone(),
        Arc::new(OwnAll),
        clock.clone(),
        Arc::new(cellmesh_cell::replication::Replicator::disabled()),
        Default::default(),
    )
    .unwrap();
    let queue: Arc<dyn EventQueue> = match kafka {
        None => Arc::new(EmbeddedQueue::open(store.clone()).unwrap()),
        Some(_) => Arc::new(KafkaQueue::connect(&config).await.unwrap()),
    };

    let creator = Caller::new(TenantId(T), UserId(1));
    let conv = messages
        .create_conversation(CreateCommand {
            caller: creator,
            kind: ConversationKind::Group,
            title: String::new(),
            members: vec![2, 3, 4],
            client_req_id: String::new(),
        })
        .await
        .unwrap()
        .conversation_id;
    let sent = messages
        .send(send_cmd(creator, conv, "once"))
        .await
        .unwrap();

    // Relay the outbox onto a queue that does not read it in place.
    if !queue.reads_outbox() {
        let relay_task = tokio::spawn(relay::run(store.clone(), queue.clone()));
        assert!(
            eventually(Duration::from_secs(10), || async {
                store.outbox_pending(1).unwrap().is_empty()
            })
            .await
        );
        relay_task.abort();
    }

    let group = config.processor_group();
    let hub = Arc::new(Hub::new(60_000, 16));
    let homes = Arc::new(StaticHomes::from_config(&config.homes));
    let new_processor = || {
        let signals = Signals::default();
        Processor::new(
            store.clone(),
            hub.clone(),
            clock.clone(),
            500,
            homes.clone(),
            signals,
            config.cell_id.clone(),
        )
        .unwrap()
    };

    // First life: consume both events, apply them durably, die before committing.
    let mut consumer = queue.consumer(&group).await.unwrap();
    let mut first = Vec::new();
    while first.len() < 2 {
        first.extend(consumer.poll(64, Duration::from_secs(5)).await.unwrap());
    }
    new_processor().apply(&first).await.unwrap();
    drop(consumer);

    // Second life: the same events come again; applying them changes nothing.
    let mut consumer = queue.consumer(&group).await.unwrap();
    let mut again = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while again.len() < 2 && tokio::time::Instant::now() < deadline {
        again.extend(consumer.poll(64, Duration::from_secs(1)).await.unwrap());
    }
    let ids =
        |d: &[cellmesh_cell::queue::Delivery]| d.iter().map(|d| d.event.id).collect::<Vec<_>>();
    assert_eq!(
        ids(&again),
        ids(&first),
        "uncommitted events are redelivered"
    );
    new_processor()
        .apply_and_commit(&again, consumer.as_mut())
        .await
        .unwrap();
    drop(consumer);
    let mut third = queue.consumer(&group).await.unwrap();
    let left = third.poll(64, Duration::from_secs(1)).await.unwrap();
    assert!(
        left.is_empty(),
        "processed events are not delivered again: {left:?}"
    );

    for user in [1, 2, 3, 4] {
        let queue = store
            .sync_after(
                cellmesh_cell::UserKey::new(TenantId(T), UserId(user)),
                0,
                100,
            )
            .unwrap();
        let message_events: Vec<_> = queue
            .iter()
            .filter(|(_, r)| r.kind == SyncEventKind::Message as i32)
            .collect();
        assert_eq!(
            message_events.len(),
            1,
            "user {user} has the message once: {queue:?}"
        );
        assert_eq!(message_events[0].1.seq, sent.seq);
        let joined = queue
            .iter()
            .filter(|(_, r)| r.kind == SyncEventKind::Joined as i32)
            .count();
        assert_eq!(joined, 1, "user {user} joined once");
        assert_eq!(
            store
                .user_pts(cellmesh_cell::UserKey::new(TenantId(T), UserId(user)))
                .unwrap(),
            2
        );
    }
    if queue.reads_outbox() {
        // A new message's fan-out and its queue position land in one commit.
        let mut next = send_cmd(creator, conv, "next");
        next.body = b"next".to_vec();
        messages.send(next).await.unwrap();
        let got = third.poll(64, Duration::from_secs(5)).await.unwrap();
        assert_eq!(got.len(), 1);
        let batches = || store.stats().batches.load(Ordering::Relaxed);
        let before = batches();
        new_processor()
            .apply_and_commit(&got, third.as_mut())
            .await
            .unwrap();
        assert_eq!(batches() - before, 1, "one write batch");
        drop(third);
        let mut fourth = queue.consumer(&group).await.unwrap();
        assert!(fourth.poll(64, Duration::ZERO).await.unwrap().is_empty());
    }
    store.close();
}

fn send_cmd(caller: Caller, conversation: u64, id: &str) -> SendCommand {
    SendCommand {
        caller,
        conversation: cellmesh_proto::ids::ConversationId(conversation),
        client_req_id: id.into(),
        kind: MessageType::Text,
        body: b"exactly once".to_vec(),
        route_epoch: 0,
        visible_to: Vec::new(),
        attachments: Vec::new(),
    }
}

#[tokio::test]
async fn redelivery_after_a_crash_is_applied_once_embedded() {
    crash_between_apply_and_commit(None).await;
}

#[tokio::test]
async fn redelivery_after_a_crash_is_applied_once_kafka() {
    let kafka = Kafka::start(1);
    crash_between_apply_and_commit(Some(&kafka)).await;
}
