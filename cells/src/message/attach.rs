//! The Attachments API over the file store: reserve an upload into a
//! conversation the caller may send to, resume it, complete it (size and
//! SHA-256 checked on the stored bytes; a mismatch deletes them), hand out
//! download URLs only for messages the caller may see, turn the ids a send
//! names into the refs its message carries, and sweep expired reservations
//! and recalled files.

use cellmesh_proto::ids::{ConversationId, Epoch, TenantId};
use cellmesh_proto::reason::Reason;
use cellmesh_proto::storage::v1::{IdempotencyRecord, UploadRecord};
use cellmesh_proto::v1::{
    AttachmentRef, GetDownloadUrlResponse, MessageState, PartUrl, UploadResponse, UploadState,
};
use std::sync::Arc;

use super::{Caller, MessageService};
use crate::attachments::{Attachments, StoredPart, object_key};
use crate::error::{CellError, Result};
use crate::storage::{IdemKey, IdemKind, Mutation, ScanDirection, UploadWalk};

#[derive(Debug, Clone)]
pub struct CreateUploadCommand {
    pub caller: Caller,
    pub conversation: ConversationId,
    pub name: String,
    pub content_type: String,
    pub size: u64,
    pub sha256: String,
    /// A retry with the same id gets the same upload ("": none).
    pub client_req_id: String,
}

fn store_failed(e: impl std::fmt::Display) -> CellError {
    CellError::RetryLater {
        reason: Reason::AttachmentStoreUnavailable,
        message: format!("the file store failed: {e}"),
        retry_after: std::time::Duration::from_millis(500),
    }
}

fn not_found(id: u64) -> CellError {
    CellError::invalid(
        Reason::AttachmentNotFound,
        format!("no upload {id} of yours in this conversation"),
    )
}

impl MessageService {
    fn attachments(&self) -> Result<&Arc<Attachments>> {
        self.attachments.as_ref().ok_or_else(|| {
            CellError::invalid(
                Reason::AttachmentStoreUnavailable,
                "attachments are turned off on this deployment",
            )
        })
    }

    pub async fn create_upload(&self, cmd: CreateUploadCommand) -> Result<UploadResponse> {
        let att = self.attachments()?;
        validate_upload(&cmd, &att.config)?;
        let (tenant, user) = (cmd.caller.tenant, cmd.caller.user);
        self.ownership.check(tenant, cmd.conversation, Epoch(0))?;
        self.check_member(&cmd.caller, cmd.conversation)?;
        let region = crate::config::store_region(&att.config.region, &self.config.cell_id);
        if !self.ownership.may_store_in(tenant, region) {
            return Err(CellError::denied(
                Reason::ResidencyViolation,
                format!(
                    "tenant {tenant} may not keep files in {region}, where this cell's file store lies (attachments.region)"
                ),
            ));
        }
        let idem = (!cmd.client_req_id.is_empty()).then(|| IdemKey {
            kind: IdemKind::CreateUpload,
            tenant,
            user,
            client_req_id: cmd.client_req_id.clone(),
        });
        if let Some(first) = self.first_upload(idem.as_ref(), &cmd).await? {
            return Ok(first);
        }
        self.limits.check_upload(tenant, user)?;
        let quota = att.config.tenant(tenant).quota_bytes;
        let total = att.add_bytes(&self.store, tenant, cmd.size as i64)?;
        let total = total.saturating_add(if quota > 0 { att.elsewhere(tenant) } else { 0 });
        if quota > 0 && total > quota {
            att.add_bytes(&self.store, tenant, -(cmd.size as i64))?;
            return Err(CellError::denied(
                Reason::AttachmentQuotaExceeded,
                format!("the tenant's files would take {total} bytes; its quota is {quota}"),
            ));
        }
        let now = self.now_ms();
        let id = self.next_id(now)?;
        let key = object_key(tenant, cmd.conversation, id);
        let multipart_id = if cmd.size > att.config.part_bytes {
            att.files
                .create_multipart(&key)
                .await
                .map_err(store_failed)?
        } else {
            String::new()
        };
        let record = UploadRecord {
            tenant_id: tenant.get(),
            conversation_id: cmd.conversation.get(),
            uploader: user.get(),
            state: UploadState::Reserved as i32,
            created_at_ms: now,
            expires_at_ms: now + att.config.upload_expiry_secs * 1000,
            part_size: att.config.part_bytes,
            multipart_id,
            attachment: Some(AttachmentRef {
                attachment_id: id,
                name: cmd.name,
                content_type: cmd.content_type,
                size: cmd.size,
                sha256: cmd.sha256.to_ascii_lowercase(),
                width: 0,
                height: 0,
                object_key: key,
                region: att.region.clone(),
                thumbnail_key: String::new(),
            }),
            ..Default::default()
        };
        let mut m = Mutation::new();
        m.put_upload(id, &record);
        if let Some(key) = &idem {
            let answer = IdempotencyRecord {
                conversation_id: cmd.conversation.get(),
                msg_id: id,
                expires_at_ms: record.expires_at_ms,
                ..Default::default()
            };
            m.put_idempotency(key, &answer);
        }
        self.store.commit(m).await?;
        crate::metrics::metrics().uploads_reserved.inc();
        Ok(self.upload_response(att, id, &record, &[]))
    }

