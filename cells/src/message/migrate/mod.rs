//! The cell's part of a migration (DESIGN.md §5). As the source it exports
//! a conversation in chunks, seals it once the route is frozen (no seq is
//! assigned after, every assigned seq is durable), and digests its history
//! for verification. As the target it stores exported chunks — messages,
//! meta, members, read positions, and idempotency records rebuilt from the
//! messages' request ids — without fanning them out again ([`import`]).
//! After a failover it backfills what the failed cell acknowledged
//! ([`backfill`]).

use cellmesh_proto::ids::{ConversationId, Epoch, TenantId, UserId};
use cellmesh_proto::reason::Reason;
use std::time::{Duration, Instant};

use cellmesh_proto::storage::v1::{
    ConversationSeq, IdempotencyRecord, MemberRecord, MessageRecord, OutboxEvent, OutboxKind,
};
use cellmesh_proto::v1::{ExportChunk, ReadPosition, StoredMessage};
use sha2::{Digest, Sha256};

mod backfill;
mod import;
mod uploads;

pub(crate) use backfill::put_backfilled;
pub(crate) use import::Imported;

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
    conversation: ConversationId,
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
        tenant: TenantId,
        conversation: ConversationId,
        after_seq: u64,
        limit: usize,
    ) -> Result<ExportChunk> {
        let record = self
            .store
            .conversation(conversation)?
            .ok_or(CellError::NotFound {
                what: "conversation",
                id: conversation.get(),
            })?;
        if record.tenant_id != tenant.get() {
            return Err(CellError::denied(
                Reason::WrongTenant,
                "conversation belongs to another tenant",
            ));
        }
        let seq = self.store.conv_seq(conversation)?;
        let (members, _) = self.store.members(conversation, 0, usize::MAX)?;
        let mut read_positions = Vec::new();
        for user in &members {
            let read_seq = self.store.read_seq(conversation, UserId(*user))?;
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
            uploads: self.carried_uploads(tenant, conversation)?,
            complete: !self.incomplete_below_floor(tenant, conversation)?,
        })
    }

    /// Waits until this cell's route view has reached the freeze at
    /// `epoch` and every seq it assigned is durable; returns the final
    /// latest seq (source side).
    pub async fn seal_conversation(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
        epoch: u64,
    ) -> Result<u64> {
        let latest = self.quiesce(tenant, conversation, epoch).await?;
        self.mark_sealed(tenant, conversation).await?;
        Ok(latest)
    }

    /// [`MessageService::seal_conversation`] without recording the seal:
    /// the final latest seq once nothing more is assigned or in flight.
    pub(crate) async fn quiesce(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
        epoch: u64,
    ) -> Result<u64> {
        let deadline = Instant::now() + SEAL_TIMEOUT;
        self.await_route_epoch(epoch, deadline).await?;
        if self.ownership.check(tenant, conversation, Epoch(0)).is_ok() {
            return Err(CellError::invalid(
                Reason::NotFrozen,
                format!("conversation {conversation} is not frozen here at epoch {epoch}"),
            ));
        }
        let caller = crate::message::Caller::new(tenant, UserId(0));
        let entry = self.conversation(&caller, conversation.get())?;
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
        tenant: TenantId,
        after: u64,
        limit: usize,
        epoch: u64,
    ) -> Result<(Vec<u64>, bool)> {
        if self.store.failpoints().hit("tenant.list") == Some(crate::failpoints::Action::Error) {
            return Err(retry_later(
                Reason::PipelineBusy,
                "fail point tenant.list".into(),
            ));
        }
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
    pub fn tenant_conversation_ids(&self, tenant: TenantId) -> Result<Vec<ConversationId>> {
        let mut ids = Vec::new();
        self.scan_tenant(tenant, 0, |id| {
            ids.push(ConversationId(id));
            true
        })?;
        Ok(ids)
    }

    /// Hands the ids above `after` of `tenant`'s conversations to `take`
    /// in order until it says stop; whether it did.
    fn scan_tenant(
        &self,
        tenant: TenantId,
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
                if record.tenant_id == tenant.get() && !take(*id) {
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
    pub fn members_of(&self, conversations: &[ConversationId], after: u64) -> Result<Vec<UserId>> {
        let mut users = std::collections::BTreeSet::new();
        for &id in conversations {
            let (members, _) = self.store.members(id, after, usize::MAX)?;
            users.extend(members.into_iter().map(UserId));
        }
        Ok(users.into_iter().collect())
    }

    /// Count and checksum of the messages in `(after_seq, through_seq]`
    /// (checksums add up, so ranges compose; a cold segment wholly inside
    /// counts by its manifest entry), the latest seq and how many rewrites
    /// the conversation has seen.
    pub fn digest_conversation(
        &self,
        conversation: ConversationId,
        after_seq: u64,
        through_seq: u64,
    ) -> Result<ConversationDigest> {
        digest_conversation(&mut self.store.walk(), conversation, after_seq, through_seq)
    }

    /// Whether history of `conversation` below this cell's failover floor
    /// still awaits the backfill from the cell it was taken over from (a
    /// conversation whose record is not here awaits nothing here).
    pub fn history_awaits_backfill(&self, conversation: ConversationId) -> Result<bool> {
        match self.store.conversation(conversation)? {
            Some(record) => self.incomplete_below_floor(TenantId(record.tenant_id), conversation),
            None => Ok(false),
        }
    }

    fn incomplete_below_floor(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
    ) -> Result<bool> {
        let floor = self.ownership.floor(tenant, conversation);
        Ok(self.unavailable_through(conversation, floor)? > 0)
    }
}

/// The answer to a request id, rebuilt from its message.
fn answer(
    conversation: ConversationId,
    seq: u64,
    r: &MessageRecord,
    expires_at_ms: u64,
) -> IdempotencyRecord {
    IdempotencyRecord {
        conversation_id: conversation.get(),
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
