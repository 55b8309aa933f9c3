//! The drill's devices: two devices of one member subscribe through the
//! edges (one each when there are several) for the whole drill, resubscribe
//! from their last pts and queue whenever a stream ends, ack every few
//! events, and record every delivery and every cursor the server confirms —
//! what the device-order and cursor invariants are checked on.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellmesh_chaos::history::{CursorAck, DeliveryRecord};
use cellmesh_proto::v1::sync_client::SyncClient;
use cellmesh_proto::v1::{AckRequest, SubscribeRequest, sync_push};
use tonic::transport::Channel;

use super::workload::now_ms;
use crate::devtarget::DevTarget;

/// Events between two acks of a device.
const ACK_EVERY: u64 = 10;

/// What the devices recorded.
#[derive(Default)]
pub struct DeviceLog {
    pub deliveries: Vec<DeliveryRecord>,
    pub cursor_acks: Vec<CursorAck>,
}

/// One task per device of `user`, running until `until`.
pub fn start(
    dev: Arc<DevTarget>,
    channels: &[Channel],
    user: u64,
    epoch: Instant,
    until: Instant,
    log: Arc<Mutex<DeviceLog>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    ["phone", "laptop"]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let device = Device {
                dev: dev.clone(),
                sync: SyncClient::new(channels[i % channels.len()].clone()),
                user,
                name: name.to_string(),
                epoch,
                log: log.clone(),
            };
            tokio::spawn(device.run(until))
        })
        .collect()
}

struct Device {
    dev: Arc<DevTarget>,
    sync: SyncClient<Channel>,
    user: u64,
    name: String,
    epoch: Instant,
    log: Arc<Mutex<DeviceLog>>,
}

impl Device {
    async fn run(mut self, until: Instant) {
        let (mut pts, mut queue, mut session, mut unacked) = (0u64, 0u64, 0u64, 0u64);
        while Instant::now() < until {
            session += 1;
            let request = SubscribeRequest {
                caller: None,
                from_pts: pts,
                queue_id: queue,
            };
            let subscribe = self
                .sync
                .subscribe(self.dev.request_as(request, self.user, &self.name));
            let mut stream = match tokio::time::timeout(Duration::from_secs(5), subscribe).await {
                Ok(Ok(s)) => s.into_inner(),
                _ => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            loop {
                let next = tokio::time::timeout(Duration::from_millis(500), stream.message());
                let push = match next.await {
                    Err(_) if Instant::now() < until => continue,
                    Ok(Ok(Some(push))) => push,
                    // Ended, failed, or the drill is over.
                    _ => break,
                };
                match push.push {
                    Some(sync_push::Push::Event(e)) => {
                        (pts, queue) = (e.pts, e.queue_id);
                        self.log
                            .lock()
                            .expect("device log")
                            .deliveries
                            .push(DeliveryRecord {
                                user: self.user,
                                device: self.name.clone(),
                                session,
                                pts: e.pts,
                                conversation: e.conversation_id,
                                seq: e.seq,
                                kind: e.kind,
                                queue: e.queue_id,
                            });
                        unacked += 1;
                        if unacked >= ACK_EVERY {
                            unacked = 0;
                            self.ack(pts, queue).await;
                        }
                    }
                    Some(sync_push::Push::Rebase(r)) => (pts, queue) = (r.latest_pts, r.queue_id),
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
        let request = self.dev.request_as(request, self.user, &self.name);
        if let Ok(Ok(ack)) =
            tokio::time::timeout(Duration::from_secs(5), self.sync.ack(request)).await
        {
            let ack = ack.into_inner();
            self.log
                .lock()
                .expect("device log")
                .cursor_acks
                .push(CursorAck {
                    user: self.user,
                    device: self.name.clone(),
                    at_ms: now_ms(self.epoch),
                    cursor: ack.cursor,
                    queue: ack.queue_id,
                });
        }
    }
}
