//! The Kafka backend: one topic per cell, keyed (so partitioned) by
//! conversation; the idempotent producer keeps each partition in publish
//! order; the cell's processors form one consumer group with auto-commit
//! off, committing offsets (asynchronously) only after the effects are
//! durable. Broker outages are ridden out, not reported as failures: the
//! client reconnects by itself, and a commit lost meanwhile only means
//! records are applied again, which the processor does idempotently.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cellmesh_proto::storage::v1::QueuedEvent;
use prost::Message as _;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message as _;
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::Notify;

use super::{Delivery, EventConsumer, EventQueue, QueueError, last_offsets};
use crate::config::{CellConfig, KafkaConfig};

/// How long a publish may wait for the brokers before it fails (and the
/// relay retries it).
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on topic metadata and creation requests at start.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

pub struct KafkaQueue {
    producer: FutureProducer,
    topic: String,
    settings: KafkaConfig,
}

fn kafka(e: impl std::fmt::Display) -> QueueError {
    QueueError::Kafka(e.to_string())
}

impl KafkaQueue {
    /// Connects, creating the cell's topic if it does not exist.
    pub async fn connect(config: &CellConfig) -> Result<Self, QueueError> {
        let settings = config.queue.kafka.clone();
        let topic = config.kafka_topic();
        ensure_topic(&settings, &topic, config.queue.partitions).await?;
        let producer: FutureProducer = client(&settings)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "1")
            .set(
                "message.timeout.ms",
                PUBLISH_TIMEOUT.as_millis().to_string(),
            )
            .set(
                "request.timeout.ms",
                settings.request_timeout_ms.to_string(),
            )
            .create()
            .map_err(kafka)?;
        Ok(Self {
            producer,
            topic,
            settings,
        })
    }

    /// Joins `group` as a new consumer; `consumer()` of the trait uses the
    /// configured group name.
    pub fn join(&self, group: &str) -> Result<KafkaConsumer, QueueError> {
        let session_timeout_ms = self.settings.session_timeout_ms;
        let consumer: StreamConsumer = client(&self.settings)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", session_timeout_ms.to_string())
            .set(
                "heartbeat.interval.ms",
                (session_timeout_ms / 4).max(100).to_string(),
            )
            .create()
            .map_err(kafka)?;
        consumer.subscribe(&[&self.topic]).map_err(kafka)?;
        Ok(KafkaConsumer {
            consumer: ClosedApart(Some(consumer)),
            topic: self.topic.clone(),
            warned: None,
        })
    }
}

/// What every client of the cell shares: the brokers; reconnecting to a
/// broker that was away within a second of its return (librdkafka's
/// default backs off up to 10 s, which a queue outage then adds to); and
/// giving up on an unanswered request (a heartbeat, an offset commit)
/// after `request_timeout_ms` rather than librdkafka's 60 s — a request
/// lost with a broker connection otherwise holds a consumer's rejoin that
/// long.
fn client(settings: &KafkaConfig) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &settings.brokers)
        .set("reconnect.backoff.max.ms", RECONNECT_BACKOFF_MAX_MS)
        .set("socket.timeout.ms", settings.request_timeout_ms.to_string());
    config
}

/// See [`client`].
const RECONNECT_BACKOFF_MAX_MS: &str = "1000";

async fn ensure_topic(
    settings: &KafkaConfig,
    topic: &str,
    partitions: u32,
) -> Result<(), QueueError> {
    let admin: AdminClient<DefaultClientContext> = client(settings).create().map_err(kafka)?;
    let admin = Arc::new(admin);
    let (probe, name) = (admin.clone(), topic.to_string());
    let existing = tokio::task::spawn_blocking(move || {
        probe
            .inner()
            .fetch_metadata(Some(&name), ADMIN_TIMEOUT)
            .map(|m| {
                m.topics()
                    .iter()
                    .any(|t| t.error().is_none() && !t.partitions().is_empty())
            })
    })
    .await
    .map_err(kafka)?
    .map_err(kafka)?;
    if existing {
        return Ok(());
    }
    // Operators may pre-create the topic (and brokers may refuse creation);
    // a failure here is reported, and publishing will tell if it matters.
    let new = NewTopic::new(topic, partitions as i32, TopicReplication::Fixed(1));
    let options = AdminOptions::new().request_timeout(Some(ADMIN_TIMEOUT));
    match admin.create_topics([&new], &options).await {
        Ok(results) => {
            for result in results {
                match result {
                    Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                    Err((name, code)) => {
                        tracing::warn!(topic = %name, %code, "cannot create topic")
                    }
                }
            }
        }
        Err(e) => tracing::warn!(topic, error = %e, "cannot create topic"),
    }
    Ok(())
}