    /// The upload a request with `idem` reserved before, answered as
    /// `GetUpload` would (`None`: a first request). The same id for another
    /// conversation or file is refused (`CLIENT_REQ_ID_REUSED`).
    async fn first_upload(
        &self,
        idem: Option<&IdemKey>,
        cmd: &CreateUploadCommand,
    ) -> Result<Option<UploadResponse>> {
        let Some(answer) = idem
            .map(|k| self.store.idempotency(k))
            .transpose()?
            .flatten()
        else {
            return Ok(None);
        };
        let same = self
            .store
            .upload(cmd.caller.tenant, answer.msg_id)?
            .and_then(|r| r.attachment.map(|a| (r.conversation_id, a)))
            .is_some_and(|(conversation, a)| {
                conversation == cmd.conversation.get()
                    && a.size == cmd.size
                    && a.sha256.eq_ignore_ascii_case(&cmd.sha256)
            });
        if !same {
            return Err(CellError::invalid(
                Reason::ClientReqIdReused,
                "client_req_id was used for another upload",
            ));
        }
        let first = self
            .get_upload(cmd.caller, cmd.conversation, answer.msg_id)
            .await?;
        Ok(Some(first))
    }

    /// The caller's upload `id` into `conversation` (another user's, another
    /// conversation's or another tenant's answer as missing).
    fn own_upload(
        &self,
        caller: &Caller,
        conversation: ConversationId,
        id: u64,
    ) -> Result<UploadRecord> {
        self.check_member(caller, conversation)?;
        match self.store.upload(caller.tenant, id)? {
            Some(r)
                if r.conversation_id == conversation.get()
                    && r.uploader == caller.user.get()
                    && r.delete_after_ms == 0 =>
            {
                Ok(r)
            }
            _ => Err(not_found(id)),
        }
    }

    /// Whether `conversation` was taken over from a failed cell whose
    /// history has not been backfilled yet.
    fn awaiting_backfill(&self, tenant: TenantId, conversation: ConversationId) -> Result<bool> {
        let fence = self.ownership.check(tenant, conversation, Epoch(0))?;
        let floor = (fence.seq_floor).max(self.store.conv_seq(conversation)?.seq_floor);
        Ok(fence.taken_over_mark.is_some() && !self.backfilled(conversation, floor)?)
    }

    fn expired(&self, record: &UploadRecord, id: u64) -> Result<()> {
        if record.state != UploadState::Complete as i32 && self.now_ms() > record.expires_at_ms {
            return Err(CellError::invalid(
                Reason::UploadExpired,
                format!("upload {id} was not completed in time; reserve it again"),
            ));
        }
        Ok(())
    }

