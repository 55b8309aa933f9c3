//! One device's subscription: its backlog from storage, in pts order, then
//! live events as the processor appends them. The hub subscription is taken
//! before the first storage read, so nothing appended in between is missed.
//! Live events come with the processor's wake-up and are pushed as they are
//! when they follow the cursor exactly; anything else (a gap, a lagging
//! subscription, a bare wake-up past the cursor) is read from storage by
//! pts, so delivery is never reordered or dropped.
//!
//! The subscription is the response stream itself ([`PushStream`]): the
//! connection polls it when it can send, and it takes what the hub left in
//! its inbox, so a push wakes no task of its own, and a device that reads
//! slowly is not read for (backpressure is the connection's flow control).

use cellmesh_proto::ids::ConversationId;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::inbox::{Inbox, Next};
use super::{Device, HubEvent, Subscription, SyncService};
use crate::convert::message_to_proto;
use crate::error::{CellError, Result};
use crate::storage::Store;
use cellmesh_proto::reason::Reason;
use cellmesh_proto::storage::v1::SyncRecord;
use cellmesh_proto::v1::{Message, Rebase, SyncEvent, SyncEventKind, SyncPush, sync_push};
use futures::Stream;
use prost::Message as _;

/// Sync events read from storage at a time.
const READ_PAGE: usize = 256;
/// How often the streaming users' homes are checked ([`SyncService::recheck_homes`]).
pub const HOME_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

pub type PushResult = std::result::Result<SyncPush, tonic::Status>;

impl SyncService {
    /// Starts streaming `device`'s sync queue after `from_pts` (0 = the
    /// device's stored cursor) of queue `queue_id` (0 = this one).
    pub async fn subscribe(
        self: &Arc<Self>,
        device: Device,
        from_pts: u64,
        queue_id: u64,
    ) -> Result<PushStream> {
        self.settle_home(device.caller).await?;
        self.open_stream(device, from_pts, queue_id)
    }

    fn open_stream(
        self: &Arc<Self>,
        device: Device,
        from_pts: u64,
        queue_id: u64,
    ) -> Result<PushStream> {
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
        let mut out = VecDeque::new();
        // A cursor of another queue (the user's home was failed over and
        // started afresh), or past this queue's end (a device that does not
        // name its queue), means nothing here: the device starts over from
        // the conversation list instead of silently skipping what this
        // queue holds.
        let current = self.store.queue_id(user)?;
        let foreign = queue_id != 0 && current != 0 && queue_id != current;
        if foreign || asked > latest || latest - cursor > self.config.sync.rebase_threshold {
            out.push_back(Pending {
                push: SyncPush {
                    push: Some(sync_push::Push::Rebase(Rebase {
                        latest_pts: latest,
                        queue_id: current,
                    })),
                },
                live_ms: 0,
            });
            cursor = latest;
        }
        // Transient pushes go out after what is queued here (the rebase).
        let Subscription { inbox, _slot } = subscription;
        Ok(PushStream {
            service: self.clone(),
            device,
            cursor,
            behind: true,
            closing: false,
            done: false,
            out,
            inbox,
            _slot,
            _online: OnlineDevice::count(),
        })
    }

    /// Checks the home of every user streaming from this cell, and tells
    /// the streams of those whose home moved away (or is moving in) to end:
    /// a stream with nothing to push would not notice otherwise. One pass
    /// every [`HOME_CHECK`] instead of a timer per stream.
    pub fn recheck_homes(&self) {
        for user in self.hub.streaming_users() {
            if self.homes.check_home(user, false).is_err() {
                self.hub.recheck(user);
            }
        }
    }
}

/// A push ready to go, with its send time when it was pushed live (its
/// latency is measured; a catch-up from storage is not).
struct Pending {
    push: SyncPush,
    live_ms: u64,
}

