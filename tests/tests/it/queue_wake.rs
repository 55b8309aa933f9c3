//! A consumer waiting on an empty queue stops waiting when woken (the
//! processor has a delivery, an import or a seal's barrier to take), on
//! both queue backends, and the woken wait takes nothing from the queue:
//! what is published next is the next thing polled.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cellmesh_cell::queue::EventQueue;
use cellmesh_cell::queue::embedded::EmbeddedQueue;
use cellmesh_cell::queue::kafka::KafkaQueue;
use cellmesh_cell::storage::Store;
use cellmesh_proto::storage::v1::{OutboxEvent, QueuedEvent};
use cellmesh_tests::backends::Kafka;
use cellmesh_tests::test_config;
use tokio::sync::Notify;

/// Far longer than the test may take: only the wake can end the wait.
const LONG_WAIT: Duration = Duration::from_secs(120);

async fn woken_wait_ends_and_takes_nothing(kafka: Option<&Kafka>) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    if let Some(k) = kafka {
        k.configure(&mut config);
    }
    let queue: Arc<dyn EventQueue> = match kafka {
        None => {
            let store = Store::open(&dir.path().join("db"), &config.storage).unwrap();
            Arc::new(EmbeddedQueue::open(store).unwrap())
        }
        Some(_) => Arc::new(KafkaQueue::connect(&config).await.unwrap()),
    };
    let mut consumer = queue.consumer(&config.processor_group()).await.unwrap();
    let wake = Arc::new(Notify::new());
    let waker = tokio::spawn({
        let wake = wake.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            wake.notify_one();
        }
    });
    let started = Instant::now();
    let got = tokio::time::timeout(
        Duration::from_secs(30),
        consumer.poll_or_woken(10, LONG_WAIT, &wake),
    )
    .await
    .expect("the wake ends the wait")
    .unwrap();
    assert!(got.is_empty(), "nothing was published");
    assert!(started.elapsed() >= Duration::from_millis(250), "it waited");
    waker.await.unwrap();

    queue
        .publish(vec![QueuedEvent {
            id: 1,
            event: Some(OutboxEvent {
                conversation_id: 7,
                ..Default::default()
            }),
        }])
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut next = Vec::new();
    while next.is_empty() && Instant::now() < deadline {
        next = consumer
            .poll_or_woken(10, Duration::from_millis(500), &Notify::new())
            .await
            .unwrap();
    }
    let ids: Vec<u64> = next.iter().map(|d| d.event.id).collect();
    assert_eq!(ids, vec![1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_poll_ends_and_takes_nothing_embedded() {
    woken_wait_ends_and_takes_nothing(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_poll_ends_and_takes_nothing_kafka() {
    let kafka = Kafka::start(1);
    woken_wait_ends_and_takes_nothing(Some(&kafka)).await;
}

/// The embedded log serves the processor and the search indexer: one group
/// committing far ahead trims nothing the other has not processed.
#[tokio::test]
async fn a_trim_waits_for_every_group() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.queue.partitions = 1;
    let store = Store::open(&dir.path().join("db"), &config.storage).unwrap();
    let (fast, slow) = ("processor".to_string(), "processor.search".to_string());
    let queue = EmbeddedQueue::open(store)
        .unwrap()
        .with_groups(vec![fast.clone(), slow.clone()]);
    let events = (1..=10_000)
        .map(|id| QueuedEvent {
            id,
            event: Some(OutboxEvent {
                conversation_id: 7,
                ..Default::default()
            }),
        })
        .collect::<Vec<_>>();
    queue.publish(events).await.unwrap();
    let mut ahead = queue.consumer(&fast).await.unwrap();
    let mut behind = queue.consumer(&slow).await.unwrap();
    let first = behind.poll(100, Duration::ZERO).await.unwrap();
    behind.commit(&first).await.unwrap();
    // Past two trim points.
    loop {
        let got = ahead.poll(2_000, Duration::ZERO).await.unwrap();
        if got.is_empty() {
            break;
        }
        ahead.commit(&got).await.unwrap();
    }
    let mut seen = first.len();
    loop {
        let got = behind.poll(2_000, Duration::ZERO).await.unwrap();
        if got.is_empty() {
            break;
        }
        assert_eq!(got[0].offset, seen as u64 + 1, "nothing skipped");
        seen += got.len();
        behind.commit(&got).await.unwrap();
    }
    assert_eq!(seen, 10_000);
}