    pub async fn get_upload(
        &self,
        caller: Caller,
        conversation: ConversationId,
        id: u64,
    ) -> Result<UploadResponse> {
        let att = self.attachments()?;
        // Only the owner, and not under a move's freeze: the record moves.
        self.ownership
            .check(caller.tenant, conversation, Epoch(0))?;
        let record = self.own_upload(&caller, conversation, id)?;
        self.expired(&record, id)?;
        let stored = if record.state == UploadState::Complete as i32 {
            Vec::new()
        } else {
            self.stored_parts(att, &record).await?
        };
        Ok(self.upload_response(att, id, &record, &stored))
    }

    async fn stored_parts(
        &self,
        att: &Attachments,
        record: &UploadRecord,
    ) -> Result<Vec<StoredPart>> {
        let a = record
            .attachment
            .as_ref()
            .expect("an upload names its file");
        if record.multipart_id.is_empty() {
            let exists = att
                .files
                .exists(&a.object_key)
                .await
                .map_err(store_failed)?;
            return Ok(exists
                .then(|| StoredPart {
                    number: 1,
                    size: a.size,
                    etag: String::new(),
                })
                .into_iter()
                .collect());
        }
        let parts = att
            .files
            .stored_parts(&a.object_key, &record.multipart_id, self.now_ms())
            .await
            .map_err(store_failed)?;
        // Only parts of the size the URL named count as stored.
        Ok(parts
            .into_iter()
            .filter(|p| p.size == part_len(a.size, record.part_size, p.number))
            .collect())
    }

    fn upload_response(
        &self,
        att: &Attachments,
        id: u64,
        record: &UploadRecord,
        stored: &[StoredPart],
    ) -> UploadResponse {
        let a = record.attachment.clone().expect("an upload names its file");
        let complete = record.state == UploadState::Complete as i32;
        let now = self.now_ms();
        let ttl = att.config.upload_url_secs;
        let parts = if complete {
            Vec::new()
        } else if record.multipart_id.is_empty() {
            if stored.is_empty() {
                vec![PartUrl {
                    part_number: 1,
                    url: att.files.put_url(&a.object_key, None, a.size, now, ttl),
                    size: a.size,
                }]
            } else {
                Vec::new()
            }
        } else {
            (1..=part_count(a.size, record.part_size))
                .filter(|n| !stored.iter().any(|p| p.number == *n))
                .map(|n| {
                    let len = part_len(a.size, record.part_size, n);
                    PartUrl {
                        part_number: n,
                        url: att.files.put_url(
                            &a.object_key,
                            Some((n, &record.multipart_id)),
                            len,
                            now,
                            ttl,
                        ),
                        size: len,
                    }
                })
                .collect()
        };
        UploadResponse {
            upload_id: id,
            state: record.state,
            part_size: record.part_size,
            stored_parts: stored.iter().map(|p| p.number).collect(),
            parts,
            url_expires_at_ms: now + ttl * 1000,
            expires_at_ms: record.expires_at_ms,
            attachment: complete.then_some(a),
        }
    }

