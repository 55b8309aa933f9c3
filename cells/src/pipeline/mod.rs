//! The asynchronous half of the cell: after a write is acknowledged, the
//! [`processor`] reads its event from the queue (on the embedded queue, the
//! outbox itself; on Kafka, where the outbox [`relay`] publishes it) and
//! fans it out to users' sync queues; [`notify`] delivers notifications for
//! users with no online device; two [`forward`]ers deliver events to users'
//! home cells and copies to this cell's standbys, each from its own queue. Each loop runs under a supervisor that
//! restarts it after an error.

pub mod deliver_stream;
pub mod destination;
pub mod drain;
pub mod forward;
pub mod notify;
pub mod plan;
pub mod processor;
pub mod relay;
mod standby;
mod supervise;
mod traced;

pub(crate) use supervise::supervise;
use supervise::supervise_alone;

use std::sync::Arc;
use std::time::Duration;

use cellmesh_proto::storage::v1::IdempotencyRecord;
use cellmesh_proto::v1::{ConversationMeta, PeerEvent, PeerEventRole};
use tokio::sync::{Mutex, Notify, mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::clock::Clock;
use crate::config::CellConfig;
use crate::homes::Homes;
use crate::queue::{EventQueue, QueueError};
use crate::storage::{ForwardQueue, StorageError, Store};
use crate::sync::Hub;
use cellmesh_proto::secret::ClusterSecret;
pub use processor::{Delivered, UserImport};
use processor::{Inbound, Processor, Signals};

/// What a forwarded event is for: its explicit role, or for a sender
/// before 0.3.0 (no role), the payload it carries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Purpose<'a> {
    /// A user's sync event, for the user's home cell.
    User,
    /// The conversation's meta and members, for the owner's standby.
    Meta(&'a ConversationMeta),
    /// The stored answer to a send, for the owner's standby.
    Answer(&'a IdempotencyRecord),
    /// A standby role without its payload, or a role this build does not
    /// know: refused as a standby copy would be, never applied.
    Malformed,
}

/// The [`Purpose`] of `e`.
pub fn purpose(e: &PeerEvent) -> Purpose<'_> {
    match PeerEventRole::try_from(e.role) {
        Ok(PeerEventRole::User) => Purpose::User,
        Ok(PeerEventRole::StandbyMeta) => e.meta.as_ref().map_or(Purpose::Malformed, Purpose::Meta),
        Ok(PeerEventRole::StandbyAnswer) => {
            (e.idempotency.as_ref()).map_or(Purpose::Malformed, Purpose::Answer)
        }
        Ok(PeerEventRole::Unspecified) => match (&e.meta, &e.idempotency) {
            (Some(meta), _) => Purpose::Meta(meta),
            (None, Some(answer)) => Purpose::Answer(answer),
            (None, None) => Purpose::User,
        },
        Err(_) => Purpose::Malformed,
    }
}

/// Whether a forwarded event is for the standby it was addressed to
/// rather than for a user's home (a malformed one is judged as a standby
/// copy: only its sender's standby role could make it one).
pub fn for_standby(e: &PeerEvent) -> bool {
    purpose(e) != Purpose::User
}

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error("the processor is not running")]
    Stopped,
    #[error(transparent)]
    Search(#[from] crate::search::SearchError),
    #[error("reading history: {0}")]
    History(Box<crate::error::CellError>),
}

/// Hands work to the processor (the only writer of sync queues) and waits
/// until it is durable. Each job wakes a processor waiting on an empty
/// queue, so it is taken at once, not when that wait runs out.
#[derive(Clone)]
pub struct PeerInbound {
    jobs: mpsc::Sender<Inbound>,
    wake: Arc<Notify>,
}

