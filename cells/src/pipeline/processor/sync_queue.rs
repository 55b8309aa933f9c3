//! Writing an event into a user's sync queue: appended here with its pts
//! (a redelivery recognised and skipped), or queued for the user's home
//! cell; live pushes to online devices and notifications for offline ones.

use super::*;
use crate::storage::new_queue_id;
use cellmesh_proto::ids::ConversationId;

impl Processor {
    /// Delivers one event to `user`: appended here, or queued for the
    /// user's home cell (with the message, which lives here), or held while
    /// that home is frozen for a move.
    pub(super) fn deliver(
        &mut self,
        batch: &mut Batch,
        user: UserKey,
        id: u64,
        record: &SyncRecord,
        origin: Origin,
    ) -> Result<(), PipelineError> {
        let endpoint = match self.homes.home(user) {
            // Events queued for the user before their home came here go
            // first: this one follows them through the queue.
            Home::Here if self.still_queued(batch, user)? => Some(Via::Resolve),
            Home::Here => None,
            Home::Remote(endpoint) => Some(Via::Cell(endpoint)),
            Home::Moving => Some(Via::Resolve),
        };
        if let Some(endpoint) = endpoint {
            self.queued_for.insert(user);
            batch.forwarded_users.insert(user);
            let message = match SyncEventKind::try_from(record.kind) {
                Ok(SyncEventKind::Message | SyncEventKind::Recall | SyncEventKind::Edit) => self
                    .store
                    .message(ConversationId(record.conversation_id), record.seq)?
                    .map(|m| {
                        message_to_proto(ConversationId(record.conversation_id), record.seq, m)
                    }),
                _ => None,
            };
            batch.forward.entry(endpoint).or_default().push(PeerEvent {
                user_id: user.user.get(),
                event_id: id,
                kind: record.kind,
                tenant_id: user.tenant.get(),
                conversation_id: record.conversation_id,
                seq: record.seq,
                msg_id: record.msg_id,
                sender_id: origin.sender,
                items: record.items.clone(),
                server_ts_ms: record.server_ts_ms,
                message,
                traceparent: batch.trace.current_parent.clone(),
                role: PeerEventRole::User as i32,
                ..Default::default()
            });
            return Ok(());
        }
        if self.append(batch, user, id, "", record)?
            && record.kind == SyncEventKind::Message as i32
            && user != origin.sender()
        {
            self.maybe_notify(batch, user, record, origin)?;
        }
        Ok(())
    }

    /// Whether events for `user` wait in the forward queue (this batch's
    /// included). The queue is scanned at most once per batch, and only for
    /// a user who had events queued and now lives here.
    pub(super) fn still_queued(
        &mut self,
        batch: &mut Batch,
        user: UserKey,
    ) -> Result<bool, PipelineError> {
        if batch.forwarded_users.contains(&user) {
            return Ok(true);
        }
        if !self.queued_for.contains(&user) {
            return Ok(false);
        }
        if batch.queued.is_none() {
            let queued = queued_users(&self.store)?;
            self.queued_for
                .retain(|u| queued.contains(u) || batch.forwarded_users.contains(u));
            batch.queued = Some(queued);
        }
        Ok(batch.queued.as_ref().is_some_and(|q| q.contains(&user)))
    }

    /// Appends one event to `user`'s sync queue unless it was applied
    /// before; returns whether it appended.
    pub(super) fn append(
        &mut self,
        batch: &mut Batch,
        user: UserKey,
        id: u64,
        source: &str,
        record: &SyncRecord,
    ) -> Result<bool, PipelineError> {
        let key = (user, record.conversation_id);
        self.notice_handovers();
        let mut entry = match batch.entries.remove(&key) {
            Some(entry) => entry,
            None => match self.entries.get(&key) {
                Some(entry) => entry.clone(),
                None => self
                    .store
                    .conv_list_entry(user, ConversationId(record.conversation_id))?
                    .unwrap_or_default(),
            },
        };
        if source == entry.last_event_source && id <= entry.last_event_id {
            batch.entries.insert(key, entry);
            return Ok(false);
        }
        let pts = self.latest_pts(batch, user)? + 1;
        batch.pts.insert(user, pts);
        batch.trace.appended(user);
        batch.mutation.put_sync(user, pts, record);
        let live = (batch.appended.entry(user))
            .or_insert_with(|| self.hub.is_subscribed(user).then(Vec::new));
        if let Some(events) = live {
            events.push((pts, record.clone()));
        }
        batch.applied += 1;
        entry.last_event_id = id;
        entry.last_event_source = source.to_string();
        match SyncEventKind::try_from(record.kind) {
            Ok(SyncEventKind::Message) => {
                entry.last_seq = entry.last_seq.max(record.seq);
                entry.last_msg_id = record.msg_id;
                entry.updated_at_ms = record.server_ts_ms;
                entry.last_message_pts = pts;
            }
            // A recall or edit of the last message carries its new state.
            Ok(SyncEventKind::Recall | SyncEventKind::Edit)
                if record.msg_id == entry.last_msg_id =>
            {
                entry.last_message_pts = pts;
            }
            Ok(SyncEventKind::Joined) => {
                entry.left = false;
                entry.updated_at_ms = entry.updated_at_ms.max(record.server_ts_ms);
            }
            Ok(SyncEventKind::Left) => entry.left = true,
            _ => {}
        }
        batch.entries.insert(key, entry);
        Ok(true)
    }

