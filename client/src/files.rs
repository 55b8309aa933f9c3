//! Files through the Attachments API, as a client does it: hash the file,
//! reserve an upload, PUT each part still missing to its signed URL,
//! complete; and download a message's files from their signed URLs,
//! checking each against its SHA-256 before it takes its name. An upload
//! whose id is kept in a state file resumes from the parts already stored.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use cellmesh_proto::v1::attachments_client::AttachmentsClient;
use cellmesh_proto::v1::{
    AttachmentRef, Caller, CompleteUploadRequest, CreateUploadRequest, GetDownloadUrlRequest,
    GetUploadRequest, Message, UploadResponse, UploadState,
};
use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use crate::connect::{Authed, call_error};

pub struct Files {
    pub client: AttachmentsClient<Authed>,
    pub caller: Option<Caller>,
    http: reqwest::Client,
}

/// Bytes moved so far and in all.
pub type Progress<'a> = &'a mut (dyn FnMut(u64, u64) + Send);

impl Files {
    pub fn new(client: AttachmentsClient<Authed>, caller: Option<Caller>) -> Self {
        Self {
            client,
            caller,
            http: reqwest::Client::new(),
        }
    }

    /// Fetches and stores the files' URLs with `http` (a client that
    /// trusts a private CA, say) instead of one trusting the system's roots.
    pub fn with_http(mut self, http: reqwest::Client) -> Self {
        self.http = http;
        self
    }

