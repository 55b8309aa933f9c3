//! The cell's part of a migration (DESIGN.md §5). As the source it exports
//! a conversation in chunks, seals it once the route is frozen (no seq is
//! assigned after, every assigned seq is durable), and digests its history
//! for verification. As the target it stores exported chunks — messages,
//! meta, members, read positions, and idempotency records rebuilt from the
//! messages' request ids — without fanning them out again.

use cellmesh_proto::ids::{ConversationId, Epoch, TenantId};
use cellmesh_proto::reason::Reason;
use std::time::{Duration, Instant};

use cellmesh_proto::storage::v1::{
    ConversationSeq, IdempotencyRecord, MemberRecord, MessageRecord, OutboxEvent, OutboxKind,
};
use cellmesh_proto::v1::{ExportChunk, ReadPosition, StoredMessage};
use sha2::{Digest, Sha256};

use super::MessageService;
use crate::error::{CellError, Result};
use crate::storage::walk::Walk;
use crate::storage::{IdemKey, IdemKind, Mutation};

/// How long a seal waits for the frozen route and the last commits.
/// How long a copied chunk waits for this cell's route view to show the
/// move it belongs to.
const MOVING_HERE_WAIT: Duration = Duration::from_secs(2);
pub(super) const SEAL_TIMEOUT: Duration = Duration::from_secs(10);
/// Most messages in one exported chunk (or one digest page).
const MAX_EXPORT_CHUNK: usize = 10_000;
/// Most stored bytes in one exported chunk: a chunk of large messages stays
/// well inside the peers' 64 MiB message limit.
const MAX_EXPORT_BYTES: usize = 8 << 20;

/// A message's contribution to a conversation checksum; sums of these are
/// compared between source and target.
pub fn message_checksum(seq: u64, m: &MessageRecord) -> u64 {
    let mut h = Sha256::new();
    h.update(seq.to_be_bytes());
    h.update(m.msg_id.to_be_bytes());
    h.update(m.sender_id.to_be_bytes());
    h.update(m.state.to_be_bytes());
    h.update(m.edit_version.to_be_bytes());
    h.update(&m.body);
    u64::from_be_bytes(h.finalize()[..8].try_into().expect("8 bytes"))
}

/// [`MessageService::digest_conversation`] in a [`Walk`] (many
/// conversations read in a row).
pub(crate) fn digest_conversation(
    walk: &mut Walk<'_>,
    conversation: u64,
    after_seq: u64,
    through_seq: u64,
) -> Result<ConversationDigest> {
    let (mut count, mut checksum) = (0u64, 0u64);
    walk.messages(conversation, after_seq, through_seq, |seq, m| {
        count += 1;
        checksum = checksum.wrapping_add(message_checksum(seq, m));
    })?;
    // Cold segments count by their manifest entries (the objects are
    // shared and immutable; both sides hold the same entries).
    for segment in walk.segments(conversation)? {
        if segment.seq_start > after_seq && segment.seq_end <= through_seq {
            count += u64::from(segment.count);
            let head = segment.checksum.get(..8).and_then(|b| b.try_into().ok());
            checksum = checksum.wrapping_add(head.map_or(0, u64::from_be_bytes));
        }
    }
    Ok(ConversationDigest {
        count,
        checksum,
        latest_seq: walk.conv_seq(conversation)?.latest_seq,
        rewrites: (walk.meta_u64(&crate::storage::keys::meta::rewrites(conversation))?)
            .unwrap_or(0),
    })
}

fn retry_later(reason: Reason, message: String) -> CellError {
    CellError::RetryLater {
        reason,
        message,
        retry_after: Duration::from_millis(200),
    }
}

/// See [`MessageService::digest_conversation`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConversationDigest {
    pub count: u64,
    pub checksum: u64,
    pub latest_seq: u64,
    pub rewrites: u64,
}

impl MessageService {
    /// Waits until this cell's route view has reached `epoch`.
    pub(crate) async fn await_route_epoch(&self, epoch: u64, deadline: Instant) -> Result<()> {
        let left = deadline.saturating_duration_since(Instant::now());
        if self.ownership.await_route_index(epoch, left).await {
            return Ok(());
        }
        Err(retry_later(
            Reason::RouteBehind,
            format!("this cell has not seen route epoch {epoch} yet"),
        ))
    }