    pub async fn complete_upload(
        &self,
        caller: Caller,
        conversation: ConversationId,
        id: u64,
    ) -> Result<AttachmentRef> {
        let att = self.attachments()?;
        // Only the owner, and not under a move's freeze: the record moves.
        self.ownership
            .check(caller.tenant, conversation, Epoch(0))?;
        let mut record = self.own_upload(&caller, conversation, id)?;
        let a = record.attachment.clone().expect("an upload names its file");
        if record.state == UploadState::Complete as i32 {
            return Ok(a);
        }
        self.expired(&record, id)?;
        let stored = self.stored_parts(att, &record).await?;
        let count = part_count(a.size, record.part_size);
        let missing: Vec<u32> = (1..=count)
            .filter(|n| !stored.iter().any(|p| p.number == *n))
            .collect();
        if !missing.is_empty() {
            return Err(CellError::invalid(
                Reason::UploadIncomplete,
                format!("parts {missing:?} of {count} are not stored yet"),
            ));
        }
        if !record.multipart_id.is_empty() {
            att.files
                .complete_multipart(&a.object_key, &record.multipart_id, &stored)
                .await
                .map_err(store_failed)?;
        }
        // An image that gets a thumbnail is kept whole from this one read.
        let keep = match thumbnail_wanted(&att.config, &a) {
            true => att.config.thumbnail_source_bytes as usize,
            false => IMAGE_HEADER_BYTES,
        };
        let back = att
            .files
            .read_back(&a.object_key, keep)
            .await
            .map_err(store_failed)?
            .ok_or_else(|| {
                CellError::invalid(Reason::UploadIncomplete, "the file is not stored yet")
            })?;
        let (size, sha256) = (back.size, back.sha256.clone());
        let refused = if size != a.size {
            Some(CellError::invalid(
                Reason::AttachmentSizeMismatch,
                format!("{size} bytes are stored; the upload declared {}", a.size),
            ))
        } else if sha256 != a.sha256 {
            Some(CellError::invalid(
                Reason::AttachmentDigestMismatch,
                format!(
                    "the stored bytes hash to {sha256}; the upload declared {}",
                    a.sha256
                ),
            ))
        } else {
            None
        };
        if let Some(refused) = refused {
            // Nothing stays half-way: the bytes go, the reservation stays
            // for a new attempt.
            att.files
                .delete(&a.object_key)
                .await
                .map_err(store_failed)?;
            if !record.multipart_id.is_empty() {
                record.multipart_id = att
                    .files
                    .create_multipart(&a.object_key)
                    .await
                    .map_err(store_failed)?;
                let mut m = Mutation::new();
                m.put_upload(id, &record);
                self.store.commit(m).await?;
            }
            return Err(refused);
        }
        self.scan(att, id, &record).await?;
        record.state = UploadState::Complete as i32;
        if let Some((width, height)) = crate::attachments::image::dimensions(&back.bytes)
            && let Some(a) = record.attachment.as_mut()
        {
            (a.width, a.height) = (width, height);
        }
        self.make_thumbnail(att, &mut record, back).await?;
        let a = record.attachment.clone().expect("an upload names its file");
        let mut m = Mutation::new();
        m.put_upload(id, &record);
        self.store.commit(m).await?;
        crate::metrics::metrics().uploads_completed.inc();
        Ok(a)
    }

    /// Stores a thumbnail of a completed PNG or JPEG image (read `back`
    /// whole) beside it and names it in the ref; a file it cannot decode,
    /// or too large to be kept, just has none.
    async fn make_thumbnail(
        &self,
        att: &Attachments,
        record: &mut UploadRecord,
        back: crate::attachments::store::ReadBack,
    ) -> Result<()> {
        let Some(a) = record.attachment.as_mut() else {
            return Ok(());
        };
        if !thumbnail_wanted(&att.config, a) || back.whole().is_none() {
            return Ok(());
        }
        let px = att.config.thumbnail_px;
        let bytes = back.bytes;
        let made =
            tokio::task::spawn_blocking(move || crate::attachments::image::thumbnail(&bytes, px))
                .await
                .ok()
                .flatten();
        if let Some(png) = made {
            let key = format!("{}.thumb.png", a.object_key);
            att.files.put_bytes(&key, png).await.map_err(store_failed)?;
            a.thumbnail_key = key;
        }
        Ok(())
    }

