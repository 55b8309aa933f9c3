//! Files and images (DESIGN.md §10): the region's file store, its signed
//! URLs, the cell's listener for the embedded default, the limits and the
//! per-tenant byte counts. The RPCs over them (reserve, resume, complete,
//! download, the refs a send carries, recall and sweeping) are
//! [`MessageService`](crate::message::MessageService) methods in
//! `message/attach.rs`, where membership and visibility live.

pub mod config;
pub mod http;
pub mod image;
pub mod sigv4;
pub mod store;
pub mod urls;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

pub use config::{AttachmentsConfig, TenantAttachments};
pub use store::{FileStore, StoredPart};

use crate::cold::TierStore;
use crate::storage::Store;

pub struct Attachments {
    pub config: AttachmentsConfig,
    pub files: FileStore,
    /// Tenant → bytes of its reserved and completed files on this cell,
    /// counted from the records on first use.
    bytes: Mutex<HashMap<u64, u64>>,
}

impl Attachments {
    /// Opens the configured store; `None` when attachments are off.
    pub fn open(config: &AttachmentsConfig, data_dir: &Path) -> Result<Option<Arc<Self>>, String> {
        if !config.enabled {
            return Ok(None);
        }
        let files = match config.store {
            TierStore::Local => {
                let dir = config.local_dir_under(data_dir);
                std::fs::create_dir_all(&dir)
                    .map_err(|e| format!("attachments directory {}: {e}", dir.display()))?;
                let key = config.key_file_under(data_dir);
                let signer = urls::UrlSigner::load_or_create(&key)
                    .map_err(|e| format!("attachments signing key {}: {e}", key.display()))?;
                FileStore::Local(store::LocalFiles {
                    dir,
                    signer,
                    base_url: Default::default(),
                })
            }
            TierStore::S3 => FileStore::S3(store::S3Files::open(&config.s3)?),
        };
        Ok(Some(Arc::new(Self {
            config: config.clone(),
            files,
            bytes: Mutex::new(HashMap::new()),
        })))
    }

    /// Starts the listener of the local store's signed URLs (none for S3):
    /// its address and task.
    pub async fn serve(
        &self,
        clock: Arc<dyn crate::clock::Clock>,
    ) -> std::io::Result<Option<(std::net::SocketAddr, tokio::task::JoinHandle<()>)>> {
        let FileStore::Local(local) = &self.files else {
            return Ok(None);
        };
        let listener = tokio::net::TcpListener::bind(&self.config.http_listen).await?;
        let addr = listener.local_addr()?;
        let base = if self.config.public_url.is_empty() {
            format!("http://{addr}")
        } else {
            self.config.public_url.trim_end_matches('/').to_string()
        };
        let _ = local.base_url.set(base);
        let router = http::router(Arc::new(local.clone()), clock);
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                tracing::error!(error = %e, "attachments listener stopped");
            }
        });
        Ok(Some((addr, task)))
    }

    /// Adds `delta` (may be negative) to `tenant`'s bytes, counting them
    /// from `store` first if this is the tenant's first use; the new count.
    pub fn add_bytes(&self, store: &Store, tenant: u64, delta: i64) -> crate::storage::Result<u64> {
        let mut bytes = self.bytes.lock().expect("bytes lock");
        let count = match bytes.get(&tenant) {
            Some(count) => *count,
            None => store
                .uploads_of(tenant)?
                .iter()
                .filter(|(_, r)| r.delete_after_ms == 0)
                .filter_map(|(_, r)| r.attachment.as_ref().map(|a| a.size))
                .sum(),
        };
        let count = count.saturating_add_signed(delta);
        bytes.insert(tenant, count);
        crate::metrics::metrics()
            .attachment_bytes
            .get_or_create(&crate::metrics::TenantLabel { tenant })
            .set(count as i64);
        Ok(count)
    }

    /// Drops `tenant`'s count after records changed: counted again on next
    /// use.
    pub fn forget_bytes(&self, tenant: u64) {
        self.bytes.lock().expect("bytes lock").remove(&tenant);
    }

    /// Bytes per tenant known so far (for the metric and `ctl`).
    pub fn tenant_bytes(&self) -> Vec<(u64, u64)> {
        let bytes = self.bytes.lock().expect("bytes lock");
        let mut all: Vec<_> = bytes.iter().map(|(t, b)| (*t, *b)).collect();
        all.sort_unstable();
        all
    }
}

/// The object key of upload `id`: tenant, conversation and upload, so a key
/// is never reused and a prefix lists a tenant's files.
pub fn object_key(tenant: u64, conversation: u64, id: u64) -> String {
    format!("t{tenant}/c{conversation}/u{id}")
}