    /// Reserves an upload; a call whose answer was lost (the connection
    /// broke, the deadline passed) is made again with the same request id,
    /// so it gets the same upload back.
    async fn reserve(&mut self, request: CreateUploadRequest) -> anyhow::Result<UploadResponse> {
        let mut attempt = 0;
        loop {
            match self.client.create_upload(request.clone()).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(status)
                    if attempt < 2
                        && matches!(
                            status.code(),
                            tonic::Code::Unavailable
                                | tonic::Code::DeadlineExceeded
                                | tonic::Code::Unknown
                        ) =>
                {
                    attempt += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(200 * attempt)).await;
                }
                Err(status) => return Err(call_error(status)),
            }
        }
    }

    /// Uploads `path` into `conversation`; its ref once complete. With
    /// `state`, the upload id is kept there until completion, and a later
    /// call with the same file resumes it.
    pub async fn upload(
        &mut self,
        conversation: u64,
        path: &Path,
        content_type: &str,
        state: Option<&Path>,
        progress: Progress<'_>,
    ) -> anyhow::Result<AttachmentRef> {
        let (size, sha256) = sha256_file(path).await?;
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .context("the file has no name")?
            .to_string();
        let resumed = match state {
            Some(state) => self.resume(conversation, state, size, &sha256).await?,
            None => None,
        };
        let upload = match resumed {
            Some(upload) => upload,
            None => {
                let upload = self
                    .reserve(CreateUploadRequest {
                        caller: self.caller.clone(),
                        conversation_id: conversation,
                        name,
                        content_type: content_type.to_string(),
                        size,
                        sha256: sha256.clone(),
                        client_req_id: format!("upload-{sha256}-{:016x}", rand::random::<u64>()),
                    })
                    .await?;
                if let Some(state) = state {
                    let line = format!("{} {size} {sha256}\n", upload.upload_id);
                    tokio::fs::write(state, line).await?;
                }
                upload
            }
        };
        let attachment = self
            .put_parts(conversation, path, &upload, size, progress)
            .await?;
        if let Some(state) = state {
            let _ = tokio::fs::remove_file(state).await;
        }
        Ok(attachment)
    }

    /// The upload a state file names, if it is for this file and still
    /// open.
    async fn resume(
        &mut self,
        conversation: u64,
        state: &Path,
        size: u64,
        sha256: &str,
    ) -> anyhow::Result<Option<UploadResponse>> {
        let Ok(text) = tokio::fs::read_to_string(state).await else {
            return Ok(None);
        };
        let mut words = text.split_whitespace();
        let (Some(id), Some(s), Some(digest)) = (words.next(), words.next(), words.next()) else {
            return Ok(None);
        };
        if s != size.to_string() || digest != sha256 {
            return Ok(None);
        }
        let Ok(id) = id.parse::<u64>() else {
            return Ok(None);
        };
        match self
            .client
            .get_upload(GetUploadRequest {
                caller: self.caller.clone(),
                conversation_id: conversation,
                upload_id: id,
            })
            .await
        {
            Ok(r) => Ok(Some(r.into_inner())),
            // Expired or swept: start again.
            Err(_) => Ok(None),
        }
    }

    async fn put_parts(
        &mut self,
        conversation: u64,
        path: &Path,
        upload: &UploadResponse,
        size: u64,
        progress: Progress<'_>,
    ) -> anyhow::Result<AttachmentRef> {
        if upload.state == UploadState::Complete as i32
            && let Some(a) = &upload.attachment
        {
            progress(size, size);
            return Ok(a.clone());
        }
        let mut done: u64 = size - upload.parts.iter().map(|p| p.size).sum::<u64>();
        progress(done, size);
        let mut file = tokio::fs::File::open(path).await?;
        for part in &upload.parts {
            let start = (u64::from(part.part_number) - 1) * upload.part_size;
            file.seek(std::io::SeekFrom::Start(start)).await?;
            let mut bytes = vec![0u8; part.size as usize];
            file.read_exact(&mut bytes).await?;
            let response = self
                .http
                .put(&part.url)
                .header(reqwest::header::CONTENT_LENGTH, part.size)
                .body(bytes)
                .send()
                .await
                .with_context(|| format!("uploading part {}", part.part_number))?;
            if !response.status().is_success() {
                let status = response.status();
                bail!(
                    "part {} was refused: {status} {}",
                    part.part_number,
                    response.text().await.unwrap_or_default()
                );
            }
            done += part.size;
            progress(done, size);
        }
        let complete = self
            .client
            .complete_upload(CompleteUploadRequest {
                caller: self.caller.clone(),
                conversation_id: conversation,
                upload_id: upload.upload_id,
            })
            .await
            .map_err(call_error)?
            .into_inner();
        complete.attachment.context("no attachment in the answer")
    }

    /// Writes every file `message` carries under `dir` by its name, each
    /// checked against its SHA-256 first; their paths.
    pub async fn download(
        &mut self,
        message: &Message,
        dir: &Path,
        progress: Progress<'_>,
    ) -> anyhow::Result<Vec<PathBuf>> {
        let total: u64 = message.attachments.iter().map(|a| a.size).sum();
        let mut done = 0;
        let mut written = Vec::new();
        tokio::fs::create_dir_all(dir).await?;
        for a in &message.attachments {
            let url = self
                .client
                .get_download_url(GetDownloadUrlRequest {
                    caller: self.caller.clone(),
                    conversation_id: message.conversation_id,
                    seq: message.seq,
                    attachment_id: a.attachment_id,
                    thumbnail: false,
                })
                .await
                .map_err(call_error)?
                .into_inner();
            let name = Path::new(&a.name)
                .file_name()
                .context("the attachment has no usable name")?;
            let target = dir.join(name);
            let tmp = dir.join(format!(".{}.part", a.attachment_id));
            let response = self.http.get(&url.url).send().await?;
            if !response.status().is_success() {
                bail!("{} was refused: {}", a.name, response.status());
            }
            let mut out = tokio::fs::File::create(&tmp).await?;
            let mut hasher = Sha256::new();
            let mut stream = response.bytes_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                hasher.update(&chunk);
                out.write_all(&chunk).await?;
                done += chunk.len() as u64;
                progress(done, total);
            }
            out.sync_all().await?;
            let digest = hex(&hasher.finalize());
            if digest != a.sha256 {
                let _ = tokio::fs::remove_file(&tmp).await;
                bail!("{}: SHA-256 {digest} does not match {}", a.name, a.sha256);
            }
            tokio::fs::rename(&tmp, &target).await?;
            written.push(target);
        }
        Ok(written)
    }
}

/// A file's size and SHA-256 (hex).
pub async fn sha256_file(path: &Path) -> anyhow::Result<(u64, String)> {
    let mut file = tokio::fs::File::open(path)
        .await
        .with_context(|| format!("cannot open {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1024 * 1024];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, hex(&hasher.finalize())))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A content type by the file's extension.
pub fn content_type_of(path: &Path) -> &'static str {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "pdf" => "application/pdf",
        "txt" | "log" => "text/plain",
        "json" => "application/json",
        "zip" => "application/zip",
        "mp4" => "video/mp4",
        _ => "application/octet-stream",
    }
}
