//! `Send`: the write path of DESIGN.md §4. Checks, then under the
//! conversation's sequencer lock assigns `seq = max(latest, floor) + 1` and a
//! msg_id and queues one mutation (message, conversation seq, idempotency
//! record, outbox event) for group commit; answers once it is durable.

use cellmesh_proto::ids::{ConversationId, Epoch, TenantId, UserId};
use cellmesh_proto::reason::Reason;
use cellmesh_proto::storage::v1::{
    ConversationSeq, IdempotencyRecord, MessageRecord, OutboxEvent, OutboxKind, SeqJump,
};
use cellmesh_proto::v1::{
    AttachmentRef, MessageState, MessageType, ReplicatedWrite, SendResponse, SkipReason,
    StoredMessage,
};

use super::cache::SeqState;
use super::inflight::Begin;
use super::{Caller, MessageService};
use crate::error::{CellError, Result};
use crate::ownership::Fence;
use crate::storage::{IdemKey, IdemKind, Mutation};

#[derive(Debug, Clone)]
pub struct SendCommand {
    pub caller: Caller,
    pub conversation: ConversationId,
    pub client_req_id: String,
    pub kind: MessageType,
    pub body: Vec<u8>,
    pub route_epoch: u64,
    /// Directed message: only these members (and the sender) see it.
    pub visible_to: Vec<u64>,
    /// Completed uploads the message carries.
    pub attachments: Vec<u64>,
}

/// What a new message is made of besides its command.
struct Draft<'a> {
    key: &'a IdemKey,
    attachments: Vec<AttachmentRef>,
    visible_to: Vec<u64>,
    now: u64,
}

impl MessageService {
    /// A send, in a `send` span when its call is traced.
    pub async fn send(&self, cmd: SendCommand) -> Result<SendResponse> {
        use tracing::Instrument;
        if tracing::Span::current().is_disabled() {
            return self.store_send(cmd).await;
        }
        let span = tracing::info_span!(
            "send",
            tenant = cmd.caller.tenant.get(),
            conv_id = cmd.conversation.get(),
            user_id = cmd.caller.user.get(),
            req_id = %cmd.client_req_id,
            seq = tracing::field::Empty,
        );
        self.store_send(cmd).instrument(span).await
    }

    async fn store_send(&self, mut cmd: SendCommand) -> Result<SendResponse> {
        self.validate_send(&cmd)?;
        // Early refusal (and the caller's epoch); repeated under the lock.
        self.ownership
            .check(cmd.caller.tenant, cmd.conversation, Epoch(cmd.route_epoch))?;
        let conv = self.conversation(&cmd.caller, cmd.conversation.get())?;
        self.require_member(&cmd.caller, cmd.conversation)?;
        let visible_to = self.recipients(&cmd)?;

        let key = IdemKey {
            kind: IdemKind::Send,
            tenant: cmd.caller.tenant,
            user: cmd.caller.user,
            client_req_id: cmd.client_req_id.clone(),
        };
        let leader = match self.inflight.begin(key.clone()) {
            Begin::Follower(follower) => {
                let record = follower
                    .wait()
                    .await
                    .ok_or_else(concurrent_attempt_failed)?;
                return replay(&record, cmd.conversation);
            }
            Begin::Leader(leader) => leader,
        };
        if let Some(record) = self.store.idempotency(&key)?
            && record.expires_at_ms > self.now_ms()
        {
            let response = replay(&record, cmd.conversation)?;
            // An answer given before its standbys had it (the call failed)
            // is given again only once they do.
            self.replicate_sent(cmd.caller.tenant, &record).await?;
            leader.complete(record);
            return Ok(response);
        }
        // Checked after the replay: a re-send is answered as before even
        // where its uploads are not (another cell of the region after a move).
        let mut m = Mutation::new();
        let attachments =
            self.attachment_refs(&cmd.caller, cmd.conversation, &cmd.attachments, &mut m)?;
        // Only a new message takes from the budgets: a re-send of an
        // acknowledged one gets its answer above, limited or not.
        self.limits
            .check(cmd.caller.tenant, cmd.caller.user, cmd.conversation)?;

        // From the decisive ownership check until the write is durable.
        let writing = self.writing.read().await;
        let slot = self.store.reserve().await?;
        let now = self.now_ms();
        let (ticket, record, shipped) = {
            let mut state = conv.seq.lock().expect("sequencer lock");
            let draft = Draft {
                key: &key,
                attachments,
                visible_to,
                now,
            };
            let (record, message) = self.sequence(&mut state, &mut cmd, draft, &mut m)?;
            // Kept for the standbys only when they must have it first.
            let shipped = self
                .replicator
                .is_sync(cmd.caller.tenant)
                .then_some(message);
            (slot.submit(m), record, shipped)
        };
        commit_wait(ticket).await?;
        drop(writing);
        tracing::Span::current().record("seq", record.seq);
        crate::metrics::metrics().messages_committed.inc();
        tracing::debug!(seq = record.seq, msg_id = record.msg_id, "message stored");
        self.marks
            .note(cmd.caller.tenant, cmd.conversation, record.seq);
        if let Some(message) = shipped {
            self.replicate_message(
                cmd.caller.tenant,
                ConversationId(record.conversation_id),
                record.seq,
                message,
                Some(record),
            )
            .await?;
        }
        let response = SendResponse {
            msg_id: record.msg_id,
            seq: record.seq,
            server_ts_ms: record.server_ts_ms,
            duplicate: false,
        };
        leader.complete(record);
        Ok(response)
    }