impl PeerInbound {
    /// Applies events delivered by `source` ("" = this cell); `view_behind`:
    /// this cell's route view has not reached the sender's (replicated
    /// events it would refuse are deferred, not refused).
    pub async fn deliver(
        &self,
        source: String,
        events: Vec<PeerEvent>,
        view_behind: bool,
    ) -> Result<Delivered, PipelineError> {
        let (reply, rx) = oneshot::channel();
        self.send(Inbound::Deliver {
            source,
            events,
            view_behind,
            reply,
        })
        .await?;
        rx.await.map_err(|_| PipelineError::Stopped)?
    }

    /// Stores copied parts of moving users' homes (distinct users), in
    /// one commit.
    pub async fn import_users(&self, imports: Vec<UserImport>) -> Result<(), PipelineError> {
        let (reply, rx) = oneshot::channel();
        self.send(Inbound::ImportUsers { imports, reply }).await?;
        rx.await.map_err(|_| PipelineError::Stopped)?
    }

    /// Returns once every batch the processor took before is durable.
    pub async fn barrier(&self) -> Result<(), PipelineError> {
        let (reply, rx) = oneshot::channel();
        self.send(Inbound::Barrier { reply }).await?;
        rx.await.map_err(|_| PipelineError::Stopped)
    }

    async fn send(&self, job: Inbound) -> Result<(), PipelineError> {
        self.jobs
            .send(job)
            .await
            .map_err(|_| PipelineError::Stopped)?;
        self.wake.notify_one();
        Ok(())
    }
}

impl crate::sync::moving::ProcessorBarrier for PeerInbound {
    fn barrier(
        &self,
    ) -> futures::future::BoxFuture<'_, Result<(), crate::sync::moving::BarrierError>> {
        Box::pin(async { Ok(PeerInbound::barrier(self).await?) })
    }
}

/// The running pipeline.
pub struct Pipeline {
    pub workers: Vec<JoinHandle<()>>,
    pub inbound: PeerInbound,
    /// What a graceful stop waits for.
    pub drain: drain::Drain,
}

