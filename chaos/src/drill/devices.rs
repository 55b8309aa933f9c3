//! The drill's devices: two devices of one member of each tenant the drill
//! writes to (the same user id in every tenant) subscribe through the
//! edges (one each when there are several) for the whole drill, resubscribe
//! from their last pts and queue whenever a stream ends, ack every few
//! events, and record every delivery, every rebase and every cursor the
//! server confirms — what the device invariants are checked on. They run
//! until the drill stops them: after the senders, once they have caught up
//! (or the drill gave up waiting).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::history::{CursorAck, DeliveryRecord, Device as Followed, History};
use crate::invariants::undelivered;
use cellmesh_proto::v1::sync_client::SyncClient;
use cellmesh_proto::v1::{AckRequest, SubscribeRequest, sync_push};
use tonic::transport::Channel;

use super::workload::now_ms;
use crate::target::DevTarget;

/// Events between two acks of a device.
const ACK_EVERY: u64 = 10;
/// How long the devices may take to catch up once the deployment settled.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(30);
/// A device that has received nothing for this long subscribes again.
const IDLE_RESUBSCRIBE: Duration = Duration::from_secs(3);
/// The devices' names.
const NAMES: [&str; 2] = ["phone", "laptop"];

/// What the devices recorded.
#[derive(Default)]
pub struct DeviceLog {
    pub deliveries: Vec<DeliveryRecord>,
    pub cursor_acks: Vec<CursorAck>,
    /// Each device with the conversations owed to it and its rebases.
    pub devices: Vec<Followed>,
    /// Times a device heard nothing for [`IDLE_RESUBSCRIBE`] and subscribed
    /// again (a stream that went quiet while events were owed shows here).
    pub idle_resubscribes: usize,
}

impl DeviceLog {
    fn followed(&mut self, tenant: u64, user: u64, name: &str) -> &mut Followed {
        let i = (self.devices.iter())
            .position(|d| (d.tenant, d.user) == (tenant, user) && d.device == name)
            .expect("every device is listed at its start");
        &mut self.devices[i]
    }
}

/// One task per device of `user` of `tenant`, a member of
/// `conversations`, running until `stop` is set.
pub fn start(
    dev: Arc<DevTarget>,
    channels: &[Channel],
    (tenant, user, conversations): (u64, u64, &[u64]),
    epoch: Instant,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<DeviceLog>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    log.lock()
        .expect("device log")
        .devices
        .extend(NAMES.iter().map(|name| Followed {
            tenant,
            user,
            device: name.to_string(),
            conversations: conversations.to_vec(),
            rebases_ms: Vec::new(),
        }));
    NAMES
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let device = Device {
                dev: dev.clone(),
                sync: SyncClient::new(channels[i % channels.len()].clone()),
                tenant,
                user,
                name: name.to_string(),
                epoch,
                log: log.clone(),
            };
            tokio::spawn(device.run(stop.clone()))
        })
        .collect()
}

