//! Files and images (DESIGN.md §10): the region's file store, its signed
//! URLs, the cell's listener for the embedded default, the limits and the
//! per-tenant byte counts. The RPCs over them (reserve, resume, complete,
//! download, the refs a send carries, recall and sweeping) are
//! [`MessageService`](crate::message::MessageService) methods in
//! `message/attach.rs`, where membership and visibility live.

pub mod config;
pub mod http;
pub mod image;
pub mod listener;
pub mod quota;
pub mod sigv4;
pub mod store;
pub mod urls;

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use config::{AttachmentsConfig, RegionFiles, TenantAttachments};
pub use store::{FileStore, StoredPart};

use crate::cold::{BucketError, TierStore};
use crate::storage::Store;

pub struct Attachments {
    pub config: AttachmentsConfig,
    /// This cell's region.
    pub region: String,
    /// This region's store.
    pub files: FileStore,
    /// Other regions' stores (`attachments.regions`).
    others: BTreeMap<String, FileStore>,
    /// Tenant → bytes of its reserved and completed files on this cell,
    /// counted from the records on first use.
    bytes: Mutex<HashMap<u64, u64>>,
    /// Calls the scanner.
    pub http: reqwest::Client,
    /// Copy jobs may be waiting (set at start, by an import that recorded
    /// some, and while a job is not done): the copier walks the records
    /// only then.
    pub copies_pending: std::sync::atomic::AtomicBool,
    /// Tenant → the copy rate a tenant move asked for, and when.
    copy_rates: Mutex<HashMap<u64, (u64, std::time::Instant)>>,
    /// Other cell's address → its bytes of each tenant with a quota, as it
    /// last answered (see [`quota`]).
    elsewhere: Mutex<HashMap<String, HashMap<u64, u64>>>,
}

/// How long a move's copy rate holds without being asked for again.
const COPY_RATE_HOLDS: std::time::Duration = std::time::Duration::from_secs(30);

impl Attachments {
    /// Opens the configured stores of a cell in `region`; `None` when
    /// attachments are off.
    pub fn open(
        config: &AttachmentsConfig,
        data_dir: &Path,
        region: &str,
    ) -> Result<Option<Arc<Self>>, BucketError> {
        if !config.enabled {
            return Ok(None);
        }
        let key = config.key_file_under(data_dir);
        let signer =
            urls::UrlSigner::load_or_create(&key).map_err(|e| BucketError::SigningKey {
                what: "attachments",
                path: key.clone(),
                source: e,
            })?;
        let base_url = Arc::new(std::sync::OnceLock::new());
        let open = |region: &str, store: TierStore, dir: PathBuf, s3: &crate::cold::S3Config| {
            Ok::<_, BucketError>(match store {
                TierStore::Local => {
                    std::fs::create_dir_all(&dir).map_err(|source| BucketError::Directory {
                        what: "attachments",
                        dir: dir.clone(),
                        source,
                    })?;
                    FileStore::Local(store::LocalFiles {
                        region: region.to_string(),
                        dir,
                        signer: signer.clone(),
                        base_url: base_url.clone(),
                    })
                }
                TierStore::S3 => FileStore::S3(store::S3Files::open(s3)?),
            })
        };
        let files = open(
            region,
            config.store,
            config.local_dir_under(data_dir),
            &config.s3,
        )?;
        let mut others = BTreeMap::new();
        for (name, other) in &config.regions {
            if name != region {
                let store = open(name, other.store, other.local_dir.clone(), &other.s3)?;
                others.insert(name.clone(), store);
            }
        }
        Ok(Some(Arc::new(Self {
            config: config.clone(),
            region: region.to_string(),
            files,
            others,
            bytes: Mutex::new(HashMap::new()),
            http: reqwest::Client::new(),
            copies_pending: std::sync::atomic::AtomicBool::new(true),
            copy_rates: Mutex::new(HashMap::new()),
            elsewhere: Mutex::new(HashMap::new()),
        })))
    }

    /// The store of `region` (empty: this cell's), if this cell reaches it.
    pub fn store_of(&self, region: &str) -> Option<&FileStore> {
        if region.is_empty() || region == self.region {
            Some(&self.files)
        } else {
            self.others.get(region)
        }
    }

    /// Starts the listener of the local stores' signed URLs (none when
    /// every store is S3): its address and task.
    pub async fn serve(
        &self,
        clock: Arc<dyn crate::clock::Clock>,
    ) -> std::io::Result<Option<(std::net::SocketAddr, tokio::task::JoinHandle<()>)>> {
        let locals: BTreeMap<String, store::LocalFiles> = std::iter::once(&self.files)
            .chain(self.others.values())
            .filter_map(|f| match f {
                FileStore::Local(local) => Some((local.region.clone(), local.clone())),
                FileStore::S3(_) => None,
            })
            .collect();
        let Some(any) = locals.values().next() else {
            return Ok(None);
        };
        let listener = tokio::net::TcpListener::bind(&self.config.http_listen).await?;
        let addr = listener.local_addr()?;
        let tls = (self.config.tls.watch())
            .map_err(|e| std::io::Error::other(format!("attachments.tls: {e}")))?;
        let base = match (self.config.public_url.as_str(), &tls) {
            ("", None) => format!("http://{addr}"),
            ("", Some(_)) => format!("https://{addr}"),
            (url, _) => url.trim_end_matches('/').to_string(),
        };
        let _ = any.base_url.set(base);
        let router = http::router(locals, clock);
        let task = tokio::spawn(async move {
            let served = match tls {
                None => axum::serve(listener, router).await,
                Some(tls) => axum::serve(listener::TlsListener::new(listener, tls), router).await,
            };
            if let Err(e) = served {
                tracing::error!(error = %e, "attachments listener stopped");
            }
        });
        Ok(Some((addr, task)))
    }

