//! Files in the drill's workload: a small file per sender and conversation
//! (only its uploader may send it), uploaded
//! through the edge as a client does (reserve, PUT to the signed URL,
//! complete), named by every tenth send; after the drill every stored
//! message's files are downloaded and their SHA-256 recorded for the
//! checker. Moves carry upload records; a failover without a backfill
//! does not, so a send refused with `ATTACHMENT_NOT_FOUND` has the file
//! uploaded again for the next one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use cellmesh_cell::attachments::sigv4::hex;
use cellmesh_proto::v1::attachments_client::AttachmentsClient;
use cellmesh_proto::v1::{
    AttachmentRef, CompleteUploadRequest, CreateUploadRequest, GetDownloadUrlRequest,
};
use sha2::{Digest, Sha256};
use tonic::transport::Channel;

use crate::history::{FileRead, FileSend};
use crate::target::DevTarget;

/// Every this many sends of a sender names a file.
pub const EVERY: u64 = 10;
const FILE_BYTES: usize = 4_096;
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

pub struct DrillFiles {
    tenant: u64,
    run_id: u128,
    channel: Channel,
    http: reqwest::Client,
    /// (conversation, sender) → the file their sends name now.
    current: Mutex<HashMap<(u64, u64), FileSend>>,
    /// Sends that named a file, by request id.
    sent: Mutex<HashMap<String, FileSend>>,
}

impl DrillFiles {
    pub fn new(tenant: u64, run_id: u128, channel: Channel) -> Self {
        Self {
            tenant,
            run_id,
            channel,
            http: reqwest::Client::new(),
            current: Mutex::new(HashMap::new()),
            sent: Mutex::new(HashMap::new()),
        }
    }

    /// The file the send `tag` names: the one it named before (a re-send),
    /// else `user`'s in the conversation, uploaded if there is none yet;
    /// `None` when the upload failed (the send goes without).
    pub async fn for_send(
        &self,
        dev: &DevTarget,
        (conversation, user): (u64, u64),
        tag: &str,
    ) -> Option<u64> {
        if let Some(f) = self.sent.lock().expect("files").get(tag) {
            return Some(f.attachment_id);
        }
        let key = (conversation, user);
        let current = self.current.lock().expect("files").get(&key).cloned();
        let file = match current {
            Some(file) => file,
            None => {
                let file = self.upload(dev, conversation, user).await.ok()?;
                let mut current = self.current.lock().expect("files");
                current.entry(key).or_insert(file).clone()
            }
        };
        let id = file.attachment_id;
        let named = FileSend {
            client_req_id: tag.to_string(),
            ..file
        };
        self.sent
            .lock()
            .expect("files")
            .insert(tag.to_string(), named);
        Some(id)
    }

    /// The conversation's cell does not have `attachment_id` (moved or
    /// failed over since the upload): the next send uploads afresh. The
    /// refused send named no file after all.
    pub fn not_found(&self, (conversation, user): (u64, u64), attachment_id: u64, tag: &str) {
        let mut current = self.current.lock().expect("files");
        let key = (conversation, user);
        if current.get(&key).map(|f| f.attachment_id) == Some(attachment_id) {
            current.remove(&key);
        }
        self.sent.lock().expect("files").remove(tag);
    }

    /// Whether the send `tag` named a file.
    pub fn named(&self, tag: &str) -> bool {
        self.sent.lock().expect("files").contains_key(tag)
    }

    /// Every send that named a file.
    pub fn sent(&self) -> Vec<FileSend> {
        self.sent.lock().expect("files").values().cloned().collect()
    }

    async fn upload(
        &self,
        dev: &DevTarget,
        conversation: u64,
        user: u64,
    ) -> anyhow::Result<FileSend> {
        let line = format!("drill {} conversation {conversation}\n", self.run_id);
        let bytes: Vec<u8> = line.bytes().cycle().take(FILE_BYTES).collect();
        let sha256 = hex(&Sha256::digest(&bytes));
        let mut client = AttachmentsClient::new(self.channel.clone());
        let reserve = CreateUploadRequest {
            conversation_id: conversation,
            name: "drill.txt".into(),
            content_type: "text/plain".into(),
            size: bytes.len() as u64,
            sha256: sha256.clone(),
            ..Default::default()
        };
        let mut request = dev.request_in(self.tenant, reserve, user, "tool");
        request.set_timeout(CALL_TIMEOUT);
        let upload = client.create_upload(request).await?.into_inner();
        let part = upload
            .parts
            .first()
            .ok_or_else(|| anyhow::anyhow!("no part URL"))?;
        let put = self.http.put(&part.url).body(bytes).timeout(CALL_TIMEOUT);
        put.send().await?.error_for_status()?;
        let complete = CompleteUploadRequest {
            conversation_id: conversation,
            upload_id: upload.upload_id,
            ..Default::default()
        };
        let mut request = dev.request_in(self.tenant, complete, user, "tool");
        request.set_timeout(CALL_TIMEOUT);
        let done = client.complete_upload(request).await?.into_inner();
        let file = done.attachment.ok_or_else(|| anyhow::anyhow!("no ref"))?;
        Ok(FileSend {
            conversation,
            client_req_id: String::new(),
            attachment_id: file.attachment_id,
            sha256,
        })
    }

    /// Downloads the files of the message at `seq` (tagged `tag`) as
    /// `reader` and records what came down.
    pub async fn read(
        &self,
        dev: &DevTarget,
        (conversation, seq, tag): (u64, u64, &str),
        files: &[AttachmentRef],
        reader: u64,
    ) -> Vec<FileRead> {
        let mut out = Vec::with_capacity(files.len());
        for file in files {
            let (sha256, error) = match self.download(dev, (conversation, seq), file, reader).await
            {
                Ok(bytes) => (hex(&Sha256::digest(&bytes)), String::new()),
                Err(e) => (String::new(), e.to_string()),
            };
            out.push(FileRead {
                conversation,
                tag: tag.to_string(),
                attachment_id: file.attachment_id,
                sha256,
                error,
            });
        }
        out
    }

    async fn download(
        &self,
        dev: &DevTarget,
        (conversation, seq): (u64, u64),
        file: &AttachmentRef,
        reader: u64,
    ) -> anyhow::Result<Vec<u8>> {
        let mut client = AttachmentsClient::new(self.channel.clone());
        let ask = GetDownloadUrlRequest {
            conversation_id: conversation,
            seq,
            attachment_id: file.attachment_id,
            ..Default::default()
        };
        let mut request = dev.request_in(self.tenant, ask, reader, "tool");
        request.set_timeout(CALL_TIMEOUT);
        let url = (client.get_download_url(request).await)
            .map_err(|e| anyhow::anyhow!(cellmesh_proto::status::describe(&e)))?
            .into_inner()
            .url;
        let answer = self.http.get(&url).timeout(CALL_TIMEOUT).send().await?;
        Ok(answer.error_for_status()?.bytes().await?.to_vec())
    }
}
