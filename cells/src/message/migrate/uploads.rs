//! Open uploads travel with their conversation. Every exported chunk
//! carries the conversation's uploads that are reserved, or completed and
//! not sent yet, so that after a move (or a failover's backfill) the client
//! resumes or sends them at the new owner instead of uploading again. A
//! message stored here that names a file marks its record referenced, so
//! the sweeper never takes a file a message carries for an orphan.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::collections::HashSet;

use cellmesh_proto::storage::v1::MessageRecord;
use cellmesh_proto::v1::{CarriedUpload, UploadState};

use super::*;
use crate::message::attach_copy::Noted;
use crate::storage::uploads::is_open;

impl MessageService {
    /// The open uploads of `conversation`, for an exported chunk.
    pub(super) fn carried_uploads(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
    ) -> Result<Vec<CarriedUpload>> {
        if self.attachments.is_none() {
            return Ok(Vec::new());
        }
        Ok((self.store.open_uploads(tenant, conversation)?.into_iter())
            .map(|(upload_id, record)| CarriedUpload {
                upload_id,
                record: Some(record),
            })
            .collect())
    }

    /// Stages in `m` the uploads a chunk of `conversation` carried, except
    /// those the chunk's `messages` name (they arrive as sent files) and
    /// those this cell already holds further along. A completed file held
    /// in another region's store gets a copy job; a reservation there is
    /// left behind (its parts cannot be resumed into this region's store).
    /// Adds to `noted` what it staged.
    pub(super) fn stage_carried_uploads(
        &self,
        (tenant, conversation): (TenantId, ConversationId),
        carried: Vec<CarriedUpload>,
        messages: &[StoredMessage],
        m: &mut Mutation,
        noted: &mut Noted,
    ) -> Result<()> {
        let Some(att) = &self.attachments else {
            return Ok(());
        };
        let named: HashSet<u64> = (messages.iter())
            .filter_map(|s| s.record.as_ref())
            .flat_map(|r| r.attachments.iter().map(|a| a.attachment_id))
            .collect();
        for CarriedUpload { upload_id, record } in carried {
            let Some(mut record) = record else { continue };
            if record.tenant_id != tenant.get()
                || record.conversation_id != conversation.get()
                || !is_open(&record)
                || named.contains(&upload_id)
            {
                continue;
            }
            let complete = record.state == UploadState::Complete as i32;
            let held = self.store.upload(tenant, upload_id)?;
            if let Some(held) = &held
                && (held.conversation_id != conversation.get()
                    || !is_open(held)
                    || (held.state == UploadState::Complete as i32 && !complete))
            {
                continue;
            }
            let region = (record.attachment.as_ref()).map_or("", |a| a.region.as_str());
            if !region.is_empty() && region != att.region {
                if !complete {
                    continue;
                }
                record.copy_from_region = region.to_string();
                noted.copies = true;
            }
            if held.is_none() {
                noted.bytes += record.attachment.as_ref().map_or(0, |a| a.size);
            }
            m.put_upload(upload_id, &record);
        }
        Ok(())
    }

    /// Stages in `m` that `message` references the files it names whose
    /// records this cell holds open.
    pub(super) fn reference_files(
        &self,
        tenant: TenantId,
        message: &MessageRecord,
        m: &mut Mutation,
    ) -> Result<()> {
        if self.attachments.is_none() {
            return Ok(());
        }
        for a in &message.attachments {
            if let Some(mut record) = self.store.upload(tenant, a.attachment_id)?
                && is_open(&record)
            {
                record.referenced = true;
                m.put_upload(a.attachment_id, &record);
            }
        }
        Ok(())
    }
}