    /// Adds `delta` (may be negative) to `tenant`'s bytes, counting them
    /// from `store` first if this is the tenant's first use; the new count.
    pub fn add_bytes(
        &self,
        store: &Store,
        tenant: TenantId,
        delta: i64,
    ) -> crate::storage::Result<u64> {
        let mut bytes = self.bytes.lock().expect("bytes lock");
        let count = match bytes.get(&tenant.get()) {
            Some(count) => *count,
            None => store
                .uploads_of(tenant)?
                .iter()
                .filter(|(_, r)| r.delete_after_ms == 0)
                .filter_map(|(_, r)| r.attachment.as_ref().map(|a| a.size))
                .sum(),
        };
        let count = count.saturating_add_signed(delta);
        bytes.insert(tenant.get(), count);
        crate::metrics::metrics()
            .attachment_bytes
            .get_or_create(&crate::metrics::TenantLabel {
                tenant: tenant.get(),
            })
            .set(count as i64);
        Ok(count)
    }

    /// Adds `bytes` of records new on this cell to `tenant`'s count if it
    /// is counted already (if not, counting it will find them).
    pub fn add_known_bytes(&self, tenant: TenantId, bytes: u64) {
        let mut counts = self.bytes.lock().expect("bytes lock");
        if let Some(count) = counts.get_mut(&tenant.get()) {
            *count = count.saturating_add(bytes);
            crate::metrics::metrics()
                .attachment_bytes
                .get_or_create(&crate::metrics::TenantLabel {
                    tenant: tenant.get(),
                })
                .set(*count as i64);
        }
    }

    /// Drops `tenant`'s count after records changed: counted again on next
    /// use.
    pub fn forget_bytes(&self, tenant: TenantId) {
        self.bytes.lock().expect("bytes lock").remove(&tenant.get());
    }

    /// Limits copies of `tenant`'s files to `rate` bytes a second (0: no
    /// limit of the tenant's own) for the next 30 s.
    pub fn set_copy_rate(&self, tenant: TenantId, rate: u64) {
        let mut rates = self.copy_rates.lock().expect("copy rates lock");
        match rate {
            0 => rates.remove(&tenant.get()),
            rate => rates.insert(tenant.get(), (rate, std::time::Instant::now())),
        };
    }

    /// Bytes a second a copy of `tenant`'s files may take (0: any): the
    /// lower of the cell's limit and the one a move asked for lately.
    pub fn copy_rate(&self, tenant: TenantId) -> u64 {
        let asked = (self.copy_rates.lock().expect("copy rates lock"))
            .get(&tenant.get())
            .filter(|(_, at)| at.elapsed() < COPY_RATE_HOLDS)
            .map_or(0, |(rate, _)| *rate);
        match (self.config.copy_bytes_per_sec, asked) {
            (0, rate) | (rate, 0) => rate,
            (own, asked) => own.min(asked),
        }
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
pub fn object_key(tenant: TenantId, conversation: ConversationId, id: u64) -> String {
    format!("t{tenant}/c{conversation}/u{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moves_copy_rate_holds_only_below_the_cells_own_limit() {
        let dir = tempfile::tempdir().unwrap();
        let config = AttachmentsConfig {
            enabled: true,
            copy_bytes_per_sec: 1_000,
            ..AttachmentsConfig::default()
        };
        let att = Attachments::open(&config, dir.path(), "r1")
            .unwrap()
            .unwrap();
        assert_eq!(att.copy_rate(TenantId(7)), 1_000);
        att.set_copy_rate(TenantId(7), 400);
        assert_eq!(
            (att.copy_rate(TenantId(7)), att.copy_rate(TenantId(8))),
            (400, 1_000)
        );
        att.set_copy_rate(TenantId(7), 5_000);
        assert_eq!(att.copy_rate(TenantId(7)), 1_000);
        att.set_copy_rate(TenantId(7), 0);
        assert_eq!(att.copy_rate(TenantId(7)), 1_000);

        let config = AttachmentsConfig::default();
        let att = Attachments::open(&config, dir.path(), "r1")
            .unwrap()
            .unwrap();
        assert_eq!(att.copy_rate(TenantId(7)), 0);
        att.set_copy_rate(TenantId(7), 400);
        assert_eq!(att.copy_rate(TenantId(7)), 400);
    }
}