    /// Asks the operator's scanner about an upload whose bytes checked out:
    /// clean passes; infected deletes the file and ends the reservation;
    /// no verdict leaves it pending (`SCAN_PENDING`, complete again later).
    async fn scan(&self, att: &Attachments, id: u64, record: &UploadRecord) -> Result<()> {
        if att.config.scan_webhook.is_empty() {
            return Ok(());
        }
        let a = record
            .attachment
            .as_ref()
            .expect("an upload names its file");
        let body = serde_json::json!({
            "tenant": record.tenant_id,
            "conversation": record.conversation_id,
            "upload_id": id,
            "name": a.name,
            "content_type": a.content_type,
            "size": a.size,
            "sha256": a.sha256,
            "url": att.files.get_url(&a.object_key, self.now_ms(), 900),
        });
        let verdict = att
            .http
            .post(&att.config.scan_webhook)
            .timeout(std::time::Duration::from_millis(att.config.scan_timeout_ms))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await
            .and_then(|r| r.error_for_status());
        let verdict = match verdict {
            Ok(r) => (r.text().await.ok())
                .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok()),
            Err(e) => {
                tracing::warn!(upload = id, error = %e, "the scanner did not answer");
                None
            }
        };
        match verdict.as_ref().and_then(|v| v.get("verdict")?.as_str()) {
            Some("clean") => Ok(()),
            Some("infected") => {
                att.files
                    .delete(&a.object_key)
                    .await
                    .map_err(store_failed)?;
                let mut m = Mutation::new();
                m.delete_upload(record, id);
                self.store.commit(m).await?;
                att.forget_bytes(TenantId(record.tenant_id));
                Err(CellError::denied(
                    Reason::AttachmentInfected,
                    "the scanner found the file infected; it was deleted",
                ))
            }
            _ => Err(CellError::RetryLater {
                reason: Reason::ScanPending,
                message: "the file is waiting for the scanner's verdict".into(),
                retry_after: std::time::Duration::from_secs(5),
            }),
        }
    }

    pub async fn download_url(
        &self,
        caller: Caller,
        conversation: ConversationId,
        seq: u64,
        attachment: u64,
        thumbnail: bool,
    ) -> Result<GetDownloadUrlResponse> {
        let att = self.attachments()?;
        self.ownership.check_read(caller.tenant, conversation)?;
        self.check_member(&caller, conversation)?;
        // Exactly what a Pull shows this caller: hidden, directed elsewhere
        // or missing all answer the same.
        let page = self
            .page(
                conversation,
                caller.user,
                seq.saturating_add(1),
                ScanDirection::Backward,
                1,
                usize::MAX,
            )
            .await?;
        let message = page
            .messages
            .into_iter()
            .find(|(s, _)| *s == seq)
            .map(|(_, m)| m)
            .ok_or(CellError::NotFound {
                what: "message",
                id: seq,
            })?;
        if message.state == MessageState::Recalled as i32 {
            return Err(CellError::invalid(
                Reason::MessageRecalled,
                "the message was recalled with its files",
            ));
        }
        let a = message
            .attachments
            .into_iter()
            .find(|a| a.attachment_id == attachment)
            .ok_or_else(|| {
                CellError::invalid(
                    Reason::AttachmentNotFound,
                    format!("message {seq} carries no attachment {attachment}"),
                )
            })?;
        let now = self.now_ms();
        let ttl = att.config.download_url_secs;
        let files = self.serving_store(att, caller.tenant, &a)?;
        let key = match thumbnail {
            false => &a.object_key,
            true if !a.thumbnail_key.is_empty() => &a.thumbnail_key,
            true => {
                return Err(CellError::invalid(
                    Reason::AttachmentNotFound,
                    "this file has no thumbnail",
                ));
            }
        };
        crate::metrics::metrics().download_urls.inc();
        Ok(GetDownloadUrlResponse {
            url: files.get_url(key, now, ttl),
            expires_at_ms: now + ttl * 1000,
            attachment: Some(a),
        })
    }

    /// The refs of the completed uploads a send names, marked referenced in
    /// `m`; a missing, foreign or unfinished one refuses the send.
    pub(super) fn attachment_refs(
        &self,
        caller: &Caller,
        conversation: ConversationId,
        ids: &[u64],
        m: &mut Mutation,
    ) -> Result<Vec<AttachmentRef>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let att = self.attachments()?;
        if ids.len() > att.config.max_per_message {
            return Err(CellError::invalid(
                Reason::TooManyAttachments,
                format!("at most {} files per message", att.config.max_per_message),
            ));
        }
        let mut refs = Vec::with_capacity(ids.len());
        for &id in ids {
            let checked =
                (self.own_upload(caller, conversation, id)).and_then(|r| completed(r, id));
            let mut record = match checked {
                Err(CellError::InvalidArgument {
                    reason: Reason::AttachmentNotFound | Reason::AttachmentNotComplete,
                    ..
                }) if self.awaiting_backfill(caller.tenant, conversation)? => {
                    return Err(upload_on_failed_cell(id));
                }
                other => other?,
            };
            if refs.iter().any(|r: &AttachmentRef| r.attachment_id == id) {
                continue;
            }
            refs.push(record.attachment.clone().expect("an upload names its file"));
            if !record.referenced {
                record.referenced = true;
                m.put_upload(id, &record);
            }
        }
        Ok(refs)
    }

    /// Records `files` for deletion at `delete_after_ms` (a recall's grace
    /// period, or now for retention); the sweep deletes them.
    pub(super) fn forget_files(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
        files: Vec<AttachmentRef>,
        delete_after_ms: u64,
        m: &mut Mutation,
    ) {
        let Some(att) = &self.attachments else {
            return;
        };
        for a in files {
            m.put_upload(
                a.attachment_id,
                &UploadRecord {
                    tenant_id: tenant.get(),
                    conversation_id: conversation.get(),
                    delete_after_ms,
                    attachment: Some(a),
                    ..Default::default()
                },
            );
        }
        att.forget_bytes(tenant);
    }

    /// When a recall made now deletes the message's files.
    pub(super) fn recall_deletes_at(&self, now: u64) -> u64 {
        let grace = self
            .attachments
            .as_ref()
            .map(|a| a.config.recall_grace_secs);
        now + grace.unwrap_or(0) * 1000
    }

    /// Bytes of files kept here per tenant: every tenant with a quota, and
    /// every tenant with a record once the first sweep has counted them.
    pub fn file_bytes(&self) -> Result<Vec<(u64, u64)>> {
        let Some(att) = &self.attachments else {
            return Ok(Vec::new());
        };
        for tenant in att.config.quota_tenants() {
            att.add_bytes(&self.store, tenant, 0)?;
        }
        Ok(att.tenant_bytes())
    }

    /// Asks the other cells for their bytes of the tenants with a quota
    /// (see [`crate::attachments::quota`]); how many answered.
    pub async fn sync_quotas(&self) -> usize {
        let Some(att) = &self.attachments else {
            return 0;
        };
        let secret =
            cellmesh_proto::secret::ClusterSecret::new(&self.config.routing.cluster_secret);
        att.sync_quotas(self.ownership.other_cells(), &self.peers(), &secret)
            .await
    }

    /// Deletes expired reservations (and their bytes), recalled files past
    /// their grace and the source copies of files copied in; how many. The
    /// tenants it sees are counted (their bytes metric set) if they were not.
    pub async fn sweep_uploads(&self) -> Result<usize> {
        let Some(att) = &self.attachments else {
            return Ok(0);
        };
        let now = self.now_ms();
        // Temporary files a crash left (an hour is far beyond any write).
        let hour = std::time::Duration::from_secs(3_600);
        let mut swept = att.files.sweep_partials(hour).await.map_err(store_failed)?;
        let mut walk = UploadWalk::default();
        let mut tenants = std::collections::BTreeSet::new();
        loop {
            let page = walk.next(&self.store)?;
            if page.is_empty() {
                for tenant in tenants {
                    att.add_bytes(&self.store, tenant, 0)?;
                }
                return Ok(swept);
            }
            let (mut forget, mut forgotten) = (Mutation::new(), std::collections::BTreeSet::new());
            for (id, r) in page {
                tenants.insert(TenantId(r.tenant_id));
                match self.record_here(&r, now) {
                    Here::Sweep => swept += self.sweep_record(att, now, id, r).await?,
                    Here::Wait => {}
                    Here::Forget => {
                        forget.delete_upload(&r, id);
                        forgotten.insert(r.tenant_id);
                    }
                }
            }
            if !forget.is_empty() {
                self.store.commit(forget).await?;
                forgotten
                    .into_iter()
                    .for_each(|t| att.forget_bytes(TenantId(t)));
            }
        }
    }

    /// Deletes the file of record `id` and the record if it is an expired
    /// reservation, an orphan or recalled past its grace (first the source
    /// region's copy of a file copied in, once past its grace); how many.
    async fn sweep_record(
        &self,
        att: &Attachments,
        now: u64,
        id: u64,
        r: UploadRecord,
    ) -> Result<usize> {
        let mut swept = 0;
        if !r.delete_source_region.is_empty() && now >= r.delete_source_after_ms {
            swept += self.delete_source(att, id, r.clone()).await?;
        }
        let recalled = r.delete_after_ms > 0 && now >= r.delete_after_ms;
        if !(unsent_and_expired(&r, now) || recalled) {
            return Ok(swept);
        }
        let Some(a) = &r.attachment else {
            return Ok(swept);
        };
        if !r.multipart_id.is_empty() && r.state != UploadState::Complete as i32 {
            att.files
                .abort_multipart(&a.object_key, &r.multipart_id)
                .await
                .map_err(store_failed)?;
        }
        att.files.delete_file(a).await.map_err(store_failed)?;
        let mut m = Mutation::new();
        m.delete_upload(&r, id);
        self.store.commit(m).await?;
        att.forget_bytes(TenantId(r.tenant_id));
        crate::metrics::metrics().uploads_swept.inc();
        Ok(swept + 1)
    }

    /// What the sweep may do about record `r` here now. Records of
    /// deletions and copies always follow their own course. A live record
    /// of a conversation another cell owns now is only forgotten: that cell
    /// holds the files' records (its messages name them, or a move carried
    /// them) and decides about the files; an open one is kept until it
    /// expires, for a failover's backfill to carry.
    fn record_here(&self, r: &UploadRecord, now: u64) -> Here {
        let (tenant, conversation) = (r.tenant_id, r.conversation_id);
        let special = r.delete_after_ms > 0
            || !r.copy_from_region.is_empty()
            || !r.delete_source_region.is_empty();
        if special
            || self
                .ownership
                .settled(TenantId(tenant), ConversationId(conversation))
        {
            Here::Sweep
        } else if self
            .ownership
            .owns(TenantId(tenant), ConversationId(conversation))
            || (crate::storage::uploads::is_open(r) && !unsent_and_expired(r, now))
        {
            Here::Wait
        } else {
            Here::Forget
        }
    }
}

