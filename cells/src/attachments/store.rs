//! The region's file store behind one interface: signed URLs for clients
//! (one PUT, numbered parts, ranged GET), and what the cell itself does
//! (start, inspect, finish and abort multipart uploads, read an object
//! back to check its digest, delete). Two backends: a local directory the
//! cell serves itself ([`super::http`], HMAC-signed URLs), and an S3
//! bucket the clients talk to directly (SigV4-presigned URLs).

use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use object_store::ObjectStore;
use object_store::aws::AmazonS3;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path as ObjectPath;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use super::sigv4::{Credentials, Presigner, hex};
use super::urls::UrlSigner;
use crate::cold::S3Config;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("file store: {0}")]
    Io(String),
}

impl From<std::io::Error> for StoreError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e.to_string())
    }
}

impl From<object_store::Error> for StoreError {
    fn from(e: object_store::Error) -> Self {
        Self::Io(e.to_string())
    }
}

type Result<T> = std::result::Result<T, StoreError>;

/// A part a client has stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPart {
    pub number: u32,
    pub size: u64,
    pub etag: String,
}

/// A temporary file beside `path`, named so that a crash's leftover is
/// recognised ([`FileStore::sweep_partials`]).
pub fn partial_beside(path: &std::path::Path, kind: &str) -> PathBuf {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    path.with_file_name(format!(
        "{name}.{kind}-{:08x}{PARTIAL}",
        rand::random::<u32>()
    ))
}

const PARTIAL: &str = ".partial";

/// What reading an object back found.
#[derive(Default)]
pub struct ReadBack {
    pub size: u64,
    /// Lower-case hex, set once the whole object was read.
    pub sha256: String,
    /// The object's first bytes, as many as the reader kept (an image's
    /// header; a small image whole).
    pub bytes: Vec<u8>,
    keep: usize,
    hasher: Sha256,
}

impl ReadBack {
    fn take(&mut self, chunk: &[u8]) {
        self.hasher.update(chunk);
        self.size += chunk.len() as u64;
        let room = self.keep.saturating_sub(self.bytes.len()).min(chunk.len());
        self.bytes.extend_from_slice(&chunk[..room]);
    }

    /// The whole object, if it was kept.
    pub fn whole(&self) -> Option<&[u8]> {
        (self.bytes.len() as u64 == self.size).then_some(&self.bytes[..])
    }
}

pub enum FileStore {
    Local(LocalFiles),
    S3(S3Files),
}

/// The local directory: objects under `objects/`, parts of unfinished
/// uploads under `parts/<key>/<n>`.
#[derive(Clone)]
pub struct LocalFiles {
    /// The region whose store this is: the first segment of its URLs'
    /// paths (one listener serves every region's directory it can reach).
    pub region: String,
    pub dir: PathBuf,
    pub signer: UrlSigner,
    /// Where clients reach the cell's file listener (shared by its stores).
    pub base_url: Arc<std::sync::OnceLock<String>>,
}

pub struct S3Files {
    store: Arc<AmazonS3>,
    presigner: Presigner,
    prefix: String,
    http: reqwest::Client,
}

impl LocalFiles {
    pub fn object(&self, key: &str) -> PathBuf {
        self.dir.join("objects").join(key)
    }

    pub fn part_dir(&self, key: &str) -> PathBuf {
        self.dir.join("parts").join(key)
    }

    pub fn part(&self, key: &str, number: u32) -> PathBuf {
        self.part_dir(key).join(format!("{number:05}"))
    }

    fn base(&self) -> &str {
        self.base_url.get().map(String::as_str).unwrap_or("")
    }
}

impl S3Files {
    pub fn open(s3: &S3Config) -> std::result::Result<Self, crate::cold::BucketError> {
        let store = s3.build("attachments")?;
        // The presigner signs with the same credentials object_store uses.
        let env = |name: &str| std::env::var(name).unwrap_or_default();
        let credentials = if s3.access_key_id.is_empty() {
            Credentials {
                key_id: env("AWS_ACCESS_KEY_ID"),
                secret: env("AWS_SECRET_ACCESS_KEY"),
                token: std::env::var("AWS_SESSION_TOKEN").ok(),
            }
        } else {
            Credentials {
                key_id: s3.access_key_id.clone(),
                secret: s3.secret_access_key.clone(),
                token: None,
            }
        };
        Ok(Self {
            store: Arc::new(store),
            presigner: Presigner::new(credentials, &s3.region, &s3.endpoint, &s3.bucket),
            prefix: s3.prefix.trim_matches('/').to_string(),
            http: reqwest::Client::new(),
        })
    }

