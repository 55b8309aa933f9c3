//! The cold tier (DESIGN.md §9): a conversation's older history as
//! immutable, checksummed segments in object storage — a local directory
//! (the embedded default) or an S3 bucket — read back verified and kept in
//! a small cache of decoded segments. What is cold is said by the
//! per-conversation manifest in RocksDB (`storage::manifest`); moving
//! history here is the tierer's (`message::tier`).

pub mod config;
pub mod journal;
pub mod segment;

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};

use cellmesh_proto::storage::v1::{MessageRecord, SegmentEntry};
use futures::TryStreamExt;
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;

pub use config::{BucketError, S3Config, TenantRetention, TierStore, TieringConfig};
use segment::SegmentFault;

/// Decoded messages of one segment, ascending seq.
pub type Messages = Arc<Vec<(u64, MessageRecord)>>;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ColdError {
    /// The object is not the segment its manifest entry names: never
    /// served.
    #[error("segment {key} is corrupt: {fault}")]
    Corrupt { key: String, fault: SegmentFault },
    #[error("segment {key} is missing from the object store")]
    Missing { key: String },
    /// The object store did not answer as it should (transient).
    #[error("object store: {0}")]
    Store(String),
}

/// An object in the tier, for sweeping.
#[derive(Debug, Clone)]
pub struct StoredObject {
    pub key: String,
    pub modified_ms: u64,
}

/// The object store `store` names — a local directory (created) or an S3
/// bucket — and the prefix of every key in it; `what` names its use in
/// errors.
pub fn open_bucket(
    store: TierStore,
    local_dir: &Path,
    s3: &S3Config,
    what: &'static str,
) -> Result<(Arc<dyn ObjectStore>, String), BucketError> {
    match store {
        TierStore::Local => {
            let dir = local_dir.to_path_buf();
            std::fs::create_dir_all(local_dir).map_err(|source| BucketError::Directory {
                what,
                dir: dir.clone(),
                source,
            })?;
            let store = object_store::local::LocalFileSystem::new_with_prefix(local_dir)
                .map_err(|source| BucketError::LocalStore { what, dir, source })?;
            Ok((Arc::new(store), String::new()))
        }
        TierStore::S3 => Ok((
            Arc::new(s3.build(what)?),
            s3.prefix.trim_matches('/').to_string(),
        )),
    }
}

/// One cell's view of the cold tier.
pub struct ColdTier {
    store: Arc<dyn ObjectStore>,
    /// Prepended to every key (`tiering.s3.prefix`).
    prefix: String,
    cache: Mutex<VecDeque<(String, Messages)>>,
    pub config: TieringConfig,
    /// Where retention's deletions are recorded as operations.
    pub journal: journal::Journal,
}

impl ColdTier {
    /// Opens the store `config` names (creating the local directory);
    /// deletions are recorded in `journal`.
    pub fn open(
        config: &TieringConfig,
        data_dir: &Path,
        journal: journal::Journal,
    ) -> Result<Self, BucketError> {
        let (store, prefix) = open_bucket(
            config.store,
            &config.local_dir_under(data_dir),
            &config.s3,
            "cold tier",
        )?;
        Ok(Self {
            store,
            prefix,
            cache: Mutex::new(VecDeque::new()),
            config: config.clone(),
            journal,
        })
    }

    fn path(&self, key: &str) -> ObjectPath {
        if self.prefix.is_empty() {
            ObjectPath::from(key)
        } else {
            ObjectPath::from(format!("{}/{key}", self.prefix))
        }
    }

    /// Stores `bytes` under `key` (content-addressed: a retry writes the
    /// same bytes).
    pub async fn put(&self, key: &str, bytes: Vec<u8>) -> Result<(), ColdError> {
        self.store
            .put(&self.path(key), bytes.into())
            .await
            .map(|_| ())
            .map_err(|e| ColdError::Store(e.to_string()))
    }

