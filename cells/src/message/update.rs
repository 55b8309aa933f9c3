//! Changes to existing state: recall and edit (by the sender, within the edit
//! window, shown to everyone), delete-for-me (an overlay for one user) and the
//! per-user read position (which never moves backwards).

use cellmesh_proto::ids::{ConversationId, Epoch};
use cellmesh_proto::reason::Reason;
use cellmesh_proto::storage::v1::{MessageRecord, OutboxEvent, OutboxKind};
use cellmesh_proto::v1::{DeleteForMeResponse, MarkReadResponse, Message, MessageState};

use super::send::validate_body;
use super::{Caller, MessageService};
use crate::convert::message_to_proto;
use crate::error::{CellError, Result};
use crate::storage::{Mutation, keys};

/// Most seqs one delete-for-me request may name.
pub const MAX_DELETE_BATCH: usize = 1_000;

#[derive(Debug, Clone)]
pub struct RecallCommand {
    pub caller: Caller,
    pub conversation: ConversationId,
    pub seq: u64,
}

#[derive(Debug, Clone)]
pub struct EditCommand {
    pub caller: Caller,
    pub conversation: ConversationId,
    pub seq: u64,
    pub body: Vec<u8>,
}

#[derive(Debug, Clone)]
pub struct DeleteForMeCommand {
    pub caller: Caller,
    pub conversation: ConversationId,
    pub seqs: Vec<u64>,
}

#[derive(Debug, Clone)]
pub struct MarkReadCommand {
    pub caller: Caller,
    pub conversation: ConversationId,
    pub read_seq: u64,
}

impl MessageService {
    pub async fn recall(&self, cmd: RecallCommand) -> Result<Message> {
        let (tenant, conversation) = (cmd.caller.tenant, cmd.conversation);
        self.rewrite_message(
            cmd.caller,
            cmd.conversation,
            cmd.seq,
            OutboxKind::Recall,
            |r, now, m| {
                if r.state == MessageState::Recalled as i32 {
                    return Ok(false);
                }
                r.state = MessageState::Recalled as i32;
                r.body.clear();
                let files = std::mem::take(&mut r.attachments);
                let at = self.recall_deletes_at(now);
                self.forget_files(tenant, conversation, files, at, m);
                r.edited_at_ms = now;
                r.edit_version += 1;
                Ok(true)
            },
        )
        .await
    }

    pub async fn edit(&self, cmd: EditCommand) -> Result<Message> {
        validate_body(&cmd.body, self.config.limits.max_body_bytes)?;
        let body = cmd.body;
        self.rewrite_message(
            cmd.caller,
            cmd.conversation,
            cmd.seq,
            OutboxKind::Edit,
            |r, now, _| {
                if r.state == MessageState::Recalled as i32 {
                    return Err(CellError::invalid(
                        Reason::MessageRecalled,
                        "a recalled message cannot be edited",
                    ));
                }
                r.state = MessageState::Edited as i32;
                r.body = body;
                r.edited_at_ms = now;
                r.edit_version += 1;
                Ok(true)
            },
        )
        .await
    }