/// Starts the relay (for a queue that does not read the outbox), the processor, the notifier and the forwarder.
pub fn spawn(
    config: &CellConfig,
    store: Arc<Store>,
    queue: Arc<dyn EventQueue>,
    hub: Arc<Hub>,
    clock: Arc<dyn Clock>,
    homes: Arc<dyn Homes>,
) -> Pipeline {
    let signals = Signals::default();
    let group = config.processor_group();
    // Where the processor stands before it takes anything.
    let applied = match queue.reads_outbox() {
        true => store.queue_offset(&group, crate::queue::embedded::OUTBOX_PARTITION),
        false => store.relay_cursor(),
    };
    signals.processed.send_replace(applied.unwrap_or(0));
    let drain = drain::Drain {
        store: store.clone(),
        processed: signals.processed.subscribe(),
    };
    let (inbound_tx, inbound_rx) = mpsc::channel::<Inbound>(64);
    let wake = Arc::new(Notify::new());
    // Survives processor restarts.
    let inbound_rx = Arc::new(Mutex::new(inbound_rx));
    let relay = (!queue.reads_outbox()).then(|| {
        let (store, queue) = (store.clone(), queue.clone());
        supervise("relay", move || relay::run(store.clone(), queue.clone()))
    });
    let threshold = config.fanout.large_group_threshold as usize;
    let batch = config.fanout.batch;
    let log = notify::direct_log(&config.notifications);
    let hints = crate::sync::HintPacer::start(
        hub.clone(),
        Duration::from_millis(config.fanout.hint_interval_ms),
    );
    let processor = {
        let (store, queue, hub, clock, homes, signals) = (
            store.clone(),
            queue.clone(),
            hub.clone(),
            clock.clone(),
            homes.clone(),
            signals.clone(),
        );
        let (cell_id, wake) = (config.cell_id.clone(), wake.clone());
        let log = log.clone();
        let nice = config.storage.fanout_nice;
        supervise_alone("processor", nice, move || {
            let hints = hints.clone();
            let (store, queue, hub, clock, homes, signals, group, inbound, cell_id) = (
                store.clone(),
                queue.clone(),
                hub.clone(),
                clock.clone(),
                homes.clone(),
                signals.clone(),
                group.clone(),
                inbound_rx.clone(),
                cell_id.clone(),
            );
            let wake = wake.clone();
            let log = log.clone();
            async move {
                let consumer = queue.consumer(&group).await?;
                let mut inbound = inbound.lock().await;
                Processor::new(store, hub, clock, threshold, homes, signals, cell_id)?
                    .notifying_the_log(log)
                    .pacing_hints(hints)
                    .run(consumer, batch, &mut inbound, &wake)
                    .await
            }
        })
    };
    let notifier = {
        let sink = notify::sink(&config.notifications);
        let (store, signal) = (store.clone(), signals.notifications.clone());
        supervise("notifier", move || {
            notify::run(store.clone(), sink.clone(), signal.clone())
        })
    };
    let inbound = PeerInbound {
        jobs: inbound_tx,
        wake,
    };
    // One forwarder per queue: standbys never hold up users' events.
    let forwarder = |queue, signal: &Arc<Notify>, name| {
        let forwarder = Arc::new(forward::Forwarder {
            store: store.clone(),
            queue,
            signal: signal.clone(),
            cell_id: config.cell_id.clone(),
            secret: ClusterSecret::new(&config.routing.cluster_secret),
            peers: config.routing.peers(),
            homes: homes.clone(),
            local: inbound.clone(),
        });
        supervise(name, move || forwarder.clone().run())
    };
    let to_homes = forwarder(ForwardQueue::Homes, &signals.forwards, "forwarder");
    let to_standbys = forwarder(
        ForwardQueue::Standbys,
        &signals.standby_forwards,
        "standby forwarder",
    );
    Pipeline {
        workers: [
            relay,
            Some(processor),
            Some(notifier),
            Some(to_homes),
            Some(to_standbys),
        ]
        .into_iter()
        .flatten()
        .collect(),
        inbound,
        drain,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(role: PeerEventRole, meta: bool, answer: bool) -> PeerEvent {
        PeerEvent {
            role: role as i32,
            meta: meta.then(ConversationMeta::default),
            idempotency: answer.then(IdempotencyRecord::default),
            ..Default::default()
        }
    }

    #[test]
    fn an_explicit_role_decides_what_an_event_is_for() {
        let user_with_meta = event(PeerEventRole::User, true, true);
        assert_eq!(purpose(&user_with_meta), Purpose::User);
        assert!(!for_standby(&user_with_meta));
        let meta = event(PeerEventRole::StandbyMeta, true, true);
        assert!(matches!(purpose(&meta), Purpose::Meta(_)));
        let answer = event(PeerEventRole::StandbyAnswer, true, true);
        assert!(matches!(purpose(&answer), Purpose::Answer(_)));
    }

    #[test]
    fn a_standby_role_without_its_payload_or_an_unknown_role_is_malformed() {
        assert_eq!(
            purpose(&event(PeerEventRole::StandbyMeta, false, true)),
            Purpose::Malformed
        );
        assert_eq!(
            purpose(&event(PeerEventRole::StandbyAnswer, true, false)),
            Purpose::Malformed
        );
        let unknown = PeerEvent {
            role: 99,
            ..Default::default()
        };
        assert_eq!(purpose(&unknown), Purpose::Malformed);
        assert!(for_standby(&unknown), "never applied as a user's event");
    }

    #[test]
    fn an_event_from_a_sender_without_roles_is_told_by_its_payload() {
        let u = PeerEventRole::Unspecified;
        assert!(matches!(purpose(&event(u, true, false)), Purpose::Meta(_)));
        assert!(matches!(
            purpose(&event(u, false, true)),
            Purpose::Answer(_)
        ));
        assert_eq!(purpose(&event(u, false, false)), Purpose::User);
    }
}
