//! The failover backfill: messages a failed cell acknowledged that its
//! standby, now the owner, had not received, stored below the failover
//! floor with their request ids reconciled against the answers given here.

use super::*;
use cellmesh_proto::ids::{ConversationId, TenantId, UserId};

impl MessageService {
    /// Stores the messages of a chunk from a returned failed cell: history
    /// below this (owning) cell's floor, the route's when no send here has
    /// stored it yet, and the conversation's meta when none reached this
    /// cell before the failover. Nothing else of the conversation changes
    /// here, so it is safe while this cell serves sends above it.
    /// Stages in `m` one message of the failed cell's history at `seq`
    /// (at or below `floor`): its request's answer reconciled with what
    /// this cell answered since, unless this cell holds it already.
    pub(super) fn backfill_message(
        &self,
        m: &mut Mutation,
        (tenant, conversation): (u64, u64),
        (floor, now): (u64, u64),
        seq: u64,
        mut r: MessageRecord,
    ) -> Result<()> {
        if !r.client_req_id.is_empty() {
            let key = IdemKey {
                kind: IdemKind::Send,
                tenant: TenantId(tenant),
                user: UserId(r.sender_id),
                client_req_id: r.client_req_id.clone(),
            };
            let accepted = self.store.idempotency(&key)?;
            match reconcile(ConversationId(conversation), seq, floor, accepted.as_ref()) {
                Reconcile::Keep => {}
                Reconcile::Answer => {
                    let expires_at_ms = self.idempotency_expiry(r.server_ts_ms);
                    if expires_at_ms > now {
                        m.put_idempotency(
                            &key,
                            &answer(ConversationId(conversation), seq, &r, expires_at_ms),
                        );
                    }
                }
                Reconcile::LaterAnswerStands => {
                    self.mark_duplicate(
                        m,
                        TenantId(tenant),
                        ConversationId(conversation),
                        seq,
                        &mut r,
                        now,
                    )?;
                }
            }
        }
        // A `sync` standby stored it already, and may have changed it
        // since (a recall or edit served here after the failover).
        if self
            .store
            .message(ConversationId(conversation), seq)?
            .is_some_and(|here| here.msg_id == r.msg_id && here.edit_version >= r.edit_version)
        {
            return Ok(());
        }
        m.put_message(ConversationId(conversation), seq, &r);
        Ok(())
    }

    pub async fn backfill_chunk(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
        mut chunk: ExportChunk,
    ) -> Result<()> {
        let jumps = std::mem::take(&mut chunk.seq_jumps);
        let floor = self.failover_floor(tenant, conversation)?;
        if chunk
            .conversation
            .as_ref()
            .is_some_and(|c| c.tenant_id != tenant.get())
        {
            return Err(CellError::denied(
                Reason::WrongTenant,
                "the source answered for another tenant",
            ));
        }
        let now = self.now_ms();
        let mut m = Mutation::new();
        // A conversation failed over here before its meta arrived gets its
        // record, members and read positions from the returned cell; one
        // this cell holds keeps its own (changed here since, perhaps).
        if let Some(record) = &chunk.conversation
            && self.store.conversation(conversation)?.is_none()
        {
            (self.store).stage_meta(&mut m, conversation, record, &UserId::many(&chunk.members))?;
            for p in &chunk.read_positions {
                m.raise_read_seq(conversation, UserId(p.user_id), p.read_seq);
            }
            // No send here has loaded it: its seq record takes the jumps.
            let mut seq = self.store.conv_seq(conversation)?;
            crate::convert::merge_jumps(&mut seq.jumps, &jumps);
            m.put_conv_seq(conversation, &seq);
        }
        // The failed cell's cold history below the floor: its manifest.
        let below: Vec<_> = chunk
            .segments
            .into_iter()
            .filter(|s| s.seq_end <= floor)
            .collect();
        self.adopt_segments(conversation, &below, floor).await?;
        // Uploads the failed cell held open are resumed or sent here.
        let carried = std::mem::take(&mut chunk.uploads);
        let mut files = crate::message::attach_copy::Noted::default();
        let at = (tenant, conversation);
        self.stage_carried_uploads(at, carried, &chunk.messages, &mut m, &mut files)?;
        let mut imported = Imported::default();
        for segment in &below {
            imported.add(segment.seq_start, segment.seq_end);
            m.put_segment(conversation, segment);
        }
        for message in chunk.messages {
            let Some(r) = message.record else {
                continue;
            };
            if message.seq > floor {
                // Never overwrite what this cell assigned above its floor.
                continue;
            }
            imported.add(message.seq, message.seq);
            self.reference_files(tenant, &r, &mut m)?;
            self.backfill_message(
                &mut m,
                (tenant.get(), conversation.get()),
                (floor, now),
                message.seq,
                r,
            )?;
        }
        imported.emit(tenant, conversation, &mut m);
        // The failed cell's floor jumps (an earlier failover's) join this
        // cell's, written in seq order with its sends.
        if !jumps.is_empty()
            && let Some(conv) = self.entry(conversation.get())?
        {
            let slot = self.store.reserve().await?;
            let ticket = {
                let mut state = conv.seq.lock().expect("sequencer lock");
                let mut merged = state.jumps.clone();
                if crate::convert::merge_jumps(&mut merged, &jumps) {
                    m.put_conv_seq(
                        conversation,
                        &ConversationSeq {
                            latest_seq: state.latest,
                            seq_floor: state.floor,
                            jumps: merged.clone(),
                        },
                    );
                    state.jumps = merged;
                }
                slot.submit(m)
            };
            ticket.wait().await?;
        } else if !m.is_empty() {
            self.store.commit(m).await?;
        }
        self.noted_files(tenant, files);
        Ok(())
    }

