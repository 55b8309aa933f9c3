//! The fan-out processor: consumes the queue and turns each event into the
//! per-user effects of DESIGN.md §4. Small conversations use write diffusion
//! (one sync event per member); conversations above the large-group
//! threshold use read diffusion (nothing per member: online members get a
//! transient hint, lists compute unread on read). A batch's effects are one
//! atomic commit; queue positions are committed only afterwards, and a
//! redelivered event is recognised per (user, conversation) by its event id,
//! so applying an event twice has no second effect.
//!
//! The processor is the only writer of sync queues and pts, so it keeps the
//! latest pts of recently active users in memory.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use cellmesh_proto::storage::v1::{
    ConvListEntry, NotificationRecord, OutboxEvent, OutboxKind, SyncRecord,
};
use cellmesh_proto::v1::{ConversationHint, SyncEventKind, SyncPush, sync_push};
use tokio::sync::Notify;

use super::PipelineError;
use crate::clock::Clock;
use crate::queue::{Delivery, EventConsumer};
use crate::storage::{Mutation, Store};
use crate::sync::Hub;

/// Users whose pts stay cached.
const PTS_CACHE: usize = 1 << 20;

pub struct Processor {
    store: Arc<Store>,
    hub: Arc<Hub>,
    clock: Arc<dyn Clock>,
    large_group_threshold: usize,
    /// Latest durable pts per user.
    pts: HashMap<u64, u64>,
    next_notification: u64,
    notifications: Arc<Notify>,
}

/// Effects of one batch, built before the commit and announced after it.
#[derive(Default)]
struct Batch {
    mutation: Mutation,
    entries: HashMap<(u64, u64), ConvListEntry>,
    pts: HashMap<u64, u64>,
    hints: Vec<(Vec<u64>, ConversationHint)>,
    notified: bool,
}

impl Processor {
    pub fn new(
        store: Arc<Store>,
        hub: Arc<Hub>,
        clock: Arc<dyn Clock>,
        large_group_threshold: usize,
        notifications: Arc<Notify>,
    ) -> Result<Self, PipelineError> {
        let next_notification = store.notify_last_id()? + 1;
        Ok(Self {
            store,
            hub,
            clock,
            large_group_threshold,
            pts: HashMap::new(),
            next_notification,
            notifications,
        })
    }

    /// Consumes until an error; the caller restarts with a fresh consumer,
    /// which redelivers whatever was not committed.
    pub async fn run(
        mut self,
        mut consumer: Box<dyn EventConsumer>,
        batch: usize,
    ) -> Result<(), PipelineError> {
        loop {
            let deliveries = consumer.poll(batch, Duration::from_millis(500)).await?;
            if deliveries.is_empty() {
                continue;
            }
            self.apply(&deliveries).await?;
            consumer.commit(&deliveries).await?;
        }
    }

    /// Makes the effects of `deliveries` durable and announces them to
    /// online devices. Does not commit queue positions.
    pub async fn apply(&mut self, deliveries: &[Delivery]) -> Result<(), PipelineError> {
        let mut batch = Batch::default();
        for delivery in deliveries {
            let Some(event) = &delivery.event.event else {
                continue;
            };
            self.apply_event(&mut batch, delivery.event.id, event)?;
        }
        for ((user, conversation), entry) in &batch.entries {
            batch.mutation.put_conv_list(*user, *conversation, entry);
        }
        for (user, pts) in &batch.pts {
            batch.mutation.put_user_pts(*user, *pts);
        }
        if !batch.mutation.is_empty() {
            let mutation = std::mem::take(&mut batch.mutation);
            if let Err(e) = self.store.commit(mutation).await {
                // The cached pts may now be ahead of storage.
                self.pts.clear();
                return Err(e.into());
            }
        }
        if self.pts.len() > PTS_CACHE {
            self.pts.clear();
        }
        for (user, pts) in batch.pts {
            self.pts.insert(user, pts);
            self.hub.notify_pts(user, pts);
        }
        for (members, hint) in batch.hints {
            let push = SyncPush {
                push: Some(sync_push::Push::Hint(hint)),
            };
            for user in members {
                self.hub.push(user, push.clone());
            }
        }
        if batch.notified {
            self.notifications.notify_one();
        }
        Ok(())
    }