/// One device's stream of pushes. Ends with `WRONG_CELL` once the user's
/// home has moved to another cell (the device reconnects there and goes on
/// from its cursor), with `STREAM_SUPERSEDED` once the same device opened a
/// newer stream, and without an error once the cell stops (after pushing
/// what the device had not had yet).
pub struct PushStream {
    service: Arc<SyncService>,
    device: Device,
    /// The last pts queued for the device.
    cursor: u64,
    /// The queue may hold events past the cursor: read storage.
    behind: bool,
    /// The cell is stopping: catch up, then end.
    closing: bool,
    done: bool,
    out: VecDeque<Pending>,
    inbox: Arc<Inbox>,
    _slot: super::hub::Slot,
    _online: OnlineDevice,
}

impl Stream for PushStream {
    type Item = PushResult;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<PushResult>> {
        let this = self.get_mut();
        let next = this.poll_push(cx);
        if let Poll::Ready(Some(Err(_))) = &next {
            // An error ends the stream.
            this.done = true;
            this.out.clear();
        }
        next
    }
}

impl PushStream {
    fn poll_push(&mut self, cx: &mut Context<'_>) -> Poll<Option<PushResult>> {
        loop {
            if let Some(Pending { push, live_ms }) = self.out.pop_front() {
                if live_ms > 0 {
                    let latency = self.service.clock.now_ms().saturating_sub(live_ms);
                    crate::metrics::metrics()
                        .push_latency_seconds
                        .observe(latency as f64 / 1000.0);
                }
                return Poll::Ready(Some(Ok(push)));
            }
            if self.done {
                return Poll::Ready(None);
            }
            if self.behind {
                self.catch_up()?;
                continue;
            }
            if self.closing {
                self.done = true;
                continue;
            }
            match self.inbox.poll_next(cx) {
                Poll::Ready(Next::Superseded) => {
                    return Poll::Ready(Some(Err(CellError::invalid(
                        Reason::StreamSuperseded,
                        format!("device {:?} opened a newer stream", self.device.device),
                    )
                    .into())));
                }
                Poll::Ready(Next::Push(push)) => return Poll::Ready(Some(Ok(push))),
                Poll::Ready(Next::Lagged) => self.behind = true,
                Poll::Ready(Next::Event(event)) => self.woken(event)?,
                // The cell is stopping: push what the device has not had
                // yet, then end.
                Poll::Ready(Next::Closed) => {
                    self.closing = true;
                    self.behind = true;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Reads the next page of the queue after the cursor into `out`.
    /// Only the user's home pushes: a cell the home moved away from (or is
    /// moving to, importing the queue) ends the stream instead of pushing
    /// what it holds.
    fn catch_up(&mut self) -> Result<()> {
        let service = self.service.clone();
        service.check_home(&self.device.caller, false)?;
        let user = self.device.caller;
        let page = service.store.sync_after(user, self.cursor, READ_PAGE)?;
        self.behind = !page.is_empty();
        if page.is_empty() {
            return Ok(());
        }
        let queue_id = service.store.queue_id(user)?;
        for (pts, record) in page {
            let message = event_message(&service.store, &record)?;
            self.queue(queue_id, pts, record, message, false);
        }
        Ok(())
    }

    /// What the hub said: live events that follow the cursor exactly are
    /// queued as they are; anything else sends the stream to storage.
    fn woken(&mut self, event: HubEvent) -> Result<()> {
        match event {
            HubEvent::Pts(pts) => self.behind = pts > self.cursor,
            HubEvent::Recheck => self.service.check_home(&self.device.caller, false)?,
            HubEvent::Appended(events) => match events.first() {
                Some(first) if first.pts == self.cursor + 1 => {
                    let service = &self.service;
                    service.check_home(&self.device.caller, false)?;
                    let queue_id = service.store.queue_id(self.device.caller)?;
                    for e in events.iter() {
                        let message = e.message.as_deref().cloned();
                        self.queue(queue_id, e.pts, e.record.clone(), message, true);
                    }
                }
                Some(_) => self.behind = events.last().is_some_and(|e| e.pts > self.cursor),
                None => {}
            },
        }
        Ok(())
    }

    fn queue(
        &mut self,
        queue_id: u64,
        pts: u64,
        record: SyncRecord,
        message: Option<Message>,
        live: bool,
    ) {
        let live_ms = if live { record.server_ts_ms } else { 0 };
        self.out.push_back(Pending {
            push: hydrate(queue_id, pts, record, message),
            live_ms,
        });
        self.cursor = pts;
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