    /// Turns `copy`, the failed cell's message at `seq` whose request id
    /// this cell answered with a message of its own, into a tombstone,
    /// announced to the members as a recall (the failed cell may have
    /// fanned it out before it failed).
    pub(super) fn mark_duplicate(
        &self,
        m: &mut Mutation,
        tenant: TenantId,
        conversation: ConversationId,
        seq: u64,
        copy: &mut MessageRecord,
        now: u64,
    ) -> Result<()> {
        if copy.state == cellmesh_proto::v1::MessageState::Recalled as i32 {
            return Ok(());
        }
        copy.state = cellmesh_proto::v1::MessageState::Recalled as i32;
        copy.body.clear();
        copy.edited_at_ms = now;
        copy.edit_version += 1;
        let rewrites = crate::storage::keys::meta::rewrites(conversation);
        let count = self.store.meta_u64(&rewrites)?.unwrap_or(0);
        m.put_meta_u64(&rewrites, count + 1);
        m.emit(&OutboxEvent {
            kind: OutboxKind::Recall as i32,
            tenant_id: tenant.get(),
            conversation_id: conversation.get(),
            seq,
            msg_id: copy.msg_id,
            user_id: copy.sender_id,
            server_ts_ms: now,
            items: copy.visible_to.clone(),
            ..Default::default()
        });
        tracing::info!(
            %conversation,
            seq,
            "a backfilled message is the duplicate of a re-send answered during the failover"
        );
        Ok(())
    }

    /// Records that the history below the current floor is back (copied
    /// through `through`).
    pub async fn mark_backfilled(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
        through: u64,
    ) -> Result<()> {
        let floor = self.failover_floor(tenant, conversation)?;
        let mut m = Mutation::new();
        put_backfilled(&mut m, conversation, through, floor);
        self.store.commit(m).await?;
        Ok(())
    }

    /// The floor of `conversation` here: stored, or set by its route.
    pub(crate) fn failover_floor(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
    ) -> Result<u64> {
        Ok((self.store.conv_seq(conversation)?.seq_floor)
            .max(self.ownership.floor(tenant, conversation)))
    }

    /// Whether the history of `conversation` below its failover `floor` is
    /// all here: backfilled from the cell it was taken over from, or begun,
    /// restored or moved in whole at that floor or above. A backfill of an
    /// earlier takeover, at a lower floor, is no answer for this one.
    pub fn backfilled(&self, conversation: ConversationId, floor: u64) -> Result<bool> {
        let meta = |key: Vec<u8>| self.store.meta_u64(&key);
        Ok(
            match meta(crate::storage::keys::meta::backfilled_floor(conversation))? {
                Some(whole_to) => whole_to >= floor,
                // Recorded by an earlier release: for the takeover then.
                None => meta(crate::storage::keys::meta::backfilled(conversation))?.is_some(),
            },
        )
    }
}

/// Stages the record that `conversation`'s history is whole below `floor`
/// (copied through `through`): the floor, and for releases before 0.3.0
/// the seq.
pub(crate) fn put_backfilled(
    m: &mut Mutation,
    conversation: ConversationId,
    through: u64,
    floor: u64,
) {
    m.put_meta_u64(
        &crate::storage::keys::meta::backfilled(conversation),
        through.max(1),
    );
    m.put_meta_u64(
        &crate::storage::keys::meta::backfilled_floor(conversation),
        floor.max(through).max(1),
    );
}

/// What a backfilled message (at `seq`, below the failover `floor`) does
/// to the answer this cell holds for its request id.
#[derive(Debug, PartialEq, Eq)]
enum Reconcile {
    /// The answer already names it, or names another conversation.
    Keep,
    /// No answer here: rebuild it from the message.
    Answer,
    /// A re-send was accepted here above the floor while the original's
    /// cell was failed, its answer not yet replicated here: the answer this
    /// cell gave stands (a client re-sends what it got no answer for, and
    /// the edge retries a send its owner did not answer), and the backfilled
    /// copy becomes its duplicate.
    LaterAnswerStands,
}

fn reconcile(
    conversation: ConversationId,
    seq: u64,
    floor: u64,
    accepted: Option<&IdempotencyRecord>,
) -> Reconcile {
    match accepted {
        None => Reconcile::Answer,
        Some(a) if a.conversation_id != conversation.get() || a.seq == seq => Reconcile::Keep,
        Some(a) if a.seq > floor => Reconcile::LaterAnswerStands,
        // Two copies below the floor cannot come from one request: keep
        // the answer the client was given.
        Some(_) => Reconcile::Keep,
    }
}

#[cfg(test)]
mod reconcile_tests {
    use super::*;

    fn accepted(conversation: u64, seq: u64) -> IdempotencyRecord {
        IdempotencyRecord {
            conversation_id: conversation,
            seq,
            ..Default::default()
        }
    }

    #[test]
    fn a_request_id_keeps_the_answer_last_given() {
        // Backfill first: the answer is rebuilt from the original.
        assert_eq!(
            reconcile(ConversationId(7), 3, 100, None),
            Reconcile::Answer
        );
        // The answer already is the original (replicated to the standby).
        assert_eq!(
            reconcile(ConversationId(7), 3, 100, Some(&accepted(7, 3))),
            Reconcile::Keep
        );
        // A re-send reached the new owner first (inside the replication
        // window): the answer it got stands.
        assert_eq!(
            reconcile(ConversationId(7), 3, 100, Some(&accepted(7, 101))),
            Reconcile::LaterAnswerStands
        );
        // The same request id in another conversation is another request.
        assert_eq!(
            reconcile(ConversationId(7), 3, 100, Some(&accepted(8, 101))),
            Reconcile::Keep
        );
    }
}