    /// Under the conversation's sequencer lock (`state`): the decisive
    /// ownership check (once this cell sees a route frozen or moved, no
    /// further seq is assigned here: a migration seals the conversation on
    /// that), the next seq above any failover floor and within what the
    /// standbys have acknowledged, and the message, the conversation's seq,
    /// the answer, the sender's read mark and the outbox event staged in
    /// `m`. Takes the body out of `cmd`.
    fn sequence(
        &self,
        state: &mut SeqState,
        cmd: &mut SendCommand,
        draft: Draft<'_>,
        m: &mut Mutation,
    ) -> Result<(IdempotencyRecord, MessageRecord)> {
        let Draft {
            key,
            attachments,
            visible_to,
            now,
        } = draft;
        let fence = self
            .ownership
            .check(cmd.caller.tenant, cmd.conversation, Epoch(0))?;
        let floor = state.floor.max(fence.seq_floor);
        let seq = state.latest.max(floor) + 1;
        let jump = floor_jump(state, floor, &fence);
        if let Some(limit) = fence.seq_limit
            && seq > limit
        {
            // The standbys get this conversation's mark in a round now.
            self.marks
                .note(cmd.caller.tenant, cmd.conversation, seq - 1);
            self.marks.wake();
            return Err(CellError::RetryLater {
                reason: Reason::CheckpointBehind,
                message: format!(
                    "seq {seq} would pass {limit}: this cell's standbys have not acknowledged its high-water mark"
                ),
                retry_after: std::time::Duration::from_millis(200),
            });
        }
        let msg_id = self.next_id(now)?;
        let record = IdempotencyRecord {
            conversation_id: cmd.conversation.get(),
            msg_id,
            seq,
            server_ts_ms: now,
            expires_at_ms: self.idempotency_expiry(now),
        };
        let message = MessageRecord {
            msg_id,
            sender_id: cmd.caller.user.get(),
            r#type: cmd.kind as i32,
            body: std::mem::take(&mut cmd.body),
            server_ts_ms: now,
            state: MessageState::Normal as i32,
            edited_at_ms: 0,
            edit_version: 0,
            visible_to: visible_to.clone(),
            client_req_id: cmd.client_req_id.clone(),
            attachments,
        };
        m.put_message(cmd.conversation, seq, &message);
        if let Some(jump) = &jump {
            tracing::info!(
                conversation = cmd.conversation.get(),
                first = jump.first,
                last = jump.last,
                epoch = jump.epoch,
                "seqs skipped above a failover floor"
            );
            // Ahead of the commit, as `latest` is (nothing below fails).
            state.jumps.push(*jump);
        }
        m.put_conv_seq(
            cmd.conversation,
            &ConversationSeq {
                latest_seq: seq,
                seq_floor: floor,
                jumps: state.jumps.clone(),
            },
        );
        m.put_idempotency(key, &record);
        // Whoever sends has read up to their own message.
        m.raise_read_seq(cmd.conversation, cmd.caller.user, seq);
        m.emit(&OutboxEvent {
            kind: OutboxKind::Message as i32,
            tenant_id: cmd.caller.tenant.get(),
            conversation_id: cmd.conversation.get(),
            seq,
            msg_id,
            user_id: cmd.caller.user.get(),
            server_ts_ms: now,
            items: visible_to,
            client_req_id: cmd.client_req_id.clone(),
            idempotency_expires_at_ms: record.expires_at_ms,
            traceparent: cellmesh_telemetry::trace::traceparent(&tracing::Span::current()),
        });
        state.latest = seq;
        state.floor = floor;
        Ok((record, message))
    }

