//! Replication mode `sync`, standby side: stores the writes an owner ships
//! before it acknowledges them (see `crate::replication`) — messages at
//! their seqs, the answers of new ones, the conversation's latest seq — in
//! one synced commit, and remembers from which seq on the conversation's
//! history is complete here, so that after a failover `Pull` serves it
//! without waiting for the backfill. A write of a conversation this cell
//! holds no record of must carry its meta (record and members), so a
//! promoted standby never holds history it cannot serve.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::reason::Reason;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use cellmesh_proto::v1::ReplicatedWrite;

use super::MessageService;
use crate::error::{CellError, Result};
use crate::storage::{IdemKey, IdemKind, Mutation, keys};

/// What one batch of replicated writes stages, per conversation.
#[derive(Default)]
struct Staged {
    m: Mutation,
    /// The conversation's seq record (latest seq raised).
    seqs: HashMap<ConversationId, cellmesh_proto::storage::v1::ConversationSeq>,
    /// The first replicated seq, where it moves down.
    from: HashMap<ConversationId, Option<u64>>,
    /// Conversations whose meta this batch stores.
    described: HashSet<ConversationId>,
    /// Its tenant and the seqs stored, for the search index.
    imported: HashMap<ConversationId, (TenantId, super::migrate::Imported)>,
    stored: u32,
}

/// The ids, seq and record of a replicated write, or why it is malformed.
fn parts(
    write: &mut ReplicatedWrite,
) -> Result<(
    TenantId,
    ConversationId,
    u64,
    cellmesh_proto::storage::v1::MessageRecord,
)> {
    let Some(message) = write.message.take() else {
        return Err(CellError::invalid(
            Reason::NoMessage,
            "a replicated write carries its message",
        ));
    };
    let Some(record) = message.record else {
        return Err(CellError::invalid(
            Reason::NoMessage,
            "a replicated message carries its record",
        ));
    };
    if write.tenant_id == 0 || write.conversation_id == 0 || message.seq == 0 {
        return Err(CellError::invalid(
            Reason::BadReplicatedWrite,
            "tenant, conversation and seq are required",
        ));
    }
    let ids = (
        TenantId(write.tenant_id),
        ConversationId(write.conversation_id),
    );
    Ok((ids.0, ids.1, message.seq, record))
}

impl MessageService {
    /// Checks a replicated write's conversation against what this standby
    /// holds, staging the meta sent with it when the conversation is new
    /// here (and noting it in `described`).
    fn stage_standby_meta(
        &self,
        staged: &mut Staged,
        (tenant, conversation): (TenantId, ConversationId),
        meta: Option<&cellmesh_proto::v1::ConversationMeta>,
    ) -> Result<()> {
        match self.store.conversation(conversation)? {
            Some(stored) if stored.tenant_id != tenant.get() => {
                return Err(CellError::denied(
                    Reason::WrongTenant,
                    "conversation belongs to another tenant",
                ));
            }
            Some(_) => {}
            // A message is stored here only with its conversation: a
            // failover must find the conversation, not just its history.
            None if !staged.described.contains(&conversation) => {
                let Some(record) = meta.and_then(|m| m.record.as_ref()) else {
                    return Err(CellError::RetryLater {
                        reason: Reason::StandbyLacksMeta,
                        message: format!(
                            "this standby holds no record of conversation {conversation}: \
                             send its meta with the write"
                        ),
                        retry_after: Duration::ZERO,
                    });
                };
                if record.tenant_id != tenant.get() {
                    return Err(CellError::denied(
                        Reason::WrongTenant,
                        "the replicated record names another tenant",
                    ));
                }
                let members = meta.map(|x| x.members.as_slice()).unwrap_or_default();
                (self.store).stage_meta(
                    &mut staged.m,
                    conversation,
                    record,
                    &UserId::many(members),
                )?;
                staged.described.insert(conversation);
            }
            None => {}
        }
        Ok(())
    }

    /// Stores `writes` from the owner `source`; returns how many messages
    /// it stored. Refuses (`NOT_A_STANDBY`) a conversation this cell owns.
    pub async fn store_replicated(
        &self,
        source: &str,
        writes: Vec<ReplicatedWrite>,
    ) -> Result<u32> {
        if source.is_empty() {
            return Err(CellError::invalid(
                Reason::NoSourceCell,
                "source_cell is required",
            ));
        }
        let mut staged = Staged::default();
        for mut write in writes {
            let (tenant, conversation, seq, record) = parts(&mut write)?;
            if self.ownership.check_read(tenant, conversation).is_ok() {
                return Err(CellError::denied(
                    Reason::NotAStandby,
                    format!("conversation {conversation} is owned here, not by {source}"),
                ));
            }
            self.stage_standby_meta(&mut staged, (tenant, conversation), write.meta.as_ref())?;
            // A rewrite never goes back to an older version of the message.
            let newer = match self.store.message(conversation, seq)? {
                Some(old) => old.msg_id != record.msg_id || old.edit_version <= record.edit_version,
                None => true,
            };
            if let Some(answer) = &write.idempotency {
                let key = IdemKey {
                    kind: IdemKind::Send,
                    tenant,
                    user: UserId(record.sender_id),
                    client_req_id: record.client_req_id.clone(),
                };
                if !key.client_req_id.is_empty() && self.store.idempotency(&key)?.is_none() {
                    staged.m.put_idempotency(&key, answer);
                }
                let first = match staged.from.get(&conversation) {
                    Some(first) => *first,
                    None => (self.store).meta_u64(&keys::meta::replica_from(conversation))?,
                };
                if first.is_none_or(|f| seq < f) {
                    staged.from.insert(conversation, Some(seq));
                }
            }
            let latest = match staged.seqs.entry(conversation) {
                Entry::Occupied(latest) => latest.into_mut(),
                Entry::Vacant(slot) => slot.insert(self.store.conv_seq(conversation)?),
            };
            latest.latest_seq = latest.latest_seq.max(seq);
            if newer {
                staged.m.put_message(conversation, seq, &record);
                let imported = staged.imported.entry(conversation);
                imported
                    .or_insert((tenant, Default::default()))
                    .1
                    .add(seq, seq);
                staged.stored += 1;
            }
        }
        self.commit_replicated(staged).await
    }

    /// Commits what [`Self::store_replicated`] staged.
    async fn commit_replicated(&self, mut staged: Staged) -> Result<u32> {
        let m = &mut staged.m;
        // A promoted standby answers searches from the moment it owns them.
        for (conversation, (tenant, seqs)) in &staged.imported {
            seqs.emit(*tenant, *conversation, m);
        }
        for (conversation, seq) in &staged.seqs {
            m.put_conv_seq(*conversation, seq);
        }
        for (conversation, first) in staged.from {
            if let Some(first) = first {
                m.put_meta_u64(&keys::meta::replica_from(conversation), first);
            }
        }
        if !m.is_empty() {
            self.store.commit(staged.m).await?;
        }
        for conversation in staged.described {
            self.conversations.invalidate(conversation);
        }
        Ok(staged.stored)
    }

    /// The seq from which this cell holds every acknowledged message of
    /// `conversation` it did not assign itself (replication mode `sync`).
    pub fn replicated_from(&self, conversation: ConversationId) -> Result<Option<u64>> {
        Ok(self
            .store
            .meta_u64(&keys::meta::replica_from(conversation))?)
    }
}
