//! Files that arrive with a conversation from another region (a tenant
//! move, or a failover to a standby there) stay in their region's store
//! until they are copied into this cell's: the import records a copy job
//! per file, a copier works through them (throttled, resumable: a job is
//! done only once the copy's SHA-256 matches), and until then a download
//! is signed against the store the file is in. After a grace period the
//! source region's copy is deleted, unless the conversation went back.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::sync::Arc;

use cellmesh_proto::reason::Reason;
use cellmesh_proto::storage::v1::{MessageRecord, UploadRecord};
use cellmesh_proto::v1::{AttachmentRef, FileCopiesResponse, UploadState};

use super::MessageService;
use crate::attachments::{Attachments, FileStore};
use crate::error::{CellError, Result};
use crate::storage::Mutation;

/// Upload records an import staged.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Noted {
    /// Some are copy jobs: the copier has work.
    pub copies: bool,
    /// Bytes of the files of the records new here.
    pub bytes: u64,
}

impl MessageService {
    /// Records in `m` each file of `message` this cell holds no record of:
    /// one in another region's store as a copy job, one in this region's as
    /// referenced (so this cell, the conversation's owner now, counts its
    /// bytes). Adds to `noted` what it recorded.
    pub(super) fn note_files(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
        message: &MessageRecord,
        m: &mut Mutation,
        noted: &mut Noted,
    ) -> Result<()> {
        let Some(att) = &self.attachments else {
            return Ok(());
        };
        for a in &message.attachments {
            if self.store.upload(tenant, a.attachment_id)?.is_some() {
                continue;
            }
            let foreign = !a.region.is_empty() && a.region != att.region;
            m.put_upload(
                a.attachment_id,
                &UploadRecord {
                    tenant_id: tenant.get(),
                    conversation_id: conversation.get(),
                    // Only its uploader sends a file: they may name it again.
                    uploader: message.sender_id,
                    state: UploadState::Complete as i32,
                    attachment: Some(a.clone()),
                    referenced: true,
                    copy_from_region: if foreign {
                        a.region.clone()
                    } else {
                        String::new()
                    },
                    ..Default::default()
                },
            );
            noted.copies |= foreign;
            noted.bytes += a.size;
        }
        Ok(())
    }

    /// After `noted` records of `tenant` are committed: its bytes, and the
    /// copier if there are copy jobs.
    pub(super) fn noted_files(&self, tenant: TenantId, noted: Noted) {
        let Some(att) = &self.attachments else {
            return;
        };
        att.add_known_bytes(tenant, noted.bytes);
        if noted.copies {
            self.wake_copier();
        }
    }

    /// Has the copier look for jobs on its next pass.
    pub(super) fn wake_copier(&self) {
        if let Some(att) = &self.attachments {
            att.copies_pending
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// Deletes the source region's copy of file `id`, copied in here and
    /// past its grace (1), unless the conversation is no longer owned here
    /// (moved back: 0); either way the record forgets it.
    pub(super) async fn delete_source(
        &self,
        att: &Attachments,
        id: u64,
        mut record: UploadRecord,
    ) -> Result<usize> {
        let owned = self.ownership.owns(
            TenantId(record.tenant_id),
            ConversationId(record.conversation_id),
        );
        let source = att.store_of(&record.delete_source_region);
        let mut deleted = 0;
        if let (true, Some(source), Some(a)) = (owned, source, record.attachment.as_ref()) {
            source
                .delete_file(a)
                .await
                .map_err(|e| CellError::RetryLater {
                    reason: Reason::AttachmentStoreUnavailable,
                    message: format!("deleting the source copy of file {id}: {e}"),
                    retry_after: std::time::Duration::from_secs(1),
                })?;
            deleted = 1;
        }
        record.delete_source_region.clear();
        record.delete_source_after_ms = 0;
        let mut m = Mutation::new();
        m.put_upload(id, &record);
        self.store.commit(m).await?;
        Ok(deleted)
    }

    /// The store a download of `a` is signed against: this cell's once the
    /// file is here, else the store of the region it was uploaded to.
    pub(super) fn serving_store<'a>(
        &self,
        att: &'a Attachments,
        tenant: TenantId,
        a: &AttachmentRef,
    ) -> Result<&'a FileStore> {
        let here = a.region.is_empty()
            || a.region == att.region
            || self
                .store
                .upload(tenant, a.attachment_id)?
                .is_some_and(|r| r.copy_from_region.is_empty());
        let region = if here {
            att.region.as_str()
        } else {
            a.region.as_str()
        };
        att.store_of(region).ok_or_else(|| CellError::RetryLater {
            reason: Reason::AttachmentStoreUnavailable,
            message: format!(
                "the file is in region {region}'s store, which this cell does not reach yet"
            ),
            retry_after: std::time::Duration::from_secs(5),
        })
    }

