//! What other cells hand the processor: users' events for users homed
//! here, standby copies of conversations' meta and of send answers (taken
//! only from the cell that owns the conversation), and the sync state of
//! users whose home moves here.

use super::*;
use crate::pipeline::Purpose;
use cellmesh_proto::ids::{ConversationId, TenantId, UserId};

impl Processor {
    /// Applies events another cell delivered for users homed here; says
    /// how many were new and which users do not live here.
    pub async fn apply_remote(
        &mut self,
        source: &str,
        events: &[PeerEvent],
        view_behind: bool,
    ) -> Result<Delivered, PipelineError> {
        let mut batch = Batch::default();
        let mut refused = Vec::new();
        let (mut refused_standby, mut deferred_standby) = (0, Vec::new());
        for (at, e) in events.iter().enumerate() {
            let purpose = crate::pipeline::purpose(e);
            let what = match purpose {
                Purpose::User => None,
                Purpose::Meta(_) => Some("meta"),
                Purpose::Answer(_) => Some("answer"),
                Purpose::Malformed => {
                    tracing::warn!(
                        source,
                        role = e.role,
                        "refused an event whose role lacks its payload"
                    );
                    refused_standby += 1;
                    continue;
                }
            };
            if let Some(what) = what
                && let Err(why) = self.replicated_by_owner(source, e)
            {
                // A view older than the sender's may not know the move or
                // failover that makes the sender a holder: judge it later.
                if view_behind {
                    tracing::debug!(
                        source,
                        conversation = e.conversation_id,
                        "deferred a replicated {what}: {why}"
                    );
                    deferred_standby.push(at as u32);
                    continue;
                }
                tracing::warn!(
                    source,
                    tenant = e.tenant_id,
                    conversation = e.conversation_id,
                    "refused a replicated {what}: {why}"
                );
                refused_standby += 1;
                continue;
            }
            match purpose {
                Purpose::Meta(meta) => {
                    self.apply_meta(&mut batch, ConversationId(e.conversation_id), meta)?;
                    continue;
                }
                Purpose::Answer(answer) => {
                    self.keep_answer(&mut batch, e, answer)?;
                    continue;
                }
                Purpose::User | Purpose::Malformed => {}
            }
            let user = UserKey::new(TenantId(e.tenant_id), UserId(e.user_id));
            if refused.contains(&user) {
                continue;
            }
            if self.homes.home(user) != Home::Here {
                refused.push(user);
                continue;
            }
            batch.trace.event(traced::deliver(
                &e.traceparent,
                ConversationId(e.conversation_id),
                e.seq,
                UserId(e.user_id),
            ));
            let record = SyncRecord {
                kind: e.kind,
                conversation_id: e.conversation_id,
                seq: e.seq,
                msg_id: e.msg_id,
                items: e.items.clone(),
                server_ts_ms: e.server_ts_ms,
                remote_message: e
                    .message
                    .as_ref()
                    .map(|m| m.encode_to_vec())
                    .unwrap_or_default(),
            };
            if self.append(&mut batch, user, e.event_id, source, &record)?
                && e.kind == SyncEventKind::Message as i32
                && e.user_id != e.sender_id
            {
                let origin = Origin {
                    tenant: e.tenant_id,
                    sender: e.sender_id,
                };
                self.maybe_notify(&mut batch, user, &record, origin)?;
            }
        }
        let applied = batch.applied;
        self.finish(batch).await?;
        Ok(Delivered {
            applied,
            refused_users: refused,
            refused_standby,
            deferred_standby,
        })
    }

    /// Whether `source` may replicate `e` (a conversation's meta or a
    /// send's answer) to this cell (see [`super::standby`]).
    pub(super) fn replicated_by_owner(
        &self,
        source: &str,
        e: &PeerEvent,
    ) -> Result<(), crate::pipeline::standby::Refusal> {
        if source.is_empty() {
            return Ok(());
        }
        let held = self
            .store
            .conversation(ConversationId(e.conversation_id))
            .ok()
            .flatten();
        let replicated = crate::pipeline::standby::Replicated {
            source,
            tenant: TenantId(e.tenant_id),
            claimed_tenant: (e.meta.as_ref())
                .and_then(|m| m.record.as_ref())
                .map(|r| r.tenant_id),
            held_tenant: held.map(|h| h.tenant_id),
        };
        let owner = (self.homes)
            .conversation_owner(TenantId(e.tenant_id), ConversationId(e.conversation_id));
        crate::pipeline::standby::verdict(&self.cell_id, &replicated, owner.as_ref())
    }