    /// Read-modify-write of one message by its sender under the
    /// conversation's admin lock. `change` returns whether it changed anything.
    async fn rewrite_message(
        &self,
        caller: Caller,
        conversation: ConversationId,
        seq: u64,
        kind: OutboxKind,
        change: impl FnOnce(&mut MessageRecord, u64, &mut Mutation) -> Result<bool>,
    ) -> Result<Message> {
        self.check_call(&caller)?;
        let conv = self.conversation(&caller, conversation.get())?;
        self.require_member(&caller, conversation)?;
        // Ownership is checked under the lock a seal takes too, so no
        // rewrite lands after a migration sealed the conversation.
        let _admin = conv.admin.lock().await;
        let _writing = self.writing.read().await;
        self.ownership
            .check(caller.tenant, conversation, Epoch(0))?;
        // A cold message's new state is stored as a hot overlay row.
        let mut record =
            self.any_tier_message(conversation, seq)
                .await?
                .ok_or(CellError::NotFound {
                    what: "message",
                    id: seq,
                })?;
        if record.sender_id != caller.user.get() {
            return Err(CellError::denied(
                Reason::NotSender,
                "only the sender may recall or edit a message",
            ));
        }
        let now = self.now_ms();
        let window_ms = self.config.limits.edit_window_secs * 1000;
        if now.saturating_sub(record.server_ts_ms) > window_ms {
            return Err(CellError::denied(
                Reason::EditWindowPassed,
                format!(
                    "messages can be recalled or edited for {} s after sending",
                    self.config.limits.edit_window_secs
                ),
            ));
        }
        let mut m = Mutation::new();
        if change(&mut record, now, &mut m)? {
            m.put_message(conversation, seq, &record);
            let rewrites = keys::meta::rewrites(conversation);
            let count = self.store.meta_u64(&rewrites)?.unwrap_or(0);
            m.put_meta_u64(&rewrites, count + 1);
            m.emit(&OutboxEvent {
                kind: kind as i32,
                tenant_id: caller.tenant.get(),
                conversation_id: conversation.get(),
                seq,
                msg_id: record.msg_id,
                user_id: caller.user.get(),
                server_ts_ms: now,
                items: record.visible_to.clone(),
                ..Default::default()
            });
            self.store.commit(m).await?;
        }
        // Unchanged too: a retry of a rewrite whose replication failed.
        if self.replicator.is_sync(caller.tenant) {
            self.replicate_message(caller.tenant, conversation, seq, record.clone(), None)
                .await?;
        }
        Ok(message_to_proto(conversation, seq, record))
    }

    pub async fn delete_for_me(&self, cmd: DeleteForMeCommand) -> Result<DeleteForMeResponse> {
        Self::check_seq_list(&cmd.seqs, MAX_DELETE_BATCH)?;
        self.check_member_call(&cmd.caller, cmd.conversation)?;
        let latest = self.store.conv_seq(cmd.conversation)?.latest_seq;
        if let Some(bad) = cmd.seqs.iter().find(|s| **s == 0 || **s > latest) {
            return Err(CellError::invalid(
                Reason::SeqOutOfRange,
                format!("seq {bad} is outside 1..={latest}"),
            ));
        }
        let mut seqs = cmd.seqs;
        seqs.sort_unstable();
        seqs.dedup();
        let mut m = Mutation::new();
        for seq in &seqs {
            m.hide(cmd.conversation, cmd.caller.user, *seq);
        }
        m.emit(&OutboxEvent {
            kind: OutboxKind::DeleteForMe as i32,
            tenant_id: cmd.caller.tenant.get(),
            conversation_id: cmd.conversation.get(),
            user_id: cmd.caller.user.get(),
            server_ts_ms: self.now_ms(),
            items: seqs.clone(),
            ..Default::default()
        });
        self.store.commit(m).await?;
        Ok(DeleteForMeResponse {
            deleted: seqs.len() as u32,
        })
    }

    pub async fn mark_read(&self, cmd: MarkReadCommand) -> Result<MarkReadResponse> {
        self.check_member_call(&cmd.caller, cmd.conversation)?;
        let latest = self.store.conv_seq(cmd.conversation)?.latest_seq;
        let target = cmd.read_seq.min(latest);
        if target > self.store.read_seq(cmd.conversation, cmd.caller.user)? {
            let mut m = Mutation::new();
            m.raise_read_seq(cmd.conversation, cmd.caller.user, target);
            m.emit(&OutboxEvent {
                kind: OutboxKind::Read as i32,
                tenant_id: cmd.caller.tenant.get(),
                conversation_id: cmd.conversation.get(),
                seq: target,
                user_id: cmd.caller.user.get(),
                server_ts_ms: self.now_ms(),
                ..Default::default()
            });
            self.store.commit(m).await?;
        }
        let read_seq = self.store.read_seq(cmd.conversation, cmd.caller.user)?;
        Ok(MarkReadResponse {
            read_seq,
            latest_seq: latest,
            unread: latest.saturating_sub(read_seq),
        })
    }
}
