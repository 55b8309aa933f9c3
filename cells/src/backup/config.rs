//! `[backup]`: where a cell's backups go (a local directory, the embedded
//! default, or an S3 bucket) and how fast a backup may read and upload,
//! so that sends keep their latency while it runs.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use cellmesh_proto::config::{ConfigError, check};

use crate::cold::{S3Config, TierStore};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackupConfig {
    pub store: TierStore,
    /// For `store = "local"`; empty: `<data_dir>/../backups` (beside the
    /// data dir, so that losing the data dir does not lose them; a real
    /// deployment puts them in a bucket).
    pub local_dir: PathBuf,
    pub s3: S3Config,
    /// The region (as the route table names regions) the store lies in;
    /// empty: this cell's own. A tenant bound to regions that exclude it
    /// refuses this cell's backups (`RESIDENCY_VIOLATION`).
    pub region: String,
    /// Bytes uploaded (and read back by `verify` and restores) per second
    /// at most; 0: no limit.
    pub rate_bytes_per_sec: u64,
}

impl Default for BackupConfig {
    fn default() -> Self {
        Self {
            store: TierStore::Local,
            local_dir: PathBuf::new(),
            s3: S3Config::default(),
            region: String::new(),
            rate_bytes_per_sec: 64 * 1024 * 1024,
        }
    }
}

impl BackupConfig {
    /// The local store's directory for a cell whose data lives in `data_dir`.
    pub fn local_dir_under(&self, data_dir: &Path) -> PathBuf {
        if !self.local_dir.as_os_str().is_empty() {
            return self.local_dir.clone();
        }
        match data_dir.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.join("backups"),
            _ => data_dir.join("backups"),
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        check(
            "backup.rate_bytes_per_sec",
            self.rate_bytes_per_sec == 0 || self.rate_bytes_per_sec >= 64 * 1024,
            "0 (no limit) or at least 65536",
        )?;
        if self.store == TierStore::S3 {
            self.s3.validate([
                "backup.s3.bucket",
                "backup.s3.access_key_id",
                "backup.s3.endpoint",
            ])?;
        }
        Ok(())
    }
}