/// A reservation past its expiry, or a completed file no message took in
/// that time.
fn unsent_and_expired(r: &UploadRecord, now: u64) -> bool {
    crate::storage::uploads::is_open(r) && now > r.expires_at_ms
}

/// What the sweep may do about a record here.
enum Here {
    /// Follow its course: delete what is due.
    Sweep,
    /// Leave it for now (its conversation is moving, or an open upload of
    /// one owned elsewhere has not expired).
    Wait,
    /// Another cell owns its conversation: only the record goes.
    Forget,
}

/// `record` of upload `id`, if it was completed.
fn completed(record: UploadRecord, id: u64) -> Result<UploadRecord> {
    if record.state != UploadState::Complete as i32 {
        return Err(CellError::invalid(
            Reason::AttachmentNotComplete,
            format!("upload {id} is not completed"),
        ));
    }
    Ok(record)
}

/// A send naming an upload this cell does not hold, or holds unfinished
/// (a reservation from before a move, completed elsewhere since), in a
/// conversation taken over from a failed cell whose history is not back:
/// the upload (and perhaps this very send, answered there) may be on that
/// cell, so the outcome stays open until the backfill instead of a refusal
/// the backfilled message would contradict.
fn upload_on_failed_cell(id: u64) -> CellError {
    CellError::RetryLater {
        reason: Reason::AwaitingBackfill,
        message: format!(
            "upload {id} may be on the cell this conversation failed over from; \
             retry once its history is back"
        ),
        retry_after: std::time::Duration::from_secs(1),
    }
}

