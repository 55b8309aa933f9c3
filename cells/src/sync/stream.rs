//! One device's subscription: its backlog from storage, in pts order, then
//! live events as the processor appends them. The hub subscription is taken
//! before the first storage read, so nothing appended in between is missed.
//! Live events come with the processor's wake-up and are pushed as they are
//! when they follow the cursor exactly; anything else (a gap, a lagging
//! subscription, a bare wake-up past the cursor) is read from storage by
//! pts, so delivery is never reordered or dropped.

use cellmesh_proto::ids::ConversationId;
use std::sync::Arc;

use cellmesh_proto::storage::v1::SyncRecord;
use cellmesh_proto::v1::{Message, Rebase, SyncEvent, SyncEventKind, SyncPush, sync_push};
use prost::Message as _;
use tokio::sync::{broadcast, mpsc};

use super::{Device, HubEvent, Subscription, SyncService};
use crate::convert::message_to_proto;
use crate::error::{CellError, Result};
use crate::storage::Store;
use crate::user::UserKey;
use cellmesh_proto::reason::Reason;

/// Pushes buffered per subscription before the stream applies backpressure.
const PUSH_BUFFER: usize = 256;
/// Sync events read from storage at a time.
const READ_PAGE: usize = 256;
/// How often a live stream checks that its user still lives here.
const HOME_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

pub type PushResult = std::result::Result<SyncPush, tonic::Status>;

impl SyncService {
    /// Starts streaming `device`'s sync queue after `from_pts` (0 = the
    /// device's stored cursor) of queue `queue_id` (0 = this one).
    pub fn subscribe(
        self: &Arc<Self>,
        device: Device,
        from_pts: u64,
        queue_id: u64,
    ) -> Result<mpsc::Receiver<PushResult>> {
        self.check_home(&device.caller, false)?;
        let user = device.caller;
        let subscription =
            self.hub
                .subscribe(user, &device.device)
                .map_err(|_| CellError::RateLimited {
                    scope: "streams",
                    retry_after: std::time::Duration::from_secs(1),
                })?;
        let latest = self.store.user_pts(user)?;
        let asked = match from_pts {
            0 => self.store.device_cursor(user, &device.device)?,
            pts => pts,
        };
        let mut cursor = asked.min(latest);
        let (tx, rx) = mpsc::channel(PUSH_BUFFER);
        // A cursor of another queue (the user's home was failed over and
        // started afresh), or past this queue's end (a device that does not
        // name its queue), means nothing here: the device starts over from
        // the conversation list instead of silently skipping what this
        // queue holds.
        let current = self.store.queue_id(user)?;
        let foreign = queue_id != 0 && current != 0 && queue_id != current;
        if foreign || asked > latest || latest - cursor > self.config.sync.rebase_threshold {
            let rebase = SyncPush {
                push: Some(sync_push::Push::Rebase(Rebase {
                    latest_pts: latest,
                    queue_id: current,
                })),
            };
            // The channel is new and empty: the rebase goes first.
            let _ = tx.try_send(Ok(rebase));
            cursor = latest;
        }
        subscription.take_pushes(tx.clone());
        let service = self.clone();
        tokio::spawn(async move {
            let _online = OnlineDevice::count();
            if let Err(e) = service.stream(&device, cursor, subscription, &tx).await {
                let _ = tx.send(Err(e.into())).await;
            }
        });
        Ok(rx)
    }