    /// A chunk of `conversation` after `after_seq` (source side).
    pub fn export_conversation(
        &self,
        tenant: u64,
        conversation: u64,
        after_seq: u64,
        limit: usize,
    ) -> Result<ExportChunk> {
        let record = self
            .store
            .conversation(conversation)?
            .ok_or(CellError::NotFound {
                what: "conversation",
                id: conversation,
            })?;
        if record.tenant_id != tenant {
            return Err(CellError::denied(
                Reason::WrongTenant,
                "conversation belongs to another tenant",
            ));
        }
        let seq = self.store.conv_seq(conversation)?;
        let (members, _) = self.store.members(conversation, 0, usize::MAX)?;
        let mut read_positions = Vec::new();
        for user in &members {
            let read_seq = self.store.read_seq(conversation, *user)?;
            if read_seq > 0 {
                read_positions.push(ReadPosition {
                    user_id: *user,
                    read_seq,
                });
            }
        }
        let limit = limit.clamp(1, MAX_EXPORT_CHUNK);
        let messages =
            (self.store).messages_after(conversation, after_seq, limit, MAX_EXPORT_BYTES)?;
        let checksum = messages.iter().fold(0u64, |acc, (s, m)| {
            acc.wrapping_add(message_checksum(*s, m))
        });
        count_rows("out", messages.len());
        Ok(ExportChunk {
            conversation: Some(record),
            members,
            read_positions,
            messages: messages
                .into_iter()
                .map(|(seq, record)| StoredMessage {
                    seq,
                    record: Some(record),
                })
                .collect(),
            latest_seq: seq.latest_seq,
            seq_floor: seq.seq_floor,
            seq_jumps: seq.jumps,
            checksum,
            // Cold history goes as its manifest (the objects are shared):
            // the segments that reach beyond what earlier chunks copied.
            segments: self
                .store
                .segments(conversation)?
                .into_iter()
                .filter(|s| s.seq_end > after_seq)
                .collect(),
        })
    }

    /// Waits until this cell's route view has reached the freeze at
    /// `epoch` and every seq it assigned is durable; returns the final
    /// latest seq (source side).
    pub async fn seal_conversation(
        &self,
        tenant: u64,
        conversation: u64,
        epoch: u64,
    ) -> Result<u64> {
        let latest = self.quiesce(tenant, conversation, epoch).await?;
        self.mark_sealed(tenant, conversation).await?;
        Ok(latest)
    }