#[tonic::async_trait]
impl EventQueue for KafkaQueue {
    async fn publish(&self, events: Vec<QueuedEvent>) -> Result<(), QueueError> {
        let sends = events.iter().map(|event| {
            let key = event
                .event
                .as_ref()
                .map_or(0, |e| e.conversation_id)
                .to_be_bytes();
            // The trace context travels as a record header, as Kafka tools
            // expect it, not in the payload.
            let mut event = event.clone();
            let traceparent = event
                .event
                .as_mut()
                .map(|e| std::mem::take(&mut e.traceparent))
                .unwrap_or_default();
            let payload = event.encode_to_vec();
            let producer = self.producer.clone();
            let topic = self.topic.clone();
            async move {
                let mut record = FutureRecord::to(&topic).key(&key[..]).payload(&payload);
                if !traceparent.is_empty() {
                    record = record.headers(OwnedHeaders::new().insert(Header {
                        key: TRACEPARENT,
                        value: Some(traceparent.as_bytes()),
                    }));
                }
                producer
                    .send(record, PUBLISH_TIMEOUT)
                    .await
                    .map(|_| ())
                    .map_err(|(e, _)| kafka(e))
            }
        });
        // Sent concurrently; per-partition order holds because the producer
        // is idempotent (ordered retries) and records are enqueued in order.
        for result in futures::future::join_all(sends).await {
            result?;
        }
        Ok(())
    }

    async fn consumer(&self, group: &str) -> Result<Box<dyn EventConsumer>, QueueError> {
        Ok(Box::new(self.join(group)?))
    }
}

pub struct KafkaConsumer {
    consumer: ClosedApart,
    topic: String,
    /// When consumption errors were last logged.
    warned: Option<Instant>,
}

/// A consumer that leaves its group on a thread of its own once dropped,
/// waited for at most [`CLOSE_WAIT`]. librdkafka's close waits for the
/// group's coordinator for as long as it takes: dropped where it was used
/// (a runtime worker), a consumer whose brokers were gone held the worker,
/// and the cell's stop, for good (seen with the mock cluster of a
/// `cellmesh dev` that was killed). With the brokers there the close
/// finishes within the wait, as it did where it was dropped; without them
/// the thread goes on alone and ends when they answer, or with the
/// process.
struct ClosedApart(Option<StreamConsumer>);

/// How long dropping a consumer waits for it to leave its group.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

impl std::ops::Deref for ClosedApart {
    type Target = StreamConsumer;

    fn deref(&self) -> &StreamConsumer {
        // Taken only by `drop`.
        self.0.as_ref().expect("a consumer until dropped")
    }
}

impl Drop for ClosedApart {
    fn drop(&mut self) {
        let Some(consumer) = self.0.take() else {
            return;
        };
        let (done, closed) = std::sync::mpsc::channel();
        let closing = std::thread::Builder::new()
            .name("kafka-close".into())
            .spawn(move || {
                drop(consumer);
                let _ = done.send(());
            });
        match closing {
            Ok(_) => {
                if closed.recv_timeout(CLOSE_WAIT).is_err() {
                    tracing::warn!(
                        wait = ?CLOSE_WAIT,
                        "a kafka consumer has not left its group (are the brokers gone?): it goes on leaving in the background"
                    );
                }
            }
            // The consumer was closed here, when the thread's closure was
            // dropped.
            Err(e) => tracing::warn!(error = %e, "no thread to close a kafka consumer on"),
        }
    }
}