    fn apply_event(
        &mut self,
        batch: &mut Batch,
        id: u64,
        event: &OutboxEvent,
    ) -> Result<(), PipelineError> {
        let kind = OutboxKind::try_from(event.kind).unwrap_or(OutboxKind::Unspecified);
        let conversation = event.conversation_id;
        match kind {
            OutboxKind::Message | OutboxKind::Recall | OutboxKind::Edit => {
                let (members, _) = self.store.members(conversation, 0, usize::MAX)?;
                if members.len() > self.large_group_threshold {
                    let hint = ConversationHint {
                        conversation_id: conversation,
                        latest_seq: event.seq,
                        msg_id: event.msg_id,
                    };
                    let now = self.clock.now_ms();
                    let online = members
                        .into_iter()
                        .filter(|u| self.hub.is_online(*u, now))
                        .collect();
                    batch.hints.push((online, hint));
                    return Ok(());
                }
                let sync_kind = match kind {
                    OutboxKind::Recall => SyncEventKind::Recall,
                    OutboxKind::Edit => SyncEventKind::Edit,
                    _ => SyncEventKind::Message,
                };
                for user in members {
                    let appended = self.append(batch, user, id, event, sync_kind)?;
                    if appended && kind == OutboxKind::Message && user != event.user_id {
                        self.maybe_notify(batch, user, event)?;
                    }
                }
            }
            OutboxKind::DeleteForMe => {
                self.append(batch, event.user_id, id, event, SyncEventKind::DeleteForMe)?;
            }
            OutboxKind::Read => {
                self.append(batch, event.user_id, id, event, SyncEventKind::Read)?;
            }
            OutboxKind::ConversationCreated => {
                for user in &event.items {
                    self.append(batch, *user, id, event, SyncEventKind::Joined)?;
                }
            }
            OutboxKind::MembersChanged => {
                for user in &event.items {
                    let kind = if self.store.is_member(conversation, *user)? {
                        SyncEventKind::Joined
                    } else {
                        SyncEventKind::Left
                    };
                    self.append(batch, *user, id, event, kind)?;
                }
            }
            OutboxKind::Unspecified => {}
        }
        Ok(())
    }

    /// Appends one event to `user`'s sync queue unless it was applied
    /// before; returns whether it appended.
    fn append(
        &mut self,
        batch: &mut Batch,
        user: u64,
        id: u64,
        event: &OutboxEvent,
        kind: SyncEventKind,
    ) -> Result<bool, PipelineError> {
        let key = (user, event.conversation_id);
        let mut entry = match batch.entries.remove(&key) {
            Some(entry) => entry,
            None => self
                .store
                .conv_list_entry(user, event.conversation_id)?
                .unwrap_or_default(),
        };
        if id <= entry.last_event_id {
            batch.entries.insert(key, entry);
            return Ok(false);
        }
        let pts = self.latest_pts(batch, user)? + 1;
        batch.pts.insert(user, pts);
        batch.mutation.put_sync(
            user,
            pts,
            &SyncRecord {
                kind: kind as i32,
                conversation_id: event.conversation_id,
                seq: event.seq,
                msg_id: event.msg_id,
                items: match kind {
                    SyncEventKind::DeleteForMe => event.items.clone(),
                    _ => Vec::new(),
                },
                server_ts_ms: event.server_ts_ms,
            },
        );
        entry.last_event_id = id;
        match kind {
            SyncEventKind::Message => {
                entry.last_seq = entry.last_seq.max(event.seq);
                entry.last_msg_id = event.msg_id;
                entry.updated_at_ms = event.server_ts_ms;
            }
            SyncEventKind::Joined => {
                entry.left = false;
                entry.updated_at_ms = entry.updated_at_ms.max(event.server_ts_ms);
            }
            SyncEventKind::Left => entry.left = true,
            _ => {}
        }
        batch.entries.insert(key, entry);
        Ok(true)
    }

    fn latest_pts(&mut self, batch: &Batch, user: u64) -> Result<u64, PipelineError> {
        if let Some(pts) = batch.pts.get(&user) {
            return Ok(*pts);
        }
        if let Some(pts) = self.pts.get(&user) {
            return Ok(*pts);
        }
        let pts = self.store.user_pts(user)?;
        self.pts.insert(user, pts);
        Ok(pts)
    }

    /// Queues a notification for a member with no online device.
    fn maybe_notify(
        &mut self,
        batch: &mut Batch,
        user: u64,
        event: &OutboxEvent,
    ) -> Result<(), PipelineError> {
        let now = self.clock.now_ms();
        if self.hub.is_online(user, now) || self.store.muted(user, event.conversation_id)? {
            return Ok(());
        }
        let id = self.next_notification;
        self.next_notification += 1;
        batch.mutation.put_notification(
            id,
            &NotificationRecord {
                user_id: user,
                tenant_id: event.tenant_id,
                conversation_id: event.conversation_id,
                seq: event.seq,
                msg_id: event.msg_id,
                sender_id: event.user_id,
                created_at_ms: now,
                attempts: 0,
            },
        );
        batch.notified = true;
        Ok(())
    }
}