/// Bytes of a file kept to read an image's size from its header.
const IMAGE_HEADER_BYTES: usize = 64 * 1024;

/// Whether a file gets a thumbnail: a PNG or JPEG within the size limit.
fn thumbnail_wanted(config: &crate::attachments::AttachmentsConfig, a: &AttachmentRef) -> bool {
    config.thumbnail_px > 0
        && a.size <= config.thumbnail_source_bytes
        && matches!(a.content_type.as_str(), "image/png" | "image/jpeg")
}

fn part_count(size: u64, part_size: u64) -> u32 {
    size.div_ceil(part_size.max(1)).max(1) as u32
}

/// The length of part `n` (1-based) of a file of `size` in `part_size` parts.
fn part_len(size: u64, part_size: u64, n: u32) -> u64 {
    if size <= part_size {
        return size;
    }
    let start = (n as u64 - 1) * part_size;
    (size - start).min(part_size)
}

fn validate_upload(
    cmd: &CreateUploadCommand,
    config: &crate::attachments::AttachmentsConfig,
) -> Result<()> {
    let bad_name = cmd.name.is_empty()
        || cmd.name.len() > 255
        || cmd.name.contains(['/', '\\'])
        || cmd.name.chars().any(char::is_control)
        || cmd.name == "."
        || cmd.name == "..";
    if bad_name {
        return Err(CellError::invalid(
            Reason::BadAttachmentName,
            "a file name is 1..=255 bytes without slashes or control characters",
        ));
    }
    let bad_type = cmd.content_type.len() > 127
        || cmd
            .content_type
            .split_once('/')
            .is_none_or(|(a, b)| a.is_empty() || b.is_empty())
        || cmd
            .content_type
            .chars()
            .any(|c| c.is_control() || c.is_whitespace());
    if bad_type {
        return Err(CellError::invalid(
            Reason::MalformedRequest,
            "content_type is a media type such as image/png",
        ));
    }
    if cmd.sha256.len() != 64 || !cmd.sha256.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(CellError::invalid(
            Reason::BadDigest,
            "sha256 is the file's SHA-256 in 64 hex digits",
        ));
    }
    if cmd.size == 0 || cmd.size > config.max_file_bytes {
        return Err(CellError::invalid(
            Reason::AttachmentTooLarge,
            format!(
                "a file is 1..={} bytes; this one is {}",
                config.max_file_bytes, cmd.size
            ),
        ));
    }
    if !config.allows(cmd.caller.tenant, &cmd.content_type) {
        return Err(CellError::denied(
            Reason::ContentTypeNotAllowed,
            format!("files of type {} are not allowed here", cmd.content_type),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_file_exactly() {
        assert_eq!(part_count(10, 4), 3);
        assert_eq!(
            (part_len(10, 4, 1), part_len(10, 4, 2), part_len(10, 4, 3)),
            (4, 4, 2)
        );
        assert_eq!(part_count(4, 4), 1);
        assert_eq!(part_len(4, 4, 1), 4);
        assert_eq!(part_count(3, 8), 1);
        assert_eq!(part_len(3, 8, 1), 3);
        let total: u64 = (1..=part_count(1_000_003, 65_536))
            .map(|n| part_len(1_000_003, 65_536, n))
            .sum();
        assert_eq!(total, 1_000_003);
    }
}