    async fn fetch(&self, key: &str) -> Result<bytes::Bytes, ColdError> {
        let got = match self.store.get(&self.path(key)).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(ColdError::Missing { key: key.into() });
            }
            Err(e) => return Err(ColdError::Store(e.to_string())),
        };
        got.bytes()
            .await
            .map_err(|e| ColdError::Store(e.to_string()))
    }

    /// The bytes of the segment `entry` names, checked against its
    /// checksum (to hand to a cell with another bucket).
    pub async fn segment_bytes(
        &self,
        conversation: ConversationId,
        entry: &SegmentEntry,
    ) -> Result<bytes::Bytes, ColdError> {
        let bytes = self.fetch(&entry.key).await?;
        checked(&entry.key, &bytes, &entry.checksum, conversation)?;
        Ok(bytes)
    }

    /// Stores a segment another cell handed over, after checking it is the
    /// one `entry` names.
    pub async fn store_copy(
        &self,
        conversation: ConversationId,
        entry: &SegmentEntry,
        bytes: Vec<u8>,
    ) -> Result<(), ColdError> {
        checked(&entry.key, &bytes, &entry.checksum, conversation)?;
        self.put(&entry.key, bytes).await
    }

    /// The messages of the segment `entry` names in `conversation`,
    /// checked against its checksum (a decoded segment is cached).
    pub async fn read(
        &self,
        conversation: ConversationId,
        entry: &SegmentEntry,
    ) -> Result<Messages, ColdError> {
        if let Some(hit) = self.cached(&entry.key) {
            return Ok(hit);
        }
        let bytes = self.fetch(&entry.key).await?;
        let messages = Arc::new(checked(&entry.key, &bytes, &entry.checksum, conversation)?);
        self.remember(&entry.key, messages.clone());
        Ok(messages)
    }

    /// Reads `key` back and checks it against `checksum` (after an upload,
    /// before the manifest names it).
    pub async fn verify(
        &self,
        key: &str,
        checksum: &[u8],
        conversation: ConversationId,
    ) -> Result<(), ColdError> {
        let bytes = self.fetch(key).await?;
        checked(key, &bytes, checksum, conversation).map(|_| ())
    }

    /// The size of the object at `key` (`None`: there is none).
    pub async fn size_of(&self, key: &str) -> Result<Option<u64>, ColdError> {
        match self.store.head(&self.path(key)).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(ColdError::Store(e.to_string())),
        }
    }

    pub async fn delete(&self, key: &str) -> Result<(), ColdError> {
        self.forget(key);
        match self.store.delete(&self.path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(ColdError::Store(e.to_string())),
        }
    }

    /// Every segment object under `segments/` (or, with a tenant, that
    /// tenant's).
    pub async fn list(&self, tenant: Option<TenantId>) -> Result<Vec<StoredObject>, ColdError> {
        let under = match tenant {
            Some(t) => format!("segments/t{t}"),
            None => "segments".to_string(),
        };
        let prefix = self.path(&under);
        let strip = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        let objects: Vec<_> = self
            .store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| ColdError::Store(e.to_string()))?;
        Ok(objects
            .into_iter()
            .map(|meta| StoredObject {
                key: meta
                    .location
                    .as_ref()
                    .strip_prefix(strip.as_str())
                    .unwrap_or(meta.location.as_ref())
                    .to_string(),
                modified_ms: meta.last_modified.timestamp_millis().max(0) as u64,
            })
            .collect())
    }

    fn cached(&self, key: &str) -> Option<Messages> {
        let mut cache = self.cache.lock().expect("segment cache");
        let at = cache.iter().position(|(k, _)| k == key)?;
        let hit = cache.remove(at)?;
        let messages = hit.1.clone();
        cache.push_back(hit);
        Some(messages)
    }

    fn remember(&self, key: &str, messages: Messages) {
        let capacity = self.config.cache_segments;
        if capacity == 0 {
            return;
        }
        let mut cache = self.cache.lock().expect("segment cache");
        cache.retain(|(k, _)| k != key);
        while cache.len() >= capacity {
            cache.pop_front();
        }
        cache.push_back((key.to_string(), messages));
    }

    fn forget(&self, key: &str) {
        self.cache
            .lock()
            .expect("segment cache")
            .retain(|(k, _)| k != key);
    }
}

/// The messages in `bytes` if they are the segment `key` of
/// `conversation` with `checksum`; a mismatch is counted and reported as
/// corrupt, never served.
fn checked(
    key: &str,
    bytes: &[u8],
    checksum: &[u8],
    conversation: ConversationId,
) -> Result<Vec<(u64, MessageRecord)>, ColdError> {
    segment::decode(bytes, checksum, conversation).map_err(|fault| {
        crate::metrics::metrics().segments_corrupt.inc();
        ColdError::Corrupt {
            key: key.into(),
            fault,
        }
    })
}
