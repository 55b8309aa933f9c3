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
use std::collections::HashMap;
use std::time::Duration;

use cellmesh_proto::v1::ReplicatedWrite;

use super::MessageService;
use crate::error::{CellError, Result};
use crate::storage::{IdemKey, IdemKind, Mutation, keys};

impl MessageService {
    /// Stores `writes` from the owner `source`; returns how many messages
    /// it stored. Refuses (`NOT_A_STANDBY`) a conversation this cell owns.
    /// Checks a replicated write's conversation against what this standby
    /// holds, staging in `m` the meta sent with it when the conversation is
    /// new here (and noting it in `described`).
    fn stage_standby_meta(
        &self,
        m: &mut Mutation,
        (tenant, conversation): (u64, u64),
        meta: Option<&cellmesh_proto::v1::ConversationMeta>,
        described: &mut std::collections::HashSet<u64>,
    ) -> Result<()> {
        match self.store.conversation(ConversationId(conversation))? {
            Some(stored) if stored.tenant_id != tenant => {
                return Err(CellError::denied(
                    Reason::WrongTenant,
                    "conversation belongs to another tenant",
                ));
            }
            Some(_) => {}
            // A message is stored here only with its conversation: a
            // failover must find the conversation, not just its history.
            None if !described.contains(&conversation) => {
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
                if record.tenant_id != tenant {
                    return Err(CellError::denied(
                        Reason::WrongTenant,
                        "the replicated record names another tenant",
                    ));
                }
                let members = meta.map(|x| x.members.as_slice()).unwrap_or_default();
                self.store.stage_meta(
                    m,
                    ConversationId(conversation),
                    record,
                    &UserId::many(members),
                )?;
                described.insert(conversation);
            }
            None => {}
        }
        Ok(())
    }

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
        let mut m = Mutation::new();
        // Per conversation: (latest seq, floor) and the first replicated seq.
        let mut seqs = HashMap::new();
        let mut from: HashMap<u64, Option<u64>> = HashMap::new();
        let mut stored = 0;
        // Conversations whose meta this batch stores.
        let mut described = std::collections::HashSet::new();
        // Per conversation: its tenant and the seqs stored, for the index.
        let mut imported: HashMap<u64, (u64, super::migrate::Imported)> = HashMap::new();
        for write in writes {
            let (tenant, conversation) = (write.tenant_id, write.conversation_id);
            let Some(message) = write.message else {
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
            if tenant == 0 || conversation == 0 || message.seq == 0 {
                return Err(CellError::invalid(
                    Reason::BadReplicatedWrite,
                    "tenant, conversation and seq are required",
                ));
            }
            if self
                .ownership
                .check_read(TenantId(tenant), ConversationId(conversation))
                .is_ok()
            {
                return Err(CellError::denied(
                    Reason::NotAStandby,
                    format!("conversation {conversation} is owned here, not by {source}"),
                ));
            }
            self.stage_standby_meta(
                &mut m,
                (tenant, conversation),
                write.meta.as_ref(),
                &mut described,
            )?;
            // A rewrite never goes back to an older version of the message.
            let newer = match self
                .store
                .message(ConversationId(conversation), message.seq)?
            {
                Some(old) => old.msg_id != record.msg_id || old.edit_version <= record.edit_version,
                None => true,
            };
            if let Some(answer) = &write.idempotency {
                let key = IdemKey {
                    kind: IdemKind::Send,
                    tenant,
                    user: record.sender_id,
                    client_req_id: record.client_req_id.clone(),
                };
                if !key.client_req_id.is_empty() && self.store.idempotency(&key)?.is_none() {
                    m.put_idempotency(&key, answer);
                }
                let first = match from.get(&conversation) {
                    Some(first) => *first,
                    None => self
                        .store
                        .meta_u64(&keys::meta::replica_from(ConversationId(conversation)))?,
                };
                if first.is_none_or(|f| message.seq < f) {
                    from.insert(conversation, Some(message.seq));
                }
            }
            let seq = match seqs.entry(conversation) {
                std::collections::hash_map::Entry::Occupied(seq) => seq.into_mut(),
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(self.store.conv_seq(ConversationId(conversation))?)
                }
            };
            seq.latest_seq = seq.latest_seq.max(message.seq);
            if newer {
                m.put_message(ConversationId(conversation), message.seq, &record);
                (imported
                    .entry(conversation)
                    .or_insert((tenant, Default::default()))
                    .1)
                    .add(message.seq, message.seq);
                stored += 1;
            }
        }
        // A promoted standby answers searches from the moment it owns them.
        for (conversation, (tenant, seqs)) in &imported {
            seqs.emit(TenantId(*tenant), ConversationId(*conversation), &mut m);
        }
        for (conversation, seq) in &seqs {
            m.put_conv_seq(ConversationId(*conversation), seq);
        }
        for (conversation, first) in from {
            if let Some(first) = first {
                m.put_meta_u64(
                    &keys::meta::replica_from(ConversationId(conversation)),
                    first,
                );
            }
        }
        if !m.is_empty() {
            self.store.commit(m).await?;
        }
        for conversation in described {
            self.conversations.invalidate(ConversationId(conversation));
        }
        Ok(stored)
    }

    /// The seq from which this cell holds every acknowledged message of
    /// `conversation` it did not assign itself (replication mode `sync`).
    pub fn replicated_from(&self, conversation: ConversationId) -> Result<Option<u64>> {
        Ok(self
            .store
            .meta_u64(&keys::meta::replica_from(conversation))?)
    }
}