    /// For a `sync` tenant: returns once the standbys stored the message
    /// `record` answers for, with the answer (a replayed answer, whose
    /// first attempt may have failed to reach them).
    async fn replicate_sent(&self, tenant: TenantId, record: &IdempotencyRecord) -> Result<()> {
        if !self.replicator.is_sync(tenant) {
            return Ok(());
        }
        // The failed owner answered (its answer reached this cell ahead of
        // the message, which never did): the message is backfilled when
        // that cell returns; until then the outcome stays open.
        let Some(message) = self
            .store
            .message(ConversationId(record.conversation_id), record.seq)?
        else {
            return Err(CellError::RetryLater {
                reason: Reason::AwaitingBackfill,
                message: format!(
                    "this request was answered with seq {} by the cell this conversation failed \
                     over from; that message is not here until the cell returns",
                    record.seq
                ),
                retry_after: std::time::Duration::from_secs(1),
            });
        };
        let (conversation, seq) = (record.conversation_id, record.seq);
        self.replicate_message(
            tenant,
            ConversationId(conversation),
            seq,
            message,
            Some(*record),
        )
        .await
    }

    /// Returns once the standbys stored `message` at `seq` (and, for a new
    /// message, its answer).
    pub(super) async fn replicate_message(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
        seq: u64,
        message: MessageRecord,
        answer: Option<IdempotencyRecord>,
    ) -> Result<()> {
        self.replicator
            .replicate(ReplicatedWrite {
                tenant_id: tenant.get(),
                conversation_id: conversation.get(),
                message: Some(StoredMessage {
                    seq,
                    record: Some(message),
                }),
                idempotency: answer,
                meta: None,
            })
            .await
    }

    /// The recipients of a directed message, checked to be members and
    /// deduplicated; empty for a message to everyone.
    fn recipients(&self, cmd: &SendCommand) -> Result<Vec<u64>> {
        if cmd.visible_to.len() > self.config.limits.max_members_per_request {
            return Err(CellError::invalid(
                Reason::TooManyRecipients,
                "too many users in visible_to",
            ));
        }
        let mut users = cmd.visible_to.clone();
        users.sort_unstable();
        users.dedup();
        for user in &users {
            if !self.store.is_member(cmd.conversation, UserId(*user))? {
                return Err(CellError::invalid(
                    Reason::RecipientNotAMember,
                    format!("user {user} in visible_to is not a member"),
                ));
            }
        }
        Ok(users)
    }

    fn validate_send(&self, cmd: &SendCommand) -> Result<()> {
        let limits = &self.config.limits;
        if cmd.client_req_id.is_empty() {
            return Err(CellError::invalid(
                Reason::MissingClientReqId,
                "client_req_id is required",
            ));
        }
        if cmd.client_req_id.len() > limits.max_client_req_id_bytes {
            return Err(CellError::invalid(
                Reason::ClientReqIdTooLong,
                format!(
                    "client_req_id is {} bytes; the limit is {}",
                    cmd.client_req_id.len(),
                    limits.max_client_req_id_bytes
                ),
            ));
        }
        // A message with files may have no text.
        if cmd.body.is_empty() && !cmd.attachments.is_empty() {
            return Ok(());
        }
        validate_body(&cmd.body, limits.max_body_bytes)
    }
}

/// Waits for the group commit that makes a write durable, in a span that
/// says how many writes shared it and how long its write and fsync took.
pub(super) async fn commit_wait(ticket: crate::storage::CommitTicket) -> Result<()> {
    use tracing::Instrument;
    if tracing::Span::current().is_disabled() {
        return ticket.wait().await.map_err(Into::into);
    }
    let span = tracing::info_span!(
        "commit",
        batch = tracing::field::Empty,
        fsync_ms = tracing::field::Empty
    );
    let written = ticket.written().instrument(span.clone()).await?;
    span.record("batch", written.batch);
    span.record("fsync_ms", written.seconds * 1e3);
    Ok(())
}