    fn key(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}/{key}", self.prefix)
        }
    }

    fn path(&self, key: &str) -> ObjectPath {
        ObjectPath::from(self.key(key))
    }

    /// ListParts (object_store has no call for it): the parts stored so
    /// far, by number.
    async fn list_parts(&self, key: &str, upload: &str, now_secs: u64) -> Result<Vec<StoredPart>> {
        let mut parts = Vec::new();
        let mut marker = 0u32;
        loop {
            let mut query = vec![("uploadId", upload.to_string())];
            if marker > 0 {
                query.push(("part-number-marker", marker.to_string()));
            }
            let url = self
                .presigner
                .sign("GET", &self.key(key), &query, now_secs, 300);
            let response = self
                .http
                .get(&url)
                .send()
                .await
                .map_err(|e| StoreError::Io(format!("ListParts: {e}")))?;
            let status = response.status();
            let body = response
                .text()
                .await
                .map_err(|e| StoreError::Io(format!("ListParts: {e}")))?;
            if !status.is_success() {
                return Err(StoreError::Io(format!("ListParts: {status}: {body}")));
            }
            let page = parse_parts(&body);
            let truncated = tag(&body, "IsTruncated").is_some_and(|t| t == "true");
            marker = page.last().map(|p| p.number).unwrap_or(marker);
            let empty = page.is_empty();
            parts.extend(page);
            if !truncated || empty {
                return Ok(parts);
            }
        }
    }
}

/// The `<Part>` entries of a ListParts answer.
fn parse_parts(xml: &str) -> Vec<StoredPart> {
    xml.split("<Part>")
        .skip(1)
        .filter_map(|part| {
            let part = part.split("</Part>").next()?;
            Some(StoredPart {
                number: tag(part, "PartNumber")?.parse().ok()?,
                size: tag(part, "Size")?.parse().ok()?,
                etag: tag(part, "ETag")?
                    .replace("&quot;", "\"")
                    .replace("&#34;", "\""),
            })
        })
        .collect()
}

fn tag<'a>(xml: &'a str, name: &str) -> Option<&'a str> {
    let start = xml.find(&format!("<{name}>"))? + name.len() + 2;
    let end = xml[start..].find(&format!("</{name}>"))? + start;
    Some(&xml[start..end])
}

impl FileStore {
    /// A URL the client PUTs `len` bytes to: the whole object (`part`
    /// none) or part `n` of multipart upload `upload`.
    pub fn put_url(
        &self,
        key: &str,
        part: Option<(u32, &str)>,
        len: u64,
        now_ms: u64,
        ttl_secs: u64,
    ) -> String {
        let expires_ms = now_ms + ttl_secs * 1000;
        match self {
            Self::Local(local) => {
                let number = part.map(|(n, _)| n).unwrap_or(0);
                let path = format!("{}/{key}", local.region);
                local
                    .signer
                    .url(local.base(), "PUT", &path, number, len, expires_ms)
            }
            Self::S3(s3) => {
                let query = match part {
                    Some((n, upload)) => {
                        vec![
                            ("partNumber", n.to_string()),
                            ("uploadId", upload.to_string()),
                        ]
                    }
                    None => Vec::new(),
                };
                s3.presigner
                    .sign("PUT", &s3.key(key), &query, now_ms / 1000, ttl_secs)
            }
        }
    }

    /// A URL the client GETs the object from (Range allowed).
    pub fn get_url(&self, key: &str, now_ms: u64, ttl_secs: u64) -> String {
        match self {
            Self::Local(local) => {
                let path = format!("{}/{key}", local.region);
                local
                    .signer
                    .url(local.base(), "GET", &path, 0, 0, now_ms + ttl_secs * 1000)
            }
            Self::S3(s3) => s3
                .presigner
                .sign("GET", &s3.key(key), &[], now_ms / 1000, ttl_secs),
        }
    }