    /// [`MessageService::seal_conversation`] without recording the seal:
    /// the final latest seq once nothing more is assigned or in flight.
    pub(crate) async fn quiesce(&self, tenant: u64, conversation: u64, epoch: u64) -> Result<u64> {
        let deadline = Instant::now() + SEAL_TIMEOUT;
        self.await_route_epoch(epoch, deadline).await?;
        if self
            .ownership
            .check(TenantId(tenant), ConversationId(conversation), Epoch(0))
            .is_ok()
        {
            return Err(CellError::invalid(
                Reason::NotFrozen,
                format!("conversation {conversation} is not frozen here at epoch {epoch}"),
            ));
        }
        let caller = crate::message::Caller { tenant, user: 0 };
        let entry = self.conversation(&caller, conversation)?;
        // Sends check ownership under this lock, so none assigns after it.
        let latest = entry.seq.lock().expect("sequencer lock").latest;
        // Rewrites (recall, edit) check it under this one: wait out any in
        // flight; none starts after.
        drop(entry.admin.lock().await);
        while self.store.conv_seq(conversation)?.latest_seq < latest {
            if let Some(failure) = self.store.failed() {
                return Err(CellError::Storage(crate::storage::StorageError::Failed(
                    failure,
                )));
            }
            if Instant::now() > deadline {
                return Err(retry_later(
                    Reason::CommitPending,
                    "the last sends are not durable yet".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(latest)
    }

    /// Ids above `after` of the conversations of `tenant` stored here, at
    /// most `limit`, and whether more may follow (source side of a tenant
    /// move). With `epoch` set, first waits until this cell's route view
    /// has reached it and no creation checked before then is in flight.
    pub async fn tenant_conversations(
        &self,
        tenant: u64,
        after: u64,
        limit: usize,
        epoch: u64,
    ) -> Result<(Vec<u64>, bool)> {
        if epoch > 0 {
            self.await_route_epoch(epoch, Instant::now() + SEAL_TIMEOUT)
                .await?;
            drop(self.creating.write().await);
        }
        let limit = limit.clamp(1, 10_000);
        let mut out = Vec::new();
        let more = self.scan_tenant(tenant, after, |id| {
            if out.len() == limit {
                return false;
            }
            out.push(id);
            true
        })?;
        Ok((out, more))
    }

    /// Every conversation of `tenant` stored here, in id order.
    pub fn tenant_conversation_ids(&self, tenant: u64) -> Result<Vec<u64>> {
        let mut ids = Vec::new();
        self.scan_tenant(tenant, 0, |id| {
            ids.push(id);
            true
        })?;
        Ok(ids)
    }

    /// Hands the ids above `after` of `tenant`'s conversations to `take`
    /// in order until it says stop; whether it did.
    fn scan_tenant(
        &self,
        tenant: u64,
        after: u64,
        mut take: impl FnMut(u64) -> bool,
    ) -> Result<bool> {
        const PAGE: usize = 1_000;
        let mut cursor = after;
        loop {
            let page = self.store.conversations_after(cursor, PAGE)?;
            let Some(&(last, _)) = page.last() else {
                return Ok(false);
            };
            for (id, record) in page.iter() {
                if record.tenant_id == tenant && !take(*id) {
                    return Ok(true);
                }
            }
            if page.len() < PAGE {
                return Ok(false);
            }
            cursor = last;
        }
    }

    /// The members above `after` of any of `conversations`, in order.
    pub fn members_of(&self, conversations: &[u64], after: u64) -> Result<Vec<u64>> {
        let mut users = std::collections::BTreeSet::new();
        for &id in conversations {
            let (members, _) = self.store.members(id, after, usize::MAX)?;
            users.extend(members);
        }
        Ok(users.into_iter().collect())
    }

    /// Count and checksum of the messages in `(after_seq, through_seq]`
    /// (checksums add up, so ranges compose; a cold segment wholly inside
    /// counts by its manifest entry), the latest seq and how many rewrites
    /// the conversation has seen.
    pub fn digest_conversation(
        &self,
        conversation: u64,
        after_seq: u64,
        through_seq: u64,
    ) -> Result<ConversationDigest> {
        digest_conversation(&mut self.store.walk(), conversation, after_seq, through_seq)
    }

    /// Stores the messages of a chunk from a returned failed cell: history
    /// below this (owning) cell's floor, the route's when no send here has
    /// stored it yet, and the conversation's meta when none reached this
    /// cell before the failover. Nothing else of the conversation changes
    /// here, so it is safe while this cell serves sends above it.
    /// Stages in `m` one message of the failed cell's history at `seq`
    /// (at or below `floor`): its request's answer reconciled with what
    /// this cell answered since, unless this cell holds it already.
    fn backfill_message(
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
                tenant,
                user: r.sender_id,
                client_req_id: r.client_req_id.clone(),
            };
            let accepted = self.store.idempotency(&key)?;
            match reconcile(conversation, seq, floor, accepted.as_ref()) {
                Reconcile::Keep => {}
                Reconcile::Answer => {
                    let expires_at_ms = self.idempotency_expiry(r.server_ts_ms);
                    if expires_at_ms > now {
                        m.put_idempotency(&key, &answer(conversation, seq, &r, expires_at_ms));
                    }
                }
                Reconcile::LaterAnswerStands => {
                    self.mark_duplicate(m, tenant, conversation, seq, &mut r, now)?;
                }
            }
        }
        // A `sync` standby stored it already, and may have changed it
        // since (a recall or edit served here after the failover).
        if self
            .store
            .message(conversation, seq)?
            .is_some_and(|here| here.msg_id == r.msg_id && here.edit_version >= r.edit_version)
        {
            return Ok(());
        }
        m.put_message(conversation, seq, &r);
        Ok(())
    }

    pub async fn backfill_chunk(
        &self,
        tenant: u64,
        conversation: u64,
        mut chunk: ExportChunk,
    ) -> Result<()> {
        let jumps = std::mem::take(&mut chunk.seq_jumps);
        let floor = self.store.conv_seq(conversation)?.seq_floor.max(
            self.ownership
                .floor(TenantId(tenant), ConversationId(conversation)),
        );
        if chunk
            .conversation
            .as_ref()
            .is_some_and(|c| c.tenant_id != tenant)
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
            (self.store).stage_meta(&mut m, conversation, record, &chunk.members)?;
            for p in &chunk.read_positions {
                m.raise_read_seq(conversation, p.user_id, p.read_seq);
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
            self.backfill_message(&mut m, (tenant, conversation), (floor, now), message.seq, r)?;
        }
        imported.emit(tenant, conversation, &mut m);
        // The failed cell's floor jumps (an earlier failover's) join this
        // cell's, written in seq order with its sends.
        if !jumps.is_empty()
            && let Some(conv) = self.entry(conversation)?
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
            return Ok(());
        }
        if !m.is_empty() {
            self.store.commit(m).await?;
        }
        Ok(())
    }

    /// Turns `copy`, the failed cell's message at `seq` whose request id
    /// this cell answered with a message of its own, into a tombstone,
    /// announced to the members as a recall (the failed cell may have
    /// fanned it out before it failed).
    fn mark_duplicate(
        &self,
        m: &mut Mutation,
        tenant: u64,
        conversation: u64,
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
            tenant_id: tenant,
            conversation_id: conversation,
            seq,
            msg_id: copy.msg_id,
            user_id: copy.sender_id,
            server_ts_ms: now,
            items: copy.visible_to.clone(),
            ..Default::default()
        });
        tracing::info!(
            conversation,
            seq,
            "a backfilled message is the duplicate of a re-send answered during the failover"
        );
        Ok(())
    }

    /// Records that the history below the floor is back.
    pub fn mark_backfilled(&self, conversation: u64, through: u64) -> Result<()> {
        self.store.put_meta_u64_sync(
            &crate::storage::keys::meta::backfilled(conversation),
            through.max(1),
        )?;
        Ok(())
    }

    pub fn backfilled(&self, conversation: u64) -> Result<bool> {
        Ok(self
            .store
            .meta_u64(&crate::storage::keys::meta::backfilled(conversation))?
            .is_some())
    }

    /// Copied history is stored only while the route table moves the
    /// conversation here. The mover commits that before it asks for a
    /// copy, so a view that does not show it yet is given a moment to
    /// catch up; then the chunk is refused for good.
    async fn await_moving_here(&self, tenant: u64, conversation: u64) -> Result<()> {
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
    async fn checked_chunk(
        &self,
        tenant: u64,
        conversation: u64,
        chunk: &mut ExportChunk,
    ) -> Result<cellmesh_proto::storage::v1::ConversationRecord> {
        let record = chunk.conversation.take().ok_or_else(|| {
            CellError::invalid(Reason::EmptyChunk, "the chunk has no conversation")
        })?;
        if record.tenant_id != tenant {
            return Err(CellError::denied(
                Reason::WrongTenant,
                "the source answered for another tenant",
            ));
        }
        self.await_moving_here(tenant, conversation).await?;
        if let Some(held) = self.store.conversation(conversation)?
            && held.tenant_id != tenant
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
        tenant: u64,
        conversation: u64,
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
                tenant_id: tenant,
                conversation_id: conversation,
                ..Default::default()
            });
        }
        m.put_conversation(conversation, &record);
        for user in &chunk.members {
            m.put_member(conversation, *user, &MemberRecord { joined_at_ms: 0 });
        }
        for p in &chunk.read_positions {
            m.raise_read_seq(conversation, p.user_id, p.read_seq);
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
                    user: r.sender_id,
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
        let mut foreign_files = false;
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
            foreign_files |= self.note_foreign_files(tenant, conversation, &r, &mut m)?;
            m.put_message(conversation, message.seq, &r);
        }
        imported.emit(tenant, conversation, &mut m);
        if !answered.is_empty() {
            m.emit(&OutboxEvent {
                kind: OutboxKind::AnswerSync as i32,
                tenant_id: tenant,
                conversation_id: conversation,
                items: answered,
                ..Default::default()
            });
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
        if foreign_files {
            self.wake_copier();
        }
        self.conversations.invalidate(conversation);
        // History stored here is built on: its mark goes to the standbys.
        self.marks.note(tenant, conversation, latest);
        Ok(latest)
    }
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
    conversation: u64,
    seq: u64,
    floor: u64,
    accepted: Option<&IdempotencyRecord>,
) -> Reconcile {
    match accepted {
        None => Reconcile::Answer,
        Some(a) if a.conversation_id != conversation || a.seq == seq => Reconcile::Keep,
        Some(a) if a.seq > floor => Reconcile::LaterAnswerStands,
        // Two copies below the floor cannot come from one request: keep
        // the answer the client was given.
        Some(_) => Reconcile::Keep,
    }
}

