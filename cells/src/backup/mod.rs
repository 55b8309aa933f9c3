//! Backups of the cell's database into object storage (`[backup]`): a
//! consistent RocksDB checkpoint uploaded file by file with a manifest of
//! where the cell stood. Incremental: an SST file never changes once
//! written, so one an earlier backup of this cell uploaded (same name and
//! size, still stored) is named again instead of uploaded; the other files
//! (the MANIFEST, OPTIONS, WAL) are stored per backup. The manifest is
//! written last and is the backup's commit point. Layout under the store's
//! prefix: `backups/<cell>/sst/<file>` shared, `backups/<cell>/<id>/files/
//! <file>` and `backups/<cell>/<id>/manifest.json` per backup. [`restore`]
//! brings a backup back as a cell's database.

pub mod config;
pub mod export;
mod files;
pub mod import;
pub mod lines;
pub mod manifest;
pub mod restore;
pub mod routes;

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;

pub use config::BackupConfig;
pub use manifest::Manifest;

use crate::storage::{StorageError, Store};
use crate::user::UserKey;
use files::Throttle;
use manifest::{ConversationMark, FileEntry, UserMark};

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("backup {0} not found")]
    NotFound(String),
    #[error("a backup of this cell is already running")]
    Running,
    #[error("backup object {0} is missing")]
    Missing(String),
    #[error("backup store: {0}")]
    Store(String),
    #[error("{0}")]
    Io(String),
    #[error("backup manifest {key}: {detail}")]
    Manifest { key: String, detail: String },
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    Cell(#[from] Box<crate::error::CellError>),
    #[error(transparent)]
    Bucket(#[from] crate::cold::BucketError),
}

impl From<crate::error::CellError> for BackupError {
    fn from(e: crate::error::CellError) -> Self {
        Self::Cell(Box::new(e))
    }
}

impl From<object_store::Error> for BackupError {
    fn from(e: object_store::Error) -> Self {
        Self::Store(e.to_string())
    }
}

type Result<T> = std::result::Result<T, BackupError>;

/// Where a checkpoint is staged and a verify restores to (under the data
/// dir: hard links need one file system).
const STAGING: &str = "backup-staging";
const SCRATCH: &str = "backup-verify";
/// A backup directory without a manifest this old is a crashed backup's
/// leftover.
const ORPHAN_AFTER_MS: u64 = 3_600_000;

/// One cell's backups.
pub struct Backups {
    store: Arc<dyn ObjectStore>,
    /// `<prefix>/backups/<cell>`
    root: String,
    /// The store's key prefix (`s3.prefix`).
    prefix: String,
    cell: String,
    data_dir: PathBuf,
    rate: u64,
    /// One backup or verify at a time.
    running: tokio::sync::Mutex<()>,
}

impl Backups {
    /// The backups of `cell` in the store `config` names.
    pub fn open(config: &BackupConfig, cell: &str, data_dir: &Path) -> Result<Self> {
        let (store, prefix) = crate::cold::open_bucket(
            config.store,
            &config.local_dir_under(data_dir),
            &config.s3,
            "backup",
        )?;
        let cell = cell.trim_matches('/');
        let root = match prefix.as_str() {
            "" => format!("backups/{cell}"),
            prefix => format!("{prefix}/backups/{cell}"),
        };
        Ok(Self {
            store,
            root,
            prefix,
            cell: cell.to_string(),
            data_dir: data_dir.to_path_buf(),
            rate: config.rate_bytes_per_sec,
            running: tokio::sync::Mutex::new(()),
        })
    }

    fn path(&self, rest: &str) -> ObjectPath {
        ObjectPath::from(format!("{}/{rest}", self.root))
    }

    fn manifest_key(id: &str) -> String {
        format!("{id}/manifest.json")
    }

    /// Takes a backup of `db` (whose route table index is `route_index`),
    /// then keeps only the newest `keep` (0: all).
    pub async fn create(
        &self,
        db: &Store,
        route_index: u64,
        keep: usize,
        now_ms: u64,
    ) -> Result<Manifest> {
        let _one = self.running.try_lock().map_err(|_| BackupError::Running)?;
        let id = manifest::new_id(now_ms);
        // Marks first: everything they name is in the checkpoint after.
        let (conversations, users) = marks(db)?;
        let staging = self.data_dir.join(STAGING);
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging).map_err(|e| BackupError::Io(e.to_string()))?;
        let dir = staging.join(&id);
        db.checkpoint(&dir)?;
        let uploaded = self.upload_dir(&id, &dir).await;
        let _ = std::fs::remove_dir_all(&staging);
        let (files, uploaded_files, uploaded_bytes) = uploaded?;
        let manifest = Manifest {
            id: id.clone(),
            cell: self.cell.clone(),
            created_ms: now_ms,
            release: cellmesh_proto::version::BINARY.to_string(),
            route_index,
            files,
            uploaded_files,
            uploaded_bytes,
            conversations,
            users,
        };
        let body = serde_json::to_vec(&manifest).map_err(|e| BackupError::Io(e.to_string()))?;
        self.store
            .put(&self.path(&Self::manifest_key(&id)), body.into())
            .await?;
        if keep > 0 {
            let all = self.list().await?;
            for old in all.iter().take(all.len().saturating_sub(keep)) {
                self.remove(&old.id).await?;
            }
        }
        self.sweep(now_ms).await?;
        Ok(manifest)
    }

    /// Uploads the checkpoint in `dir`: (its files, files and bytes sent).
    async fn upload_dir(&self, id: &str, dir: &Path) -> Result<(Vec<FileEntry>, u64, u64)> {
        let shared = self.shared_files().await?;
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map_err(|e| BackupError::Io(e.to_string()))?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        names.sort();
        let mut throttle = Throttle::new(self.rate);
        let (mut files, mut count) = (Vec::with_capacity(names.len()), 0u64);
        for name in names {
            let file = dir.join(&name);
            let size = std::fs::metadata(&file)
                .map_err(|e| BackupError::Io(e.to_string()))?
                .len();
            let key = if name.ends_with(".sst") {
                format!("sst/{name}")
            } else {
                format!("{id}/files/{name}")
            };
            if let Some(known) = shared.get(&key).filter(|k| k.size == size) {
                files.push(known.clone());
                continue;
            }
            let (size, sha256) =
                files::upload(&*self.store, &self.path(&key), &file, &mut throttle).await?;
            count += 1;
            files.push(FileEntry {
                name,
                key,
                size,
                sha256,
            });
        }
        Ok((files, count, throttle.bytes()))
    }

    /// SST files the newest backup names that are still stored, by key.
    async fn shared_files(&self) -> Result<HashMap<String, FileEntry>> {
        let stored: HashMap<String, u64> = self
            .store
            .list(Some(&self.path("sst")))
            .map_ok(|m| (m.location.to_string(), m.size))
            .try_collect()
            .await?;
        // An SST file a compaction deleted never comes back: those a new
        // checkpoint can share are all in the newest backup.
        let newest: Option<Manifest> = self.latest_as().await?;
        Ok(newest
            .into_iter()
            .flat_map(|m| m.files)
            .filter(|file| {
                let full = self.path(&file.key).to_string();
                file.key.starts_with("sst/") && stored.get(&full) == Some(&file.size)
            })
            .map(|file| (file.key.clone(), file))
            .collect())
    }

    /// Every backup of this cell, oldest first.
    pub async fn list(&self) -> Result<Vec<Manifest>> {
        self.list_as().await
    }

    /// Every committed manifest under this root, by id (ids sort by time).
    async fn list_as<T: serde::de::DeserializeOwned>(&self) -> Result<Vec<T>> {
        let mut out = Vec::new();
        for id in self.ids().await? {
            match self.read_manifest_as(&id).await {
                Ok(m) => out.push(m),
                // Not committed (running, or a crashed backup's leftover).
                Err(BackupError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// The newest committed manifest under this root, reading no other.
    async fn latest_as<T: serde::de::DeserializeOwned>(&self) -> Result<Option<T>> {
        for id in self.ids().await?.iter().rev() {
            match self.read_manifest_as(id).await {
                Ok(m) => return Ok(Some(m)),
                Err(BackupError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// The ids of the backups under this root, committed or not, in order.
    async fn ids(&self) -> Result<Vec<String>> {
        let listed = self
            .store
            .list_with_delimiter(Some(&ObjectPath::from(self.root.as_str())))
            .await?;
        let mut ids: Vec<String> = listed
            .common_prefixes
            .iter()
            .filter_map(|dir| dir.filename().map(str::to_string))
            .filter(|id| id != "sst")
            .collect();
        ids.sort();
        Ok(ids)
    }

    async fn read_manifest(&self, id: &str) -> Result<Manifest> {
        self.read_manifest_as(id).await
    }

    async fn read_manifest_as<T: serde::de::DeserializeOwned>(&self, id: &str) -> Result<T> {
        let key = self.path(&Self::manifest_key(id));
        let bytes = match self.store.get(&key).await {
            Ok(got) => got.bytes().await?,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(BackupError::NotFound(id.into()));
            }
            Err(e) => return Err(e.into()),
        };
        serde_json::from_slice(&bytes).map_err(|e| BackupError::Manifest {
            key: key.to_string(),
            detail: e.to_string(),
        })
    }

    /// The backup `id` (empty: the latest).
    pub async fn manifest(&self, id: &str) -> Result<Manifest> {
        if !id.is_empty() {
            return self.read_manifest(id).await;
        }
        self.latest_as()
            .await?
            .ok_or_else(|| BackupError::NotFound("(latest)".into()))
    }

    /// Deletes backup `id` and the shared files no other backup names.
    pub async fn delete(&self, id: &str) -> Result<()> {
        let _one = self.running.try_lock().map_err(|_| BackupError::Running)?;
        self.read_manifest(id).await?;
        self.remove(id).await
    }

    async fn remove(&self, id: &str) -> Result<()> {
        // The manifest first: from here on the backup does not exist.
        self.delete_object(&self.path(&Self::manifest_key(id)))
            .await?;
        self.delete_prefix(&self.path(id)).await?;
        let named: BTreeSet<String> = self
            .list()
            .await?
            .into_iter()
            .flat_map(|m| m.files.into_iter().map(|f| self.path(&f.key).to_string()))
            .collect();
        let shared: Vec<ObjectPath> = self
            .store
            .list(Some(&self.path("sst")))
            .map_ok(|m| m.location)
            .try_collect()
            .await?;
        for key in shared {
            if !named.contains(key.as_ref()) {
                self.delete_object(&key).await?;
            }
        }
        Ok(())
    }

    /// Deletes the objects of backups that never wrote their manifest.
    async fn sweep(&self, now_ms: u64) -> Result<()> {
        for id in self.ids().await? {
            let started = id.split('-').next().and_then(|t| t.parse::<u64>().ok());
            if started.is_none_or(|t| t + ORPHAN_AFTER_MS >= now_ms) {
                continue;
            }
            match self.store.head(&self.path(&Self::manifest_key(&id))).await {
                Err(object_store::Error::NotFound { .. }) => {
                    self.delete_prefix(&self.path(&id)).await?;
                }
                Ok(_) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    async fn delete_prefix(&self, prefix: &ObjectPath) -> Result<()> {
        let keys: Vec<ObjectPath> = self
            .store
            .list(Some(prefix))
            .map_ok(|m| m.location)
            .try_collect()
            .await?;
        for key in keys {
            self.delete_object(&key).await?;
        }
        Ok(())
    }

    async fn delete_object(&self, key: &ObjectPath) -> Result<()> {
        match self.store.delete(key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Downloads `manifest`'s files into `dir` (created), checking each
    /// one's size and SHA-256: the problems found, and the bytes read.
    pub async fn download(&self, manifest: &Manifest, dir: &Path) -> Result<(Vec<String>, u64)> {
        std::fs::create_dir_all(dir).map_err(|e| BackupError::Io(e.to_string()))?;
        let mut throttle = Throttle::new(self.rate);
        let mut problems = Vec::new();
        for file in &manifest.files {
            let to = dir.join(&file.name);
            match files::download(&*self.store, &self.path(&file.key), &to, &mut throttle).await {
                Ok((size, sha)) if size == file.size && sha == file.sha256 => {}
                Ok((size, sha)) => problems.push(format!(
                    "{}: {size} bytes with SHA-256 {sha}, the manifest says {} bytes with {}",
                    file.key, file.size, file.sha256
                )),
                Err(BackupError::Missing(key)) => problems.push(format!("{key} is missing")),
                Err(e) => return Err(e),
            }
        }
        Ok((problems, throttle.bytes()))
    }

    /// Restores backup `id` (empty: the latest) into a scratch directory
    /// and checks it: every file's digest, the database opens, and it holds
    /// every conversation and sync queue as far as the manifest says.
    pub async fn verify(
        &self,
        id: &str,
        storage: &crate::config::StorageConfig,
        cold: Option<&crate::cold::ColdTier>,
    ) -> Result<(Manifest, Vec<String>, u64)> {
        let _one = self.running.try_lock().map_err(|_| BackupError::Running)?;
        let manifest = self.manifest(id).await?;
        let scratch = self.data_dir.join(SCRATCH);
        let _ = std::fs::remove_dir_all(&scratch);
        let checked = self.check_in(&manifest, &scratch, storage, cold).await;
        let _ = std::fs::remove_dir_all(&scratch);
        let (problems, bytes) = checked?;
        Ok((manifest, problems, bytes))
    }

    async fn check_in(
        &self,
        manifest: &Manifest,
        scratch: &Path,
        storage: &crate::config::StorageConfig,
        cold: Option<&crate::cold::ColdTier>,
    ) -> Result<(Vec<String>, u64)> {
        let (mut problems, bytes) = self.download(manifest, scratch).await?;
        if !problems.is_empty() {
            return Ok((problems, bytes));
        }
        let db = match Store::open(scratch, storage) {
            Ok(db) => db,
            Err(e) => {
                problems.push(format!("the database does not open: {e}"));
                return Ok((problems, bytes));
            }
        };
        let found = check_marks(&db, manifest);
        let segments = match (&found, cold) {
            (Ok(_), Some(cold)) => missing_segments(&db, manifest, cold).await,
            _ => Ok(Vec::new()),
        };
        db.close();
        problems.extend(found?);
        problems.extend(segments?);
        Ok((problems, bytes))
    }
}

/// Each conversation's latest seq and each user's queue, for a manifest.
fn marks(db: &Store) -> Result<(Vec<ConversationMark>, Vec<UserMark>)> {
    let mut conversations = Vec::new();
    let mut after = 0;
    loop {
        let page = db.conversation_marks(after, 4096)?;
        let Some(&(_, last, _)) = page.last() else {
            break;
        };
        after = last;
        conversations.extend(page.into_iter().map(|(tenant, conversation, seq)| {
            ConversationMark {
                tenant: TenantId(tenant),
                conversation: ConversationId(conversation),
                seq,
            }
        }));
    }
    let mut users = Vec::new();
    for (tenant, user, queue_id) in db.queues()? {
        let pts = db.user_pts(UserKey::new(TenantId(tenant), UserId(user)))?;
        users.push(UserMark {
            tenant: TenantId(tenant),
            user: UserId(user),
            pts,
            queue_id,
        });
    }
    Ok((conversations, users))
}

/// The cold segments `db`'s manifests name that the cold tier no longer
/// holds (a restore would find history it cannot read).
async fn missing_segments(
    db: &Store,
    manifest: &Manifest,
    cold: &crate::cold::ColdTier,
) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for mark in &manifest.conversations {
        for entry in db.segments(mark.conversation)? {
            let stored = cold
                .size_of(&entry.key)
                .await
                .map_err(|e| BackupError::Store(e.to_string()))?;
            if stored.is_none() {
                problems.push(format!(
                    "segment {} of conversation {} is missing from the cold tier",
                    entry.key, mark.conversation
                ));
            }
        }
    }
    Ok(problems)
}

/// What `db` lacks of what `manifest` says it holds.
fn check_marks(db: &Store, manifest: &Manifest) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for mark in &manifest.conversations {
        let seq = db.conv_seq(mark.conversation)?;
        let has = seq.latest_seq.max(seq.seq_floor);
        if db.conversation(mark.conversation)?.is_none() || has < mark.seq {
            problems.push(format!(
                "conversation {} holds seq {has}, the manifest says {}",
                mark.conversation, mark.seq
            ));
        }
    }
    for mark in &manifest.users {
        let pts = db.user_pts(UserKey::new(mark.tenant, mark.user))?;
        if pts < mark.pts {
            problems.push(format!(
                "user {} of tenant {} holds pts {pts}, the manifest says {}",
                mark.user, mark.tenant, mark.pts
            ));
        }
    }
    Ok(problems)
}
