//! The Kafka queue through a broker outage: the consumer neither fails nor
//! leaves its group while the broker is away (a new member would make the
//! group wait out the old one's session), commits lost to the outage are
//! not errors, and it carries on in order once the broker is back.

use std::time::{Duration, Instant};

use cellmesh_cell::queue::kafka::{KafkaConsumer, KafkaQueue};
use cellmesh_cell::queue::{Delivery, EventConsumer, EventQueue};
use cellmesh_proto::storage::v1::{OutboxEvent, QueuedEvent};
use cellmesh_tests::backends::Kafka;
use cellmesh_tests::test_config;

fn events(ids: std::ops::RangeInclusive<u64>) -> Vec<QueuedEvent> {
    ids.map(|id| QueuedEvent {
        id,
        event: Some(OutboxEvent {
            conversation_id: 7,
            ..Default::default()
        }),
    })
    .collect()
}

/// Polls until `n` deliveries arrived (or 30 s passed).
async fn take(consumer: &mut KafkaConsumer, n: usize) -> Vec<Delivery> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = Vec::new();
    while got.len() < n && Instant::now() < deadline {
        let batch = consumer
            .poll(n - got.len(), Duration::from_millis(200))
            .await
            .expect("polling does not fail");
        got.extend(batch);
    }
    got
}

#[tokio::test]
async fn a_consumer_rides_out_a_broker_outage() {
    let kafka = Kafka::start(1);
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    kafka.configure(&mut config);
    let queue = KafkaQueue::connect(&config).await.unwrap();
    let mut consumer = queue.join(&config.processor_group()).unwrap();

    queue.publish(events(1..=5)).await.unwrap();
    let first = take(&mut consumer, 5).await;
    let ids = |d: &[Delivery]| d.iter().map(|d| d.event.id).collect::<Vec<_>>();
    assert_eq!(ids(&first), vec![1, 2, 3, 4, 5]);
    consumer.commit(&first).await.unwrap();

    kafka.cluster.broker_down(1).unwrap();
    let outage = Instant::now() + Duration::from_secs(2);
    while Instant::now() < outage {
        let got = consumer
            .poll(10, Duration::from_millis(100))
            .await
            .expect("a broker outage is not a consumer failure");
        assert!(got.is_empty(), "nothing new was published");
    }
    consumer
        .commit(&first)
        .await
        .expect("a commit lost to the outage is not an error");

    kafka.cluster.broker_up(1).unwrap();
    queue.publish(events(6..=10)).await.unwrap();
    let rest = take(&mut consumer, 5).await;
    assert_eq!(ids(&rest), vec![6, 7, 8, 9, 10], "in order, none lost");
}
