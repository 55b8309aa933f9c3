//! A conversation restored from an export beside the live one: a new
//! conversation id of the restoring tenant (the exported one, or another),
//! placed as a creation is, holding the exported record, members, seq
//! marks and messages at their original seqs. The live conversation is not
//! read or touched. Restored into its own tenant, the copy is announced to
//! its members as a new conversation (their lists show it); into another
//! tenant it is not announced — the members are the source tenant's users,
//! kept as the record of who took part — and is read with that tenant's
//! credentials. Messages are committed in batches before the record, so a
//! restore that stops half way leaves no conversation anyone can see.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::storage::v1::{
    ConversationRecord, ConversationSeq, MemberRecord, MessageRecord, OutboxEvent, OutboxKind,
};

use super::MessageService;
use super::migrate::Imported;
use crate::error::Result;
use crate::ownership::Creation;
use crate::storage::Mutation;

/// Messages per commit of a restore.
const BATCH: usize = 1000;

/// What an export holds of one conversation.
#[derive(Debug, Clone, Default)]
pub struct RestoredCopy {
    pub record: ConversationRecord,
    pub members: Vec<u64>,
    pub seq: ConversationSeq,
    /// (seq, message), ascending.
    pub messages: Vec<(u64, MessageRecord)>,
}

impl MessageService {
    /// Stores `copy` as a new conversation of `tenant`; `announce` tells
    /// its members. Returns the new id.
    pub async fn restore_copy(
        &self,
        tenant: TenantId,
        mut copy: RestoredCopy,
        announce: bool,
    ) -> Result<ConversationId> {
        let _creating = self.creating.read().await;
        let creation = self.ownership.check_create(tenant)?;
        let now = self.now_ms();
        let id = ConversationId(self.next_id(now)?);
        if creation == Creation::Place {
            self.ownership.place(tenant, id).await?;
        }
        let mut imported = Imported::default();
        let mut latest = 0;
        let messages = std::mem::take(&mut copy.messages);
        for batch in messages.chunks(BATCH) {
            let mut m = Mutation::new();
            for (seq, message) in batch {
                m.put_message(id, *seq, message);
                imported.add(*seq, *seq);
                latest = latest.max(*seq);
            }
            self.store.commit(m).await?;
        }
        copy.record.tenant_id = tenant.get();
        copy.record.member_count = copy.members.len() as u32;
        copy.seq.latest_seq = copy.seq.latest_seq.max(latest);
        let mut m = Mutation::new();
        m.put_conversation(id, &copy.record);
        m.put_conv_seq(id, &copy.seq);
        for user in &copy.members {
            m.put_member(id, UserId(*user), &MemberRecord { joined_at_ms: now });
        }
        let floor = self.ownership.floor(tenant, id);
        if floor > 0 {
            super::migrate::put_backfilled(&mut m, id, floor, floor);
        }
        m.emit(&OutboxEvent {
            kind: if announce {
                OutboxKind::ConversationCreated
            } else {
                OutboxKind::MetaSync
            } as i32,
            tenant_id: tenant.get(),
            conversation_id: id.get(),
            user_id: copy.record.created_by,
            server_ts_ms: now,
            items: if announce {
                copy.members.clone()
            } else {
                Vec::new()
            },
            ..Default::default()
        });
        imported.emit(tenant, id, &mut m);
        self.store.commit(m).await?;
        self.conversations.invalidate(id);
        self.marks.note(tenant, id, copy.seq.latest_seq);
        tracing::info!(
            conversation = id.get(),
            messages = messages.len(),
            announce,
            "conversation restored from an export"
        );
        Ok(id)
    }
}