/// The answer to a request id, rebuilt from its message.
fn answer(conversation: u64, seq: u64, r: &MessageRecord, expires_at_ms: u64) -> IdempotencyRecord {
    IdempotencyRecord {
        conversation_id: conversation,
        msg_id: r.msg_id,
        seq,
        server_ts_ms: r.server_ts_ms,
        expires_at_ms,
    }
}

/// Counts rows a move copied through this cell.
fn count_rows(direction: &'static str, rows: usize) {
    crate::metrics::metrics()
        .migration_rows
        .get_or_create(&crate::metrics::DirectionLabel { direction })
        .inc_by(rows as u64);
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
        assert_eq!(reconcile(7, 3, 100, None), Reconcile::Answer);
        // The answer already is the original (replicated to the standby).
        assert_eq!(reconcile(7, 3, 100, Some(&accepted(7, 3))), Reconcile::Keep);
        // A re-send reached the new owner first (inside the replication
        // window): the answer it got stands.
        assert_eq!(
            reconcile(7, 3, 100, Some(&accepted(7, 101))),
            Reconcile::LaterAnswerStands
        );
        // The same request id in another conversation is another request.
        assert_eq!(
            reconcile(7, 3, 100, Some(&accepted(8, 101))),
            Reconcile::Keep
        );
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
    pub(crate) fn emit(&self, tenant: u64, conversation: u64, m: &mut Mutation) {
        if let Some((first, last)) = self.0 {
            m.emit(&OutboxEvent {
                kind: OutboxKind::HistoryImported as i32,
                tenant_id: tenant,
                conversation_id: conversation,
                items: vec![first, last],
                ..Default::default()
            });
        }
    }
}
