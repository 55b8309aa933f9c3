//! Moving a backup's files between the database directory and object
//! storage: streamed in chunks, hashed on the way (SHA-256), and held to
//! the configured rate so that a backup or a verify leaves the disk and
//! the network to the sends.

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, WriteMultipart};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::BackupError;

/// Files up to this size go up in one request; larger ones in parts of it.
const PART: usize = 8 * 1024 * 1024;
/// Read (and throttled) this much at a time.
const CHUNK: usize = 1024 * 1024;

/// Holds a transfer to `rate` bytes per second (0: no limit).
pub struct Throttle {
    rate: u64,
    started: Instant,
    bytes: u64,
}

impl Throttle {
    pub fn new(rate: u64) -> Self {
        Self {
            rate,
            started: Instant::now(),
            bytes: 0,
        }
    }

    /// Bytes moved so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    async fn take(&mut self, n: usize) {
        self.bytes += n as u64;
        if self.rate == 0 {
            return;
        }
        let due = Duration::from_secs_f64(self.bytes as f64 / self.rate as f64);
        if let Some(wait) = due.checked_sub(self.started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
}

/// Hex of a finished digest.
fn hex(hasher: Sha256) -> String {
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn io(what: &str, path: &Path, e: std::io::Error) -> BackupError {
    BackupError::Io(format!("{what} {}: {e}", path.display()))
}

/// Uploads `file` to `key`; answers its size and SHA-256.
pub async fn upload(
    store: &dyn ObjectStore,
    key: &ObjectPath,
    file: &Path,
    throttle: &mut Throttle,
) -> Result<(u64, String), BackupError> {
    let mut reader = tokio::fs::File::open(file)
        .await
        .map_err(|e| io("open", file, e))?;
    let size = reader
        .metadata()
        .await
        .map_err(|e| io("stat", file, e))?
        .len();
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    if size as usize <= PART {
        let mut all = Vec::with_capacity(size as usize);
        loop {
            let n = reader
                .read(&mut buf)
                .await
                .map_err(|e| io("read", file, e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            all.extend_from_slice(&buf[..n]);
            throttle.take(n).await;
        }
        let len = all.len() as u64;
        store.put(key, all.into()).await?;
        return Ok((len, hex(hasher)));
    }
    let mut parts = WriteMultipart::new_with_chunk_size(store.put_multipart(key).await?, PART);
    let mut len = 0u64;
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(n) => n,
            Err(e) => {
                let _ = parts.abort().await;
                return Err(io("read", file, e));
            }
        };
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        parts.wait_for_capacity(2).await?;
        parts.write(&buf[..n]);
        len += n as u64;
        throttle.take(n).await;
    }
    parts.finish().await?;
    Ok((len, hex(hasher)))
}

/// Downloads `key` into `file` (created, synced); answers its size and
/// SHA-256.
pub async fn download(
    store: &dyn ObjectStore,
    key: &ObjectPath,
    file: &Path,
    throttle: &mut Throttle,
) -> Result<(u64, String), BackupError> {
    let got = match store.get(key).await {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(BackupError::Missing(key.to_string()));
        }
        Err(e) => return Err(e.into()),
    };
    let mut out = tokio::fs::File::create(file)
        .await
        .map_err(|e| io("create", file, e))?;
    let mut hasher = Sha256::new();
    let mut len = 0u64;
    let mut stream = got.into_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        hasher.update(&chunk);
        out.write_all(&chunk)
            .await
            .map_err(|e| io("write", file, e))?;
        len += chunk.len() as u64;
        throttle.take(chunk.len()).await;
    }
    out.sync_all().await.map_err(|e| io("sync", file, e))?;
    Ok((len, hex(hasher)))
}