    /// Appended events as live streams push them, each message read once
    /// per batch however many members' streams carry it.
    pub(super) fn live(
        &self,
        events: Vec<(u64, SyncRecord)>,
        messages: &mut HashMap<(u64, u64), Option<Arc<Message>>>,
    ) -> crate::error::Result<Vec<LiveEvent>> {
        events
            .into_iter()
            .map(|(pts, record)| {
                let message = match messages.get(&(record.conversation_id, record.seq)) {
                    Some(message) if record.remote_message.is_empty() => message.clone(),
                    _ => {
                        let message = event_message(&self.store, &record)?.map(Arc::new);
                        if record.remote_message.is_empty() {
                            let key = (record.conversation_id, record.seq);
                            messages.insert(key, message.clone());
                        }
                        message
                    }
                };
                Ok(LiveEvent {
                    pts,
                    record,
                    message,
                })
            })
            .collect()
    }

    pub(super) fn latest_pts(
        &mut self,
        batch: &mut Batch,
        user: UserKey,
    ) -> Result<u64, PipelineError> {
        if let Some(pts) = batch.pts.get(&user) {
            return Ok(*pts);
        }
        self.notice_handovers();
        if let Some(pts) = self.pts.get(&user) {
            return Ok(*pts);
        }
        // A queue gets its identity with its first event here. A copy this
        // cell handed over by a move, home here again other than by a move
        // (a failover onto the cell it left), lacks what the home appended
        // since: it goes on as a new queue, so devices rebase instead of
        // getting a pts twice. (No lookup while this cell never handed a
        // home over.)
        if self.handovers_seen > 0 && self.store.home_is_stale(user)? {
            tracing::info!(tenant = %user.tenant, user = %user.user, "a home came back without a move: its queue starts anew");
            batch.mutation.restart_queue(user, self.clock.now_ms());
        } else if self.store.queue_id(user)? == 0 {
            batch.mutation.set_queue_id(user, new_queue_id());
        }
        let pts = self.store.user_pts(user)?;
        self.pts.insert(user, pts);
        Ok(pts)
    }

    /// Drops what is cached of users' queues once keys were sealed here
    /// (a home handed over may come back stale and must be read again).
    pub(super) fn notice_handovers(&mut self) {
        let handovers = self.store.handovers();
        if handovers != self.handovers_seen {
            self.forget_cached();
            self.handovers_seen = handovers;
        }
    }

    /// Forgets cached pts and conversation-list entries: storage is read
    /// again.
    pub(super) fn forget_cached(&mut self) {
        self.pts.clear();
        self.entries.clear();
    }

    /// Queues a notification for a member with no online device.
    pub(super) fn maybe_notify(
        &mut self,
        batch: &mut Batch,
        user: UserKey,
        record: &SyncRecord,
        origin: Origin,
    ) -> Result<(), PipelineError> {
        let now = self.clock.now_ms();
        if self.hub.is_online(user, now)
            || self
                .store
                .muted(user, ConversationId(record.conversation_id))?
        {
            return Ok(());
        }
        let notification = NotificationRecord {
            user_id: user.user.get(),
            tenant_id: user.tenant.get(),
            conversation_id: record.conversation_id,
            seq: record.seq,
            msg_id: record.msg_id,
            sender_id: origin.sender,
            created_at_ms: now,
            attempts: 0,
        };
        match &self.notification_log {
            Some(log) => log.write(&notification),
            None => batch.notifications.push(notification),
        }
        Ok(())
    }
}