    /// Streams until the device goes away; ends with `WRONG_CELL` once the
    /// user's home has moved to another cell (the device reconnects there
    /// and goes on from its cursor), and with `STREAM_SUPERSEDED` once the
    /// same device opened a newer stream.
    async fn stream(
        &self,
        device: &Device,
        mut cursor: u64,
        subscription: Subscription,
        tx: &mpsc::Sender<PushResult>,
    ) -> Result<()> {
        let Subscription {
            rx: mut wake,
            mut superseded,
            ..
        } = subscription;
        let user = device.caller;
        let mut home_check = tokio::time::interval(HOME_CHECK);
        let mut behind = true;
        let mut closing = false;
        loop {
            while behind {
                // Only the user's home pushes: a cell the home moved away
                // from (or is moving to, importing the queue) ends the
                // stream instead of pushing what it holds.
                self.check_home(&device.caller, false)?;
                let page = self.store.sync_after(user, cursor, READ_PAGE)?;
                behind = !page.is_empty();
                let mut events = Vec::with_capacity(page.len());
                for (pts, record) in page {
                    let message = event_message(&self.store, &record)?;
                    events.push((pts, record, message));
                }
                if !self
                    .send_all(user, events.into_iter(), &mut cursor, tx, false)
                    .await?
                {
                    return Ok(());
                }
            }
            if closing {
                return Ok(());
            }
            tokio::select! {
                _ = tx.closed() => return Ok(()),
                Ok(()) = &mut superseded => {
                    return Err(CellError::invalid(
                        Reason::StreamSuperseded,
                        format!("device {:?} opened a newer stream", device.device),
                    ));
                }
                _ = home_check.tick() => self.check_home(&device.caller, false)?,
                event = wake.recv() => match event {
                    Ok(HubEvent::Pts(pts)) => behind = pts > cursor,
                    Ok(HubEvent::Appended(events)) => match events.first() {
                        // Just what follows the cursor: no storage read.
                        Some(first) if first.pts == cursor + 1 => {
                            self.check_home(&device.caller, false)?;
                            let events = events.iter().map(|e| {
                                let message = e.message.as_deref().cloned();
                                (e.pts, e.record.clone(), message)
                            });
                            if !self.send_all(user, events, &mut cursor, tx, true).await? {
                                return Ok(());
                            }
                        }
                        Some(_) => behind = events.last().is_some_and(|e| e.pts > cursor),
                        None => {}
                    },
                    Err(broadcast::error::RecvError::Lagged(_)) => behind = true,
                    // The cell is stopping: push what the device has not
                    // had yet, then end.
                    Err(broadcast::error::RecvError::Closed) => {
                        closing = true;
                        behind = true;
                    }
                },
            }
        }
    }

    /// Pushes sync events in pts order, moving `cursor` along; false once
    /// the device has gone away. `live`: events just appended (their push
    /// latency is measured; a catch-up from storage is not).
    async fn send_all(
        &self,
        user: UserKey,
        events: impl ExactSizeIterator<Item = (u64, SyncRecord, Option<Message>)>,
        cursor: &mut u64,
        tx: &mpsc::Sender<PushResult>,
        live: bool,
    ) -> Result<bool> {
        if events.len() == 0 {
            return Ok(true);
        }
        let queue_id = self.store.queue_id(user)?;
        for (pts, record, message) in events {
            let sent_ms = record.server_ts_ms;
            let push = hydrate(queue_id, pts, record, message);
            if tx.send(Ok(push)).await.is_err() {
                return Ok(false);
            }
            if live && sent_ms > 0 {
                let latency = self.clock.now_ms().saturating_sub(sent_ms);
                crate::metrics::metrics()
                    .push_latency_seconds
                    .observe(latency as f64 / 1000.0);
            }
            *cursor = pts;
        }
        Ok(true)
    }
}

/// One device streaming, counted in `cellmesh_online_devices` while it
/// lives.
struct OnlineDevice;

impl OnlineDevice {
    fn count() -> Self {
        crate::metrics::metrics().online_devices.inc();
        Self
    }
}

impl Drop for OnlineDevice {
    fn drop(&mut self) {
        crate::metrics::metrics().online_devices.dec();
    }
}

/// The message a sync event carries: the one delivered with it by the
/// conversation's cell, or the one stored here in its current state.
pub fn event_message(store: &Store, record: &SyncRecord) -> Result<Option<Message>> {
    if !record.remote_message.is_empty() {
        return Ok(Message::decode(record.remote_message.as_slice()).ok());
    }
    Ok(match SyncEventKind::try_from(record.kind) {
        Ok(SyncEventKind::Message | SyncEventKind::Recall | SyncEventKind::Edit) => store
            .message(ConversationId(record.conversation_id), record.seq)?
            .map(|m| message_to_proto(ConversationId(record.conversation_id), record.seq, m)),
        _ => None,
    })
}

/// A sync record as pushed, with its message.
fn hydrate(queue_id: u64, pts: u64, record: SyncRecord, message: Option<Message>) -> SyncPush {
    let kind = SyncEventKind::try_from(record.kind).unwrap_or(SyncEventKind::Unspecified);
    SyncPush {
        push: Some(sync_push::Push::Event(SyncEvent {
            pts,
            kind: kind as i32,
            conversation_id: record.conversation_id,
            seq: record.seq,
            message,
            items: record.items,
            server_ts_ms: record.server_ts_ms,
            queue_id,
        })),
    }
}