    /// `tenant`'s files still to copy into this region and those copied
    /// (until their source copy is deleted); a tenant move polls it, asking
    /// for its copy rate each time.
    pub fn file_copies(&self, tenant: TenantId, bytes_per_sec: u64) -> Result<FileCopiesResponse> {
        let mut out = FileCopiesResponse::default();
        let Some(att) = &self.attachments else {
            return Ok(out);
        };
        att.set_copy_rate(tenant, bytes_per_sec);
        for (_, record) in self.store.uploads_of(tenant)? {
            let size = record.attachment.as_ref().map_or(0, |a| a.size);
            if !record.copy_from_region.is_empty() {
                out.files_pending += 1;
                out.bytes_pending += size;
            } else if !record.delete_source_region.is_empty() {
                out.files_copied += 1;
                out.bytes_copied += size;
            }
        }
        Ok(out)
    }

    /// Copies files recorded by [`note_files`](Self::note_files)
    /// into this cell's store; how many were copied. A job whose source
    /// this cell does not reach waits.
    pub async fn copy_foreign_files(self: &Arc<Self>) -> Result<usize> {
        let Some(att) = &self.attachments else {
            return Ok(0);
        };
        // Nothing recorded since the last pass found none: no walk.
        if !att
            .copies_pending
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            return Ok(0);
        }
        let mut walk = crate::storage::UploadWalk::default();
        let mut copied = 0usize;
        loop {
            let page = walk.next(&self.store)?;
            if page.is_empty() {
                return Ok(copied);
            }
            for (id, mut record) in page {
                if record.copy_from_region.is_empty() {
                    continue;
                }
                let Some(source) = att.store_of(&record.copy_from_region) else {
                    // Waits for a store this cell reaches: look again.
                    att.copies_pending
                        .store(true, std::sync::atomic::Ordering::Release);
                    continue;
                };
                let Some(a) = record.attachment.clone() else {
                    continue;
                };
                // Until this job is done, the next pass looks again.
                att.copies_pending
                    .store(true, std::sync::atomic::Ordering::Release);
                // A freeze is short and its switch waits on the disk: the
                // copy holds off until it is over.
                if (self.ownership).frozen(
                    TenantId(record.tenant_id),
                    ConversationId(record.conversation_id),
                ) {
                    continue;
                }
                let fail = |e: crate::attachments::store::StoreError| CellError::RetryLater {
                    reason: Reason::AttachmentStoreUnavailable,
                    message: format!("copying file {id}: {e}"),
                    retry_after: std::time::Duration::from_secs(1),
                };
                let rate = att.copy_rate(TenantId(record.tenant_id));
                att.files
                    .copy_from(source, &a.object_key, rate)
                    .await
                    .map_err(fail)?;
                let back = att.files.read_back(&a.object_key, 0).await.map_err(fail)?;
                if back.as_ref().map(|b| (b.size, b.sha256.as_str())) != Some((a.size, &a.sha256)) {
                    // A torn copy: the next pass copies it again.
                    att.files.delete(&a.object_key).await.map_err(fail)?;
                    tracing::warn!(file = id, "a copied file did not match its digest");
                    continue;
                }
                if !a.thumbnail_key.is_empty() {
                    att.files
                        .copy_from(source, &a.thumbnail_key, rate)
                        .await
                        .map_err(fail)?;
                }
                record.delete_source_region = std::mem::take(&mut record.copy_from_region);
                record.delete_source_after_ms = self.now_ms() + att.config.source_grace_secs * 1000;
                if let Some(a) = record.attachment.as_mut() {
                    a.region = att.region.clone();
                }
                let mut m = Mutation::new();
                m.put_upload(id, &record);
                self.store.commit(m).await?;
                att.forget_bytes(TenantId(record.tenant_id));
                crate::metrics::metrics().files_copied_in.inc();
                copied += 1;
            }
        }
    }
}
