//! The target's side of a move: copied chunks checked against the source's
//! checksum and stored (messages, meta, members, read positions, answers
//! rebuilt from request ids) without fanning them out again.

use super::*;
use crate::message::attach_copy::Noted;
use cellmesh_proto::ids::{ConversationId, TenantId, UserId};

impl MessageService {
    /// Copied history is stored only while the route table moves the
    /// conversation here. The mover commits that before it asks for a
    /// copy, so a view that does not show it yet is given a moment to
    /// catch up; then the chunk is refused for good.
    pub(super) async fn await_moving_here(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
    ) -> Result<()> {
        let deadline = Instant::now() + MOVING_HERE_WAIT;
        while !self.ownership.moving_here(tenant, conversation) {
            if Instant::now() >= deadline {
                return Err(CellError::invalid(
                    Reason::NotMovingHere,
                    format!(
                        "the route table does not move conversation {conversation} of tenant {tenant} to this cell"
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Stores an exported chunk (target side); returns the highest seq now
    /// stored here. With `describe` (the first chunk of a copy round) the
    /// conversation's meta goes on to this cell's standbys even when it is
    /// unchanged here: this cell may hold it as a standby of the source,
    /// and its own standbys must hold it before the route switches here.
    /// The conversation record of a copied `chunk` of `conversation`,
    /// once the chunk is checked: the source answered for `tenant`, the
    /// route moves the conversation here, no other tenant's conversation of
    /// that id is held here, and the messages match their checksum.
    pub(super) async fn checked_chunk(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
        chunk: &mut ExportChunk,
    ) -> Result<cellmesh_proto::storage::v1::ConversationRecord> {
        let record = chunk.conversation.take().ok_or_else(|| {
            CellError::invalid(Reason::EmptyChunk, "the chunk has no conversation")
        })?;
        if record.tenant_id != tenant.get() {
            return Err(CellError::denied(
                Reason::WrongTenant,
                "the source answered for another tenant",
            ));
        }
        self.await_moving_here(tenant, conversation).await?;
        if let Some(held) = self.store.conversation(conversation)?
            && held.tenant_id != tenant.get()
        {
            return Err(CellError::denied(
                Reason::WrongTenant,
                format!("conversation {conversation} here belongs to another tenant"),
            ));
        }
        let sum = chunk
            .messages
            .iter()
            .filter_map(|m| m.record.as_ref().map(|r| message_checksum(m.seq, r)))
            .fold(0u64, u64::wrapping_add);
        if sum != chunk.checksum {
            return Err(retry_later(
                Reason::ChunkChecksum,
                "a migration chunk arrived corrupted".into(),
            ));
        }
        Ok(record)
    }

    pub async fn import_chunk(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
        mut chunk: ExportChunk,
        describe: bool,
    ) -> Result<u64> {
        let record = self.checked_chunk(tenant, conversation, &mut chunk).await?;
        let now = self.now_ms();
        let stored = self.store.conv_seq(conversation)?;
        let mut latest = stored.latest_seq;
        let mut m = Mutation::new();
        // New or changed meta goes on to this cell's own standbys.
        let (known, _) = self.store.members(conversation, 0, usize::MAX)?;
        let changed = self.store.conversation(conversation)?.as_ref() != Some(&record)
            || known.len() != chunk.members.len()
            || chunk.members.iter().any(|u| !known.contains(u));
        if changed || describe {
            m.emit(&OutboxEvent {
                kind: OutboxKind::MetaSync as i32,
                tenant_id: tenant.get(),
                conversation_id: conversation.get(),
                ..Default::default()
            });
        }
        m.put_conversation(conversation, &record);
        for user in &chunk.members {
            m.put_member(
                conversation,
                UserId(*user),
                &MemberRecord { joined_at_ms: 0 },
            );
        }
        for p in &chunk.read_positions {
            m.raise_read_seq(conversation, UserId(p.user_id), p.read_seq);
        }
        count_rows("in", chunk.messages.len());
        self.adopt_segments(conversation, &chunk.segments, u64::MAX)
            .await?;
        let ttl_ms = self.config.idempotency.ttl_secs * 1000;
        let answer_for = |m: &mut Mutation, seq: u64, r: &MessageRecord| {
            let expires = r.server_ts_ms + ttl_ms;
            if !r.client_req_id.is_empty() && expires > now {
                let key = IdemKey {
                    kind: IdemKind::Send,
                    tenant,
                    user: UserId(r.sender_id),
                    client_req_id: r.client_req_id.clone(),
                };
                m.put_idempotency(&key, &answer(conversation, seq, r, expires));
                true
            } else {
                false
            }
        };
        // The seqs whose answers were stored: this cell's standbys get them
        // too (one event for the chunk), to answer a re-send as it would.
        let mut answered = Vec::new();
        let carried = std::mem::take(&mut chunk.uploads);
        let mut files = Noted::default();
        let at = (tenant, conversation);
        self.stage_carried_uploads(at, carried, &chunk.messages, &mut m, &mut files)?;
        let mut imported = Imported::default();
        for segment in &chunk.segments {
            imported.add(segment.seq_start, segment.seq_end);
            latest = latest.max(segment.seq_end);
            m.put_segment(conversation, segment);
            // Requests answered recently enough to be re-sent keep their
            // answer here even when their message is already cold.
            if segment.last_ts_ms + ttl_ms > now {
                for (seq, r) in self.segment_messages(conversation, segment).await?.iter() {
                    answer_for(&mut m, *seq, r);
                }
            }
        }
        for message in chunk.messages {
            let Some(r) = message.record else {
                continue;
            };
            latest = latest.max(message.seq);
            imported.add(message.seq, message.seq);
            if answer_for(&mut m, message.seq, &r) {
                answered.push(message.seq);
            }
            self.note_files(tenant, conversation, &r, &mut m, &mut files)?;
            self.reference_files(tenant, &r, &mut m)?;
            m.put_message(conversation, message.seq, &r);
        }
        imported.emit(tenant, conversation, &mut m);
        if !answered.is_empty() {
            m.emit(&OutboxEvent {
                kind: OutboxKind::AnswerSync as i32,
                tenant_id: tenant.get(),
                conversation_id: conversation.get(),
                items: answered,
                ..Default::default()
            });
        }
        if chunk.complete {
            // Whole at the source: nothing here waits for a backfill.
            let floor = self.failover_floor(tenant, conversation)?;
            put_backfilled(&mut m, conversation, latest, floor.max(chunk.seq_floor));
        }
        let mut jumps = stored.jumps;
        crate::convert::merge_jumps(&mut jumps, &chunk.seq_jumps);
        m.put_conv_seq(
            conversation,
            &ConversationSeq {
                latest_seq: latest,
                seq_floor: stored.seq_floor.max(chunk.seq_floor),
                jumps,
            },
        );
        self.store.commit(m).await?;
        self.noted_files(tenant, files);
        self.conversations.invalidate(conversation);
        // History stored here is built on: its mark goes to the standbys.
        self.marks.note(tenant, conversation, latest);
        Ok(latest)
    }
}

/// The seqs a chunk stored, for the search index to read.
#[derive(Default)]
pub(crate) struct Imported(Option<(u64, u64)>);

impl Imported {
    pub(crate) fn add(&mut self, first: u64, last: u64) {
        self.0 = Some(match self.0 {
            Some((lo, hi)) => (lo.min(first), hi.max(last)),
            None => (first, last),
        });
    }

    /// Tells the indexer (through the outbox) what was stored, if anything.
    pub(crate) fn emit(&self, tenant: TenantId, conversation: ConversationId, m: &mut Mutation) {
        if let Some((first, last)) = self.0 {
            m.emit(&OutboxEvent {
                kind: OutboxKind::HistoryImported as i32,
                tenant_id: tenant.get(),
                conversation_id: conversation.get(),
                items: vec![first, last],
                ..Default::default()
            });
        }
    }
}