impl KafkaConsumer {
    fn delivery(&self, m: &rdkafka::message::BorrowedMessage<'_>) -> Option<Delivery> {
        let event = match QueuedEvent::decode(m.payload().unwrap_or_default()) {
            Ok(mut event) => {
                if let Some(e) = event.event.as_mut() {
                    e.traceparent = traceparent_header(m);
                }
                event
            }
            Err(e) => {
                tracing::error!(partition = m.partition(), offset = m.offset(), error = %e, "skipping malformed queue record");
                QueuedEvent::default()
            }
        };
        Some(Delivery {
            partition: u32::try_from(m.partition()).ok()?,
            offset: u64::try_from(m.offset()).ok()?,
            event,
        })
    }

    /// A consumption error: librdkafka recovers from these itself
    /// (reconnects, finds the new coordinator, rejoins), so the consumer
    /// carries on — failing would make the pipeline build a new group
    /// member and the group wait out the old one's session. Logged at most
    /// every few seconds.
    async fn ride_out(&mut self, e: KafkaError) {
        let now = Instant::now();
        if self.warned.is_none_or(|at| now - at >= ERROR_LOG_EVERY) {
            tracing::warn!(topic = %self.topic, error = %e, "kafka consumer error; the client is recovering");
            self.warned = Some(now);
        }
        tokio::time::sleep(ERROR_PAUSE).await;
    }
}

/// The record header that carries the W3C trace context.
const TRACEPARENT: &str = "traceparent";

fn traceparent_header(m: &rdkafka::message::BorrowedMessage<'_>) -> String {
    m.headers()
        .and_then(|headers| {
            headers
                .iter()
                .find(|h| h.key == TRACEPARENT)
                .and_then(|h| h.value)
                .and_then(|v| std::str::from_utf8(v).ok())
                .map(str::to_string)
        })
        .unwrap_or_default()
}

/// Least time between two warnings of a consumer's errors.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(5);
/// Pause after a consumption error before polling again.
const ERROR_PAUSE: Duration = Duration::from_millis(50);

#[tonic::async_trait]
impl EventConsumer for KafkaConsumer {
    async fn poll_or_woken(
        &mut self,
        max: usize,
        wait: Duration,
        wake: &Notify,
    ) -> Result<Vec<Delivery>, QueueError> {
        let mut out = Vec::new();
        // Giving up on the first message takes nothing from the consumer
        // (as a timeout does); after it, the batch is finished.
        let first = tokio::select! {
            first = tokio::time::timeout(wait, self.consumer.recv()) => first,
            _ = wake.notified() => return Ok(out),
        };
        let first = match first {
            Err(_) => return Ok(out),
            Ok(Err(e)) => {
                self.ride_out(e).await;
                return Ok(out);
            }
            Ok(Ok(m)) => m,
        };
        out.extend(self.delivery(&first));
        drop(first);
        while out.len() < max {
            match tokio::time::timeout(Duration::from_millis(1), self.consumer.recv()).await {
                Ok(Ok(m)) => out.extend(self.delivery(&m)),
                Ok(Err(e)) => {
                    self.ride_out(e).await;
                    break;
                }
                Err(_) => break,
            }
        }
        Ok(out)
    }

    async fn commit(&mut self, deliveries: &[Delivery]) -> Result<(), QueueError> {
        let mut list = TopicPartitionList::new();
        for (partition, offset) in last_offsets(deliveries) {
            list.add_partition_offset(
                &self.topic,
                partition as i32,
                Offset::Offset(offset as i64 + 1),
            )
            .map_err(kafka)?;
        }
        // Asynchronous: processing does not wait for the group coordinator.
        // A commit lost to a broker outage or a rebalance is not an error:
        // a later commit covers these offsets, or the partition's next owner
        // reads them again and the processor applies them idempotently.
        if let Err(e) = self.consumer.commit(&list, CommitMode::Async) {
            self.ride_out(e).await;
        }
        Ok(())
    }
}