/// Waits until every message acknowledged in `history` reached the
/// devices, or [`CATCH_UP_LIMIT`]; when (drill time) the last of them arrived.
pub async fn wait_caught_up(history: &History, log: &Mutex<DeviceLog>) -> Option<u64> {
    let deadline = Instant::now() + CATCH_UP_LIMIT;
    let mut snapshot = History {
        sends: history.sends.clone(),
        ..History::default()
    };
    loop {
        {
            let log = log.lock().expect("device log");
            snapshot.deliveries.clone_from(&log.deliveries);
            snapshot.devices.clone_from(&log.devices);
        }
        let owed = undelivered(&snapshot).len();
        if owed == 0 {
            return Some(super::report::caught_up_at(&snapshot).unwrap_or(0));
        }
        if Instant::now() >= deadline {
            println!("  devices still miss {owed} deliveries; the drill stops waiting");
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

struct Device {
    dev: Arc<DevTarget>,
    sync: SyncClient<Channel>,
    tenant: u64,
    user: u64,
    name: String,
    epoch: Instant,
    log: Arc<Mutex<DeviceLog>>,
}

impl Device {
    /// `message` as this device, with its token.
    fn request<T>(&self, message: T) -> tonic::Request<T> {
        self.dev
            .request_in(self.tenant, message, self.user, &self.name)
    }

    async fn run(mut self, stop: Arc<AtomicBool>) {
        let (mut pts, mut queue, mut session, mut unacked) = (0u64, 0u64, 0u64, 0u64);
        let running = || !stop.load(Ordering::Relaxed);
        while running() {
            session += 1;
            let request = SubscribeRequest {
                caller: None,
                from_pts: pts,
                queue_id: queue,
            };
            let subscribe = self.sync.subscribe(self.request(request));
            let mut stream = match tokio::time::timeout(Duration::from_secs(5), subscribe).await {
                Ok(Ok(s)) => s.into_inner(),
                _ => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let mut heard = Instant::now();
            loop {
                let next = tokio::time::timeout(Duration::from_millis(500), stream.message());
                let push = match next.await {
                    // A client that has heard nothing for a while checks
                    // its stream by subscribing again from its cursor.
                    Err(_) if running() && heard.elapsed() >= IDLE_RESUBSCRIBE => {
                        self.log.lock().expect("device log").idle_resubscribes += 1;
                        break;
                    }
                    Err(_) if running() => continue,
                    Ok(Ok(Some(push))) => push,
                    // Ended, failed, or the drill is over.
                    _ => break,
                };
                match push.push {
                    Some(sync_push::Push::Event(e)) => {
                        heard = Instant::now();
                        (pts, queue) = (e.pts, e.queue_id);
                        self.log
                            .lock()
                            .expect("device log")
                            .deliveries
                            .push(DeliveryRecord {
                                tenant: self.tenant,
                                user: self.user,
                                device: self.name.clone(),
                                session,
                                pts: e.pts,
                                conversation: e.conversation_id,
                                seq: e.seq,
                                kind: e.kind,
                                queue: e.queue_id,
                                at_ms: now_ms(self.epoch),
                            });
                        unacked += 1;
                        if unacked >= ACK_EVERY {
                            unacked = 0;
                            self.ack(pts, queue).await;
                        }
                    }
                    Some(sync_push::Push::Rebase(r)) => {
                        (pts, queue) = (r.latest_pts, r.queue_id);
                        let at = now_ms(self.epoch);
                        let mut log = self.log.lock().expect("device log");
                        log.followed(self.tenant, self.user, &self.name)
                            .rebases_ms
                            .push(at);
                    }
                    _ => {}
                }
            }
        }
    }

    async fn ack(&mut self, pts: u64, queue_id: u64) {
        let request = AckRequest {
            caller: None,
            pts,
            queue_id,
        };
        let request = self.request(request);
        if let Ok(Ok(ack)) =
            tokio::time::timeout(Duration::from_secs(5), self.sync.ack(request)).await
        {
            let ack = ack.into_inner();
            self.log
                .lock()
                .expect("device log")
                .cursor_acks
                .push(CursorAck {
                    tenant: self.tenant,
                    user: self.user,
                    device: self.name.clone(),
                    at_ms: now_ms(self.epoch),
                    cursor: ack.cursor,
                    queue: ack.queue_id,
                });
        }
    }
}

/// How long a drill waits for fan-out to work before its first fault.
const WARM_UP_LIMIT: Duration = Duration::from_secs(60);

/// Waits until `user`'s sync queue has an event about every one of
/// `conversations` (the processor fans their creation out), so faults hit
/// a deployment whose fan-out works, not one still starting (a Kafka
/// consumer group's first join, say); how long that took.
pub async fn wait_for_fan_out(
    dev: &DevTarget,
    channel: &Channel,
    user: u64,
    conversations: &[u64],
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut sync = SyncClient::new(channel.clone());
    let mut pending: std::collections::HashSet<u64> = conversations.iter().copied().collect();
    let (mut from_pts, mut queue_id) = (0, 0);
    while !pending.is_empty() {
        if started.elapsed() >= WARM_UP_LIMIT {
            anyhow::bail!(
                "fan-out delivered nothing about {} of the drill's conversations to user {user} within {WARM_UP_LIMIT:?}; no fault was injected",
                pending.len()
            );
        }
        let request = SubscribeRequest {
            caller: None,
            from_pts,
            queue_id,
        };
        let call = sync.subscribe(dev.request_as(request, user, "drill-warm-up"));
        let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(5), call).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut stream = stream.into_inner();
        while let Ok(Ok(Some(push))) =
            tokio::time::timeout(Duration::from_secs(1), stream.message()).await
        {
            match push.push {
                Some(sync_push::Push::Event(e)) => {
                    pending.remove(&e.conversation_id);
                }
                // A long queue (earlier drills): read just its end, where
                // the new conversations' events are.
                Some(sync_push::Push::Rebase(r)) => {
                    (from_pts, queue_id) = (r.latest_pts.saturating_sub(WARM_UP_TAIL), r.queue_id);
                    break;
                }
                _ => {}
            }
            if pending.is_empty() {
                break;
            }
        }
    }
    Ok(started.elapsed())
}

/// Events from the end of a long queue the warm-up reads (below any
/// sensible rebase threshold).
const WARM_UP_TAIL: u64 = 64;