    /// Starts a multipart upload; its id.
    pub async fn create_multipart(&self, key: &str) -> Result<String> {
        match self {
            Self::Local(local) => {
                tokio::fs::create_dir_all(local.part_dir(key)).await?;
                Ok("local".into())
            }
            Self::S3(s3) => Ok(s3.store.create_multipart(&s3.path(key)).await?),
        }
    }

    /// The parts of `upload` stored so far, by number.
    pub async fn stored_parts(
        &self,
        key: &str,
        upload: &str,
        now_ms: u64,
    ) -> Result<Vec<StoredPart>> {
        match self {
            Self::Local(local) => {
                let mut parts = Vec::new();
                let mut dir = match tokio::fs::read_dir(local.part_dir(key)).await {
                    Ok(dir) => dir,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(parts),
                    Err(e) => return Err(e.into()),
                };
                while let Some(entry) = dir.next_entry().await? {
                    let name = entry.file_name();
                    let Some(number) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
                        continue; // a part still being written
                    };
                    parts.push(StoredPart {
                        number,
                        size: entry.metadata().await?.len(),
                        etag: String::new(),
                    });
                }
                parts.sort_by_key(|p| p.number);
                Ok(parts)
            }
            Self::S3(s3) => s3.list_parts(key, upload, now_ms / 1000).await,
        }
    }

    /// Joins the parts (numbered 1..=n) into the object.
    pub async fn complete_multipart(
        &self,
        key: &str,
        upload: &str,
        parts: &[StoredPart],
    ) -> Result<()> {
        match self {
            Self::Local(local) => {
                let object = local.object(key);
                if let Some(parent) = object.parent() {
                    tokio::fs::create_dir_all(parent).await?;
                }
                let tmp = partial_beside(&object, "join");
                let mut out = tokio::fs::File::create(&tmp).await?;
                for part in parts {
                    let mut input = tokio::fs::File::open(local.part(key, part.number)).await?;
                    tokio::io::copy(&mut input, &mut out).await?;
                }
                out.sync_all().await?;
                drop(out);
                // Never over an existing object (a completed retry).
                let linked = tokio::fs::hard_link(&tmp, &object).await;
                let _ = tokio::fs::remove_file(&tmp).await;
                match linked {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(e.into()),
                }
                let _ = tokio::fs::remove_dir_all(local.part_dir(key)).await;
                Ok(())
            }
            Self::S3(s3) => {
                let ids = parts
                    .iter()
                    .map(|p| PartId {
                        content_id: p.etag.clone(),
                    })
                    .collect();
                s3.store
                    .complete_multipart(&s3.path(key), &upload.to_string(), ids)
                    .await?;
                Ok(())
            }
        }
    }

    /// Drops an unfinished multipart upload's parts.
    pub async fn abort_multipart(&self, key: &str, upload: &str) -> Result<()> {
        match self {
            Self::Local(local) => match tokio::fs::remove_dir_all(local.part_dir(key)).await {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
                _ => Ok(()),
            },
            Self::S3(s3) => {
                match s3
                    .store
                    .abort_multipart(&s3.path(key), &upload.to_string())
                    .await
                {
                    Err(object_store::Error::NotFound { .. }) | Ok(()) => Ok(()),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// The object read back: its size, SHA-256 and its first `keep`
    /// bytes; `None`: no such object.
    pub async fn read_back(&self, key: &str, keep: usize) -> Result<Option<ReadBack>> {
        let Some(mut stream) = self.open_stream(key).await? else {
            return Ok(None);
        };
        let mut back = ReadBack {
            keep,
            ..ReadBack::default()
        };
        while let Some(chunk) = stream.next().await {
            back.take(&chunk?);
        }
        back.sha256 = hex(&back.hasher.finalize_reset());
        Ok(Some(back))
    }

    /// The object's bytes as a stream; `None`: no such object.
    async fn open_stream(
        &self,
        key: &str,
    ) -> Result<Option<futures::stream::BoxStream<'static, Result<bytes::Bytes>>>> {
        match self {
            Self::Local(local) => {
                let file = match tokio::fs::File::open(local.object(key)).await {
                    Ok(file) => file,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(e.into()),
                };
                let stream = futures::stream::unfold(file, |mut file| async move {
                    let mut buf = vec![0u8; 256 * 1024];
                    match file.read(&mut buf).await {
                        Ok(0) => None,
                        Ok(n) => {
                            buf.truncate(n);
                            Some((Ok(bytes::Bytes::from(buf)), file))
                        }
                        Err(e) => Some((Err(e.into()), file)),
                    }
                });
                Ok(Some(stream.boxed()))
            }
            Self::S3(s3) => match s3.store.get(&s3.path(key)).await {
                Ok(got) => Ok(Some(
                    got.into_stream().map(|c| c.map_err(Into::into)).boxed(),
                )),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e.into()),
            },
        }
    }

    /// Copies object `key` from `source` (another region's store) into
    /// this one, at most `rate` bytes a second (0: no limit). An object
    /// already here is left as it is (the caller checks its digest).
    pub async fn copy_from(&self, source: &FileStore, key: &str, rate: u64) -> Result<()> {
        if self.exists(key).await? {
            return Ok(());
        }
        let Some(mut stream) = source.open_stream(key).await? else {
            return Err(StoreError::Io(format!("{key} is not in the source store")));
        };
        let started = std::time::Instant::now();
        let mut copied = 0u64;
        let pace = |copied: u64| async move {
            if rate > 0 {
                let due = std::time::Duration::from_secs_f64(copied as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
            }
        };
        match self {
            Self::Local(local) => {
                let object = local.object(key);
                if let Some(parent) = object.parent() {
                    tokio::fs::create_dir_all(parent).await?;
                }
                let tmp = partial_beside(&object, "copy");
                let mut out = tokio::fs::File::create(&tmp).await?;
                let written = async {
                    while let Some(chunk) = stream.next().await {
                        let chunk = chunk?;
                        tokio::io::AsyncWriteExt::write_all(&mut out, &chunk).await?;
                        copied += chunk.len() as u64;
                        pace(copied).await;
                    }
                    out.sync_all().await?;
                    Ok::<_, StoreError>(())
                }
                .await;
                let linked = match written {
                    Ok(()) => tokio::fs::hard_link(&tmp, &object).await,
                    Err(e) => {
                        let _ = tokio::fs::remove_file(&tmp).await;
                        return Err(e);
                    }
                };
                let _ = tokio::fs::remove_file(&tmp).await;
                match linked {
                    Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e.into()),
                    _ => Ok(()),
                }
            }
            Self::S3(s3) => {
                let upload = s3.store.put_multipart(&s3.path(key)).await?;
                let mut writer = object_store::WriteMultipart::new(upload);
                while let Some(chunk) = stream.next().await {
                    let chunk = match chunk {
                        Ok(chunk) => chunk,
                        Err(e) => {
                            let _ = writer.abort().await;
                            return Err(e);
                        }
                    };
                    copied += chunk.len() as u64;
                    writer.put(chunk);
                    pace(copied).await;
                }
                writer.finish().await?;
                Ok(())
            }
        }
    }

    /// Stores `bytes` as object `key` (a thumbnail the cell made).
    pub async fn put_bytes(&self, key: &str, bytes: Vec<u8>) -> Result<()> {
        match self {
            Self::Local(local) => {
                let object = local.object(key);
                if let Some(parent) = object.parent() {
                    tokio::fs::create_dir_all(parent).await?;
                }
                let tmp = partial_beside(&object, "put");
                tokio::fs::write(&tmp, &bytes).await?;
                tokio::fs::File::open(&tmp).await?.sync_all().await?;
                tokio::fs::rename(&tmp, &object).await?;
                Ok(())
            }
            Self::S3(s3) => {
                s3.store.put(&s3.path(key), bytes.into()).await?;
                Ok(())
            }
        }
    }

    /// Deletes temporary files a crash left in the local store (older than
    /// `age`); how many. S3 keeps none (multipart uploads are aborted by
    /// the sweep).
    pub async fn sweep_partials(&self, age: std::time::Duration) -> Result<usize> {
        let Self::Local(local) = self else {
            return Ok(0);
        };
        let mut dirs = vec![local.dir.join("objects"), local.dir.join("parts")];
        let mut swept = 0;
        while let Some(dir) = dirs.pop() {
            let mut entries = match tokio::fs::read_dir(&dir).await {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e.into()),
            };
            while let Some(entry) = entries.next_entry().await? {
                let meta = entry.metadata().await?;
                if meta.is_dir() {
                    dirs.push(entry.path());
                    continue;
                }
                let old = meta.modified()?.elapsed().is_ok_and(|e| e > age);
                let partial = entry
                    .file_name()
                    .to_str()
                    .is_some_and(|n| n.ends_with(PARTIAL));
                if partial && old {
                    tokio::fs::remove_file(entry.path()).await?;
                    swept += 1;
                }
            }
        }
        Ok(swept)
    }

    /// Deletes a file's object and its thumbnail.
    pub async fn delete_file(&self, a: &cellmesh_proto::v1::AttachmentRef) -> Result<()> {
        if !a.thumbnail_key.is_empty() {
            self.delete(&a.thumbnail_key).await?;
        }
        self.delete(&a.object_key).await
    }

    /// Deletes the object (absent already: fine).
    pub async fn delete(&self, key: &str) -> Result<()> {
        match self {
            Self::Local(local) => match tokio::fs::remove_file(local.object(key)).await {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
                _ => Ok(()),
            },
            Self::S3(s3) => match s3.store.delete(&s3.path(key)).await {
                Err(object_store::Error::NotFound { .. }) | Ok(()) => Ok(()),
                Err(e) => Err(e.into()),
            },
        }
    }

    /// Whether the object exists.
    pub async fn exists(&self, key: &str) -> Result<bool> {
        match self {
            Self::Local(local) => Ok(tokio::fs::try_exists(local.object(key)).await?),
            Self::S3(s3) => match s3.store.head(&s3.path(key)).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::NotFound { .. }) => Ok(false),
                Err(e) => Err(e.into()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_crash_s_partial_files_are_swept_once_old() {
        let dir = tempfile::tempdir().unwrap();
        let local = LocalFiles {
            region: "r".into(),
            dir: dir.path().to_path_buf(),
            signer: UrlSigner::new(vec![1; 32]),
            base_url: Default::default(),
        };
        let object = local.object("t1/c2/u3");
        std::fs::create_dir_all(object.parent().unwrap()).unwrap();
        std::fs::write(&object, b"kept").unwrap();
        let old = partial_beside(&object, "copy");
        let fresh = partial_beside(&object, "join");
        std::fs::write(&old, b"left by a crash").unwrap();
        std::fs::write(&fresh, b"being written").unwrap();
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3_600);
        std::fs::File::options()
            .write(true)
            .open(&old)
            .unwrap()
            .set_modified(hour_ago)
            .unwrap();
        let store = FileStore::Local(local);
        let age = std::time::Duration::from_secs(600);
        assert_eq!(store.sweep_partials(age).await.unwrap(), 1);
        assert!(object.exists() && fresh.exists() && !old.exists());
    }

    #[test]
    fn list_parts_answers_parse() {
        let xml = r#"<?xml version="1.0"?><ListPartsResult><Bucket>b</Bucket>
            <IsTruncated>false</IsTruncated>
            <Part><PartNumber>1</PartNumber><ETag>&quot;abc&quot;</ETag><Size>5242880</Size></Part>
            <Part><PartNumber>2</PartNumber><ETag>"def"</ETag><Size>10</Size></Part>
            </ListPartsResult>"#;
        let parts = parse_parts(xml);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].number, 1);
        assert_eq!(parts[0].size, 5_242_880);
        assert_eq!(parts[0].etag, "\"abc\"");
        assert_eq!(parts[1].etag, "\"def\"");
        assert_eq!(tag(xml, "IsTruncated"), Some("false"));
    }
}
