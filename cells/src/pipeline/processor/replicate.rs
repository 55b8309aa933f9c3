//! The copies a batch ships to this cell's standbys after the ack, so a
//! failover target has every conversation's meta and answers every re-send
//! as this cell did.

use super::*;
use cellmesh_proto::ids::{ConversationId, TenantId, UserId};

impl Processor {
    /// This cell's standbys for `batch` (looked up once per batch); a
    /// standby that was none at the last lookup gets the answers shipped
    /// lately first (see [`RecentAnswers`]).
    pub(super) fn standbys(&mut self, batch: &mut Batch) -> Arc<[String]> {
        if let Some(standbys) = &batch.standbys {
            return standbys.clone();
        }
        let standbys = batch.standbys(self.homes.as_ref());
        let (joined, replay) = self.recent.joined(&standbys);
        if !replay.is_empty() {
            tracing::info!(standbys = ?joined, answers = replay.len(), "new standbys get the answers shipped lately");
            for answer in replay {
                batch.queue_for_standbys(self.homes.as_ref(), &joined, answer);
            }
        }
        standbys
    }

    /// Queues the answer to an acknowledged send for this cell's standbys,
    /// so that a failover target answers a re-send of it as this cell did
    /// (within the replication lag: what the forward queue still holds).
    pub(super) fn replicate_answer(&mut self, batch: &mut Batch, id: u64, event: &OutboxEvent) {
        if event.client_req_id.is_empty()
            || self.store.failpoints().hit("standby.answers") == Some(Action::Error)
        {
            return;
        }
        let standbys = self.standbys(batch);
        let answer = PeerEvent {
            event_id: id,
            tenant_id: event.tenant_id,
            conversation_id: event.conversation_id,
            seq: event.seq,
            msg_id: event.msg_id,
            sender_id: event.user_id,
            server_ts_ms: event.server_ts_ms,
            idempotency: Some(IdempotencyRecord {
                conversation_id: event.conversation_id,
                msg_id: event.msg_id,
                seq: event.seq,
                server_ts_ms: event.server_ts_ms,
                expires_at_ms: event.idempotency_expires_at_ms,
            }),
            client_req_id: event.client_req_id.clone(),
            role: PeerEventRole::StandbyAnswer as i32,
            ..Default::default()
        };
        self.recent.shipped(&answer);
        batch.queue_for_standbys(self.homes.as_ref(), &standbys, answer);
    }

    /// Queues for this cell's standbys the answers a move copied here with
    /// the messages at `event.items` (hot ones: older messages' requests
    /// are past their idempotency window), so that a failover target
    /// answers a re-send of them as this cell would.
    pub(super) fn replicate_copied_answers(
        &mut self,
        batch: &mut Batch,
        id: u64,
        event: &OutboxEvent,
    ) -> Result<(), PipelineError> {
        if self.store.failpoints().hit("standby.answers") == Some(Action::Error) {
            return Ok(());
        }
        // With none up, still noted for the standby that joins next.
        let standbys = self.standbys(batch);
        let conversation = event.conversation_id;
        for &seq in &event.items {
            let Some(r) = self.store.message(ConversationId(conversation), seq)? else {
                continue;
            };
            let key = IdemKey {
                kind: IdemKind::Send,
                tenant: TenantId(event.tenant_id),
                user: UserId(r.sender_id),
                client_req_id: r.client_req_id,
            };
            let Some(answer) = self.store.idempotency(&key)? else {
                continue;
            };
            if (answer.conversation_id, answer.seq) != (conversation, seq) {
                continue;
            }
            let copy = PeerEvent {
                event_id: id,
                tenant_id: event.tenant_id,
                conversation_id: conversation,
                seq,
                msg_id: r.msg_id,
                sender_id: r.sender_id,
                server_ts_ms: r.server_ts_ms,
                idempotency: Some(answer),
                client_req_id: key.client_req_id,
                role: PeerEventRole::StandbyAnswer as i32,
                ..Default::default()
            };
            self.recent.shipped(&copy);
            batch.queue_for_standbys(self.homes.as_ref(), &standbys, copy);
        }
        Ok(())
    }

    /// Queues the conversation's meta and members for this cell's standby,
    /// so a failover finds the conversation there.
    pub(super) fn replicate_meta(
        &mut self,
        batch: &mut Batch,
        id: ConversationId,
        event: &OutboxEvent,
    ) -> Result<(), PipelineError> {
        let standbys = self.standbys(batch);
        if standbys.is_empty() {
            return Ok(());
        }
        let Some(record) = self
            .store
            .conversation(ConversationId(event.conversation_id))?
        else {
            return Ok(());
        };
        let (members, _) =
            self.store
                .members(ConversationId(event.conversation_id), 0, usize::MAX)?;
        let meta = PeerEvent {
            event_id: id.get(),
            tenant_id: event.tenant_id,
            conversation_id: event.conversation_id,
            meta: Some(ConversationMeta {
                record: Some(record),
                members,
            }),
            role: PeerEventRole::StandbyMeta as i32,
            ..Default::default()
        };
        batch.queue_for_standbys(self.homes.as_ref(), &standbys, meta);
        Ok(())
    }
}