pub(super) fn validate_body(body: &[u8], max: usize) -> Result<()> {
    if body.is_empty() {
        return Err(CellError::invalid(
            Reason::EmptyBody,
            "message body is empty",
        ));
    }
    if body.len() > max {
        return Err(CellError::invalid(
            Reason::BodyTooLarge,
            format!("message body is {} bytes; the limit is {max}", body.len()),
        ));
    }
    Ok(())
}

fn replay(record: &IdempotencyRecord, conversation: ConversationId) -> Result<SendResponse> {
    if record.conversation_id != conversation.get() {
        return Err(CellError::invalid(
            Reason::ClientReqIdReused,
            format!(
                "client_req_id was already used for a send to conversation {}",
                record.conversation_id
            ),
        ));
    }
    crate::metrics::metrics().idempotent_replays.inc();
    Ok(SendResponse {
        msg_id: record.msg_id,
        seq: record.seq,
        server_ts_ms: record.server_ts_ms,
        duplicate: true,
    })
}

pub(super) fn concurrent_attempt_failed() -> CellError {
    CellError::RetryLater {
        reason: Reason::ConcurrentAttemptFailed,
        message: "a concurrent request with the same client_req_id failed; retry".into(),
        retry_after: std::time::Duration::from_millis(50),
    }
}

/// The seqs a send at `floor + 1` skips on purpose, if it is the first
/// above a floor the conversation's history here does not reach: above the
/// latest seq this cell holds, up to the floor. Not above the failed
/// owner's mark: that may itself be a floor no message reached (an owner
/// that failed before its first send), and the seqs between are only ever
/// the failed owners' own, backfilled.
fn floor_jump(state: &SeqState, floor: u64, fence: &Fence) -> Option<SeqJump> {
    (floor > state.latest && !state.jumps.iter().any(|j| j.last == floor)).then(|| SeqJump {
        first: state.latest + 1,
        last: floor,
        epoch: fence.epoch,
        reason: match fence.taken_over_mark {
            Some(_) => SkipReason::Failover,
            None => SkipReason::Unspecified,
        } as i32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence(floor: u64, mark: Option<u64>) -> Fence {
        Fence {
            epoch: 9,
            seq_floor: floor,
            seq_limit: None,
            taken_over_mark: mark,
        }
    }

    #[test]
    fn the_first_send_above_a_failover_floor_records_the_skipped_range() {
        // The failed owner's mark is 2380, the margin took the floor to 9905;
        // this cell holds the history up to 2000. Above it only the failed
        // owners' messages can come (backfilled).
        let state = SeqState {
            latest: 2000,
            ..SeqState::default()
        };
        let jump = floor_jump(&state, 9905, &fence(9905, Some(2380))).unwrap();
        assert_eq!((jump.first, jump.last, jump.epoch), (2001, 9905, 9));
        assert_eq!(jump.reason, SkipReason::Failover as i32);
        // Once recorded, later sends above the same floor record nothing.
        let state = SeqState {
            latest: 9906,
            floor: 9905,
            jumps: vec![jump],
        };
        assert!(floor_jump(&state, 9905, &fence(9905, Some(2380))).is_none());
    }

    #[test]
    fn a_floor_the_history_already_reaches_skips_nothing() {
        // A move's switch puts the floor at the source's latest seq, which
        // the target holds: no jump.
        let state = SeqState {
            latest: 500,
            floor: 0,
            jumps: Vec::new(),
        };
        assert!(floor_jump(&state, 500, &fence(500, None)).is_none());
        // A sync standby holds the history up to the failed owner's latest.
        let synced = SeqState {
            latest: 2400,
            ..SeqState::default()
        };
        assert!(floor_jump(&synced, 2400, &fence(2400, Some(2380))).is_none());
        // It holds more than the mark: the jump starts above what it holds.
        let jump = floor_jump(&synced, 2500, &fence(2500, Some(2380))).unwrap();
        assert_eq!((jump.first, jump.last), (2401, 2500));
    }
}
