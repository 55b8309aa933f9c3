//! `[tiering]`: when history leaves the hot tier, where cold segments are
//! stored (a local directory, the embedded default, or an S3 bucket), and
//! each tenant's retention and legal hold.

use cellmesh_proto::ids::TenantId;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use cellmesh_proto::config::{ConfigError, check, check_range};

/// Where segment objects live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TierStore {
    /// A directory on this machine (`local_dir`, default `<data_dir>/cold`).
    #[default]
    Local,
    /// An S3-compatible bucket (`[tiering.s3]`).
    S3,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TieringConfig {
    /// Off: every message stays hot in RocksDB.
    pub enabled: bool,
    /// Messages older than this leave the hot tier.
    pub hot_age_secs: u64,
    /// And so does everything beyond a conversation's newest this many
    /// messages.
    pub hot_messages_per_conversation: u64,
    /// How often the tierer looks for history to move, applies retention
    /// and sweeps orphan objects.
    pub interval_ms: u64,
    /// A segment holds at most this many messages (and at most
    /// `segment_max_bytes` of them, and one UTC day).
    pub segment_max_messages: u32,
    pub segment_max_bytes: usize,
    /// Decoded segments kept in memory for pulls.
    pub cache_segments: usize,
    /// An object no manifest names is deleted once it is this old (an
    /// upload whose manifest commit never happened).
    pub orphan_grace_secs: u64,
    pub store: TierStore,
    /// For `store = "local"`; empty: `<data_dir>/cold`. Cells of one region
    /// that share it hand segments over on a move without copying them.
    pub local_dir: PathBuf,
    pub s3: S3Config,
    /// The region (as the route table names regions) the store lies in;
    /// empty: this cell's own. The history of a tenant bound to regions
    /// that exclude it stays hot (a `RESIDENCY_VIOLATION` warning each
    /// pass, counted in the pass's report).
    /// Left out of a written config when empty, which 0.2.0 then reads.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub region: String,
    /// Tenant id (as a string) → its retention and legal hold.
    pub tenants: BTreeMap<String, TenantRetention>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct S3Config {
    pub bucket: String,
    /// e.g. `http://127.0.0.1:9000`; empty: AWS's endpoint for `region`.
    pub endpoint: String,
    pub region: String,
    /// Empty: taken from the environment (`AWS_ACCESS_KEY_ID`, ...).
    pub access_key_id: String,
    pub secret_access_key: String,
    /// Plain-HTTP endpoints (a local S3-compatible server).
    pub allow_http: bool,
    /// Prepended to every object key.
    pub prefix: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantRetention {
    /// Segments whose newest message is older than this are deleted (0:
    /// kept forever).
    pub retention_days: u32,
    /// Keeps everything whatever `retention_days` says.
    pub legal_hold: bool,
}

/// Why an object store (a local directory or an S3 bucket) did not open;
/// `what` names its use (cold tier, attachments, backup).
#[derive(Debug, thiserror::Error)]
pub enum BucketError {
    #[error("{what} directory {}: {source}", dir.display())]
    Directory {
        what: &'static str,
        dir: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{what} directory {}: {source}", dir.display())]
    LocalStore {
        what: &'static str,
        dir: std::path::PathBuf,
        source: object_store::Error,
    },
    #[error("{what} bucket {bucket}: {source}")]
    S3 {
        what: &'static str,
        bucket: String,
        source: object_store::Error,
    },
    #[error("{what} signing key {}: {source}", path.display())]
    SigningKey {
        what: &'static str,
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

impl S3Config {
    /// The bucket's client (credentials from the settings, else from the
    /// environment); `what` names the bucket's use in errors.
    pub fn build(&self, what: &'static str) -> Result<object_store::aws::AmazonS3, BucketError> {
        let mut builder = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(&self.bucket)
            .with_allow_http(self.allow_http);
        if !self.region.is_empty() {
            builder = builder.with_region(&self.region);
        }
        if !self.endpoint.is_empty() {
            builder = builder.with_endpoint(&self.endpoint);
        }
        if !self.access_key_id.is_empty() {
            builder = builder
                .with_access_key_id(&self.access_key_id)
                .with_secret_access_key(&self.secret_access_key);
        }
        builder.build().map_err(|source| BucketError::S3 {
            what,
            bucket: self.bucket.clone(),
            source,
        })
    }

    /// Checks the bucket settings; `fields` name the bucket, access key
    /// and endpoint settings in errors.
    pub fn validate(&self, fields: [&'static str; 3]) -> Result<(), ConfigError> {
        let [bucket, key, endpoint] = fields;
        check(
            bucket,
            !self.bucket.is_empty(),
            "required with store = \"s3\"",
        )?;
        check(
            key,
            self.access_key_id.is_empty() == self.secret_access_key.is_empty(),
            "set together with secret_access_key",
        )?;
        check(
            endpoint,
            self.endpoint.is_empty()
                || self.endpoint.starts_with("https://")
                || (self.allow_http && self.endpoint.starts_with("http://")),
            "an https:// URL (http:// only with allow_http)",
        )
    }
}

impl Default for TieringConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            hot_age_secs: 30 * 86_400,
            hot_messages_per_conversation: 10_000,
            interval_ms: 60_000,
            segment_max_messages: 1_000,
            segment_max_bytes: 4 * 1024 * 1024,
            cache_segments: 64,
            orphan_grace_secs: 3_600,
            store: TierStore::Local,
            local_dir: PathBuf::new(),
            s3: S3Config::default(),
            region: String::new(),
            tenants: BTreeMap::new(),
        }
    }
}

impl TieringConfig {
    /// The retention of `tenant` (none configured: keep forever).
    pub fn retention_of(&self, tenant: TenantId) -> TenantRetention {
        self.tenants
            .get(&tenant.to_string())
            .copied()
            .unwrap_or_default()
    }

    /// The local store's directory for a cell whose data lives in `data_dir`.
    pub fn local_dir_under(&self, data_dir: &Path) -> PathBuf {
        if self.local_dir.as_os_str().is_empty() {
            data_dir.join("cold")
        } else {
            self.local_dir.clone()
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        check_range("tiering.interval_ms", self.interval_ms, 10, 86_400_000)?;
        check_range(
            "tiering.segment_max_messages",
            self.segment_max_messages as u64,
            1,
            100_000,
        )?;
        check_range(
            "tiering.segment_max_bytes",
            self.segment_max_bytes as u64,
            1024,
            256 * 1024 * 1024,
        )?;
        check_range(
            "tiering.cache_segments",
            self.cache_segments as u64,
            0,
            100_000,
        )?;
        if self.store == TierStore::S3 {
            self.s3.validate([
                "tiering.s3.bucket",
                "tiering.s3.access_key_id",
                "tiering.s3.endpoint",
            ])?;
        }
        for (tenant, retention) in &self.tenants {
            check(
                "tiering.tenants",
                tenant.parse::<u64>().is_ok_and(|t| t > 0),
                &format!("{tenant:?} is not a tenant id"),
            )?;
            check(
                "tiering.tenants.retention_days",
                retention.retention_days == 0
                    || u64::from(retention.retention_days) * 86_400 >= self.hot_age_secs,
                &format!(
                    "tenant {tenant}: {} days is shorter than tiering.hot_age_secs; hot history would outlive it",
                    retention.retention_days
                ),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(config: &TieringConfig) -> &'static str {
        match config.validate() {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("expected an invalid field, got {other:?}"),
        }
    }

    #[test]
    fn bad_tiering_settings_name_their_field() {
        assert!(TieringConfig::default().validate().is_ok());
        let s3 = TieringConfig {
            store: TierStore::S3,
            ..Default::default()
        };
        assert_eq!(field_of(&s3), "tiering.s3.bucket");
        let mut plain_http = s3.clone();
        plain_http.s3.bucket = "b".into();
        plain_http.s3.endpoint = "http://127.0.0.1:9000".into();
        assert_eq!(field_of(&plain_http), "tiering.s3.endpoint");
        plain_http.s3.allow_http = true;
        assert!(plain_http.validate().is_ok());
        let mut short = TieringConfig::default();
        short.tenants.insert(
            "7".into(),
            TenantRetention {
                retention_days: 7,
                legal_hold: false,
            },
        );
        assert_eq!(field_of(&short), "tiering.tenants.retention_days");
        short.tenants.clear();
        short
            .tenants
            .insert("seven".into(), TenantRetention::default());
        assert_eq!(field_of(&short), "tiering.tenants");
        let tiny = TieringConfig {
            interval_ms: 1,
            ..Default::default()
        };
        assert_eq!(field_of(&tiny), "tiering.interval_ms");
    }
}
