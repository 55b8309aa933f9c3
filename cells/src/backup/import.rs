//! Restoring a tenant export (see [`super::export`]) beside the live data:
//! every conversation of the export, or one, becomes a new conversation of
//! the restoring tenant (see [`crate::message::MessageService::restore_copy`]).
//! The export is read from this cell's backup store and checked against its
//! manifest's digests first; a line that does not parse, a message of a
//! conversation the export does not list, or a line of another tenant
//! refuses the whole restore before anything is written.

use std::collections::BTreeMap;

use cellmesh_proto::ids::{ConversationId, TenantId};

use super::lines::{ConversationLine, MessageLine};
use super::{BackupError, Backups, Result};
use crate::message::{MessageService, RestoredCopy};

/// One conversation a restore made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    pub from: ConversationId,
    pub to: ConversationId,
    pub messages: u64,
}

impl Backups {
    /// Restores export `id` of tenant `from` into tenant `into` (`only`:
    /// that conversation alone).
    pub async fn restore_export(
        &self,
        service: &MessageService,
        from: TenantId,
        id: &str,
        into: TenantId,
        only: Option<ConversationId>,
    ) -> Result<Vec<Restored>> {
        let copies = self.read_export(from, id, only).await?;
        if let Some(only) = only
            && copies.is_empty()
        {
            return Err(BackupError::NotFound(format!(
                "conversation {only} in export {id} of tenant {from}"
            )));
        }
        let mut out = Vec::with_capacity(copies.len());
        for (conversation, copy) in copies {
            let messages = copy.messages.len() as u64;
            let to = service.restore_copy(into, copy, into == from).await?;
            out.push(Restored {
                from: ConversationId(conversation),
                to,
                messages,
            });
        }
        Ok(out)
    }

    /// The export's conversations (of `only`, if named), checked.
    async fn read_export(
        &self,
        tenant: TenantId,
        id: &str,
        only: Option<ConversationId>,
    ) -> Result<BTreeMap<u64, RestoredCopy>> {
        let wanted = |c: u64| only.is_none_or(|o| o.get() == c);
        let mut copies = BTreeMap::new();
        let conversations: Vec<ConversationLine> =
            self.export_lines(tenant, id, "conversations.jsonl").await?;
        for line in conversations {
            if line.tenant != tenant.get() {
                return Err(BackupError::Io(format!(
                    "export {id} lists conversation {} of tenant {}",
                    line.conversation, line.tenant
                )));
            }
            if wanted(line.conversation) {
                let copy = RestoredCopy {
                    record: line.record(tenant.get()),
                    members: line.members.clone(),
                    seq: line.seq(0),
                    messages: Vec::new(),
                };
                copies.insert(line.conversation, copy);
            }
        }
        let messages: Vec<MessageLine> = self.export_lines(tenant, id, "messages.jsonl").await?;
        for line in messages {
            let record = line.record().ok_or_else(|| {
                BackupError::Io(format!(
                    "export {id}: message {} has a damaged body",
                    line.msg_id
                ))
            })?;
            match copies.get_mut(&line.conversation) {
                Some(copy) => copy.messages.push((line.seq, record)),
                None if wanted(line.conversation) => {
                    return Err(BackupError::Io(format!(
                        "export {id}: message {} of conversation {} the export does not list",
                        line.msg_id, line.conversation
                    )));
                }
                None => {}
            }
        }
        for copy in copies.values_mut() {
            copy.messages.sort_by_key(|(seq, _)| *seq);
        }
        Ok(copies)
    }
}