    /// Stores copied parts of moving users' homes (distinct users), all in
    /// one commit. Dedupe positions that counted the source's own events
    /// now count them as the source's, and this cell's events forwarded
    /// there count as local again.
    pub(super) async fn import_users(
        &mut self,
        imports: Vec<UserImport>,
    ) -> Result<(), PipelineError> {
        let mut batch = Batch::default();
        for import in &imports {
            self.stage_import(&mut batch, import)?;
        }
        let result = self.store.commit_fan_out(batch.mutation).await;
        for import in &imports {
            self.pts.remove(&import.user);
        }
        // Their conversation-list entries were replaced (rare: drop all).
        self.entries.clear();
        result?;
        for import in &imports {
            let pts = self.store.user_pts(import.user)?;
            self.hub.notify_pts(import.user, pts);
        }
        Ok(())
    }

    /// Adds one copied part of a home to `batch`.
    pub(super) fn stage_import(
        &mut self,
        batch: &mut Batch,
        import: &UserImport,
    ) -> Result<(), PipelineError> {
        let user = import.user;
        if import.reset {
            self.store.clear_user(&mut batch.mutation, user)?;
        }
        // Moved here (back, maybe): this is the home's current state, not
        // a copy left behind.
        batch.mutation.home_current(user, self.clock.now_ms());
        for (pts, record) in &import.events {
            batch.mutation.put_sync(user, *pts, record);
        }
        for item in import.state.iter().flat_map(|s| &s.conversations) {
            let conversation = item.conversation_id;
            let mut entry = item.entry.clone().unwrap_or_default();
            if entry.last_event_source.is_empty() {
                entry.last_event_source = import.source.clone();
            } else if entry.last_event_source == self.cell_id {
                entry.last_event_source.clear();
            }
            batch
                .mutation
                .put_conv_list(user, ConversationId(conversation), &entry);
            batch
                .mutation
                .set_muted(user, ConversationId(conversation), item.muted);
            // A conversation this cell holds itself keeps its own record.
            if let Some(meta) = &item.meta
                && self
                    .store
                    .conversation(ConversationId(conversation))?
                    .is_none()
            {
                self.apply_meta(batch, ConversationId(conversation), meta)?;
            }
        }
        for cursor in import.state.iter().flat_map(|s| &s.cursors) {
            batch
                .mutation
                .raise_device_cursor(user, &cursor.device, cursor.pts);
        }
        if let Some(state) = import.state.as_ref().filter(|s| s.queue_id != 0) {
            batch.mutation.set_queue_id(user, state.queue_id);
        }
        Ok(())
    }

    /// Keeps a send's answer replicated from the conversation's owner (this
    /// cell is its standby), unless this cell has an answer of its own.
    pub(super) fn keep_answer(
        &mut self,
        batch: &mut Batch,
        e: &PeerEvent,
        answer: &IdempotencyRecord,
    ) -> Result<(), PipelineError> {
        let key = IdemKey {
            kind: IdemKind::Send,
            tenant: TenantId(e.tenant_id),
            user: UserId(e.sender_id),
            client_req_id: e.client_req_id.clone(),
        };
        if !key.client_req_id.is_empty() && self.store.idempotency(&key)?.is_none() {
            batch.mutation.put_idempotency(&key, answer);
            batch.applied += 1;
        }
        Ok(())
    }

    /// Stores a replicated conversation meta: the record and exactly the
    /// members listed.
    pub(super) fn apply_meta(
        &mut self,
        batch: &mut Batch,
        conversation: ConversationId,
        meta: &ConversationMeta,
    ) -> Result<(), PipelineError> {
        let Some(record) = &meta.record else {
            return Ok(());
        };
        (self.store).stage_meta(
            &mut batch.mutation,
            conversation,
            record,
            &UserId::many(&meta.members),
        )?;
        batch.applied += 1;
        Ok(())
    }
}
