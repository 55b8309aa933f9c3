//! `[attachments]`: where files live (a local directory the cell serves
//! itself over signed URLs, the embedded default, or an S3 bucket the
//! clients talk to directly), how big they may be, how long URLs and
//! reservations last, and each tenant's quota and allowed content types.

use cellmesh_proto::ids::TenantId;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use cellmesh_proto::config::{ConfigError, check, check_range};

use crate::cold::{S3Config, TierStore};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AttachmentsConfig {
    /// Off: uploads are refused with `ATTACHMENT_STORE_UNAVAILABLE`.
    pub enabled: bool,
    pub store: TierStore,
    /// For `store = "local"`; empty: `<data_dir>/attachments`. Cells of a
    /// region that share it keep serving a conversation's files after a
    /// move within the region.
    pub local_dir: PathBuf,
    pub s3: S3Config,
    /// The region (as the route table names regions) the store lies in;
    /// empty: this cell's own. A tenant bound to regions that exclude it
    /// gets no upload here (`RESIDENCY_VIOLATION`).
    /// Left out of a written config when empty, which 0.2.0 then reads.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub region: String,
    /// Where the cell serves signed URLs of the local store (HTTP,
    /// `host:port`; port 0 picks one).
    pub http_listen: String,
    /// The base URL clients reach that listener at (empty:
    /// `http://<bound address>`, or `https://` with `tls`).
    pub public_url: String,
    /// The certificate that listener presents to clients, who present none
    /// (both files empty: plain HTTP). Watched like `[tls]`. Left out of a
    /// written config when off, which 0.2.0 then still reads.
    #[serde(skip_serializing_if = "plain_http")]
    pub tls: cellmesh_proto::tls::PublicTlsConfig,
    /// Largest file accepted.
    pub max_file_bytes: u64,
    /// Files above this go up in parts of this size (S3's minimum is 5 MiB).
    pub part_bytes: u64,
    /// A reservation not completed by then is swept with its bytes.
    pub upload_expiry_secs: u64,
    /// Lifetime of an upload URL.
    pub upload_url_secs: u64,
    /// Lifetime of a download URL.
    pub download_url_secs: u64,
    pub max_per_message: usize,
    /// A recalled message's files are deleted this long after the recall.
    pub recall_grace_secs: u64,
    /// How often expired reservations and recalled files are swept.
    pub sweep_interval_ms: u64,
    /// Holds the key that signs the local store's URLs (created on first
    /// start); empty: `<data_dir>/attachments.key`. Cells sharing a local
    /// directory may share the key too.
    pub signing_key_file: PathBuf,
    /// Content types every tenant may upload (`image/*` style prefixes
    /// allowed); empty: any.
    pub content_types: Vec<String>,
    /// Tenant id (as a string) → its quota and content types.
    pub tenants: BTreeMap<String, TenantAttachments>,
    /// How often a cell asks the other cells for the bytes of the tenants
    /// with a quota, which then counts them too (0: each cell holds a
    /// tenant to its quota alone).
    pub quota_sync_secs: u64,
    /// Other regions' stores, by region name: files that came with a move
    /// or a failover from there are served from there until copied here.
    pub regions: BTreeMap<String, RegionFiles>,
    /// PNG and JPEG images get a PNG thumbnail at most this many pixels on
    /// the longer side (0: none), when at most `thumbnail_source_bytes`.
    pub thumbnail_px: u32,
    pub thumbnail_source_bytes: u64,
    /// A scanner the operator runs (empty: none). At completion the cell
    /// POSTs the file's description and a signed GET URL as JSON; the
    /// upload completes only on `{"verdict":"clean"}`, is refused and
    /// deleted on `{"verdict":"infected"}`, and stays pending on anything
    /// else (the client completes again later).
    pub scan_webhook: String,
    pub scan_timeout_ms: u64,
    /// A file copied in from another region is deleted there this long
    /// after the copy (unless the conversation moved back meanwhile).
    pub source_grace_secs: u64,
    /// Copying files that came with a move from another region: at most
    /// this many bytes a second (0: no limit).
    pub copy_bytes_per_sec: u64,
}

/// Another region's file store.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegionFiles {
    pub store: TierStore,
    /// For `store = "local"`: a directory this cell can read.
    pub local_dir: PathBuf,
    pub s3: S3Config,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantAttachments {
    /// Bytes of files the tenant may keep, on every cell together (as of
    /// the last `quota_sync_secs`; 0: no limit).
    pub quota_bytes: u64,
    /// Replaces the deployment-wide `content_types` for this tenant.
    pub content_types: Vec<String>,
}

impl Default for AttachmentsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            store: TierStore::Local,
            local_dir: PathBuf::new(),
            s3: S3Config::default(),
            region: String::new(),
            http_listen: "127.0.0.1:0".into(),
            public_url: String::new(),
            tls: Default::default(),
            max_file_bytes: 2 * 1024 * 1024 * 1024,
            part_bytes: 8 * 1024 * 1024,
            upload_expiry_secs: 86_400,
            upload_url_secs: 3_600,
            download_url_secs: 300,
            max_per_message: 10,
            recall_grace_secs: 86_400,
            sweep_interval_ms: 60_000,
            signing_key_file: PathBuf::new(),
            content_types: Vec::new(),
            tenants: BTreeMap::new(),
            quota_sync_secs: 10,
            regions: BTreeMap::new(),
            thumbnail_px: 256,
            thumbnail_source_bytes: 20 * 1024 * 1024,
            scan_webhook: String::new(),
            scan_timeout_ms: 30_000,
            source_grace_secs: 86_400,
            copy_bytes_per_sec: 0,
        }
    }
}

fn plain_http(tls: &cellmesh_proto::tls::PublicTlsConfig) -> bool {
    !tls.enabled()
}

impl AttachmentsConfig {
    pub fn local_dir_under(&self, data_dir: &Path) -> PathBuf {
        if self.local_dir.as_os_str().is_empty() {
            data_dir.join("attachments")
        } else {
            self.local_dir.clone()
        }
    }

    pub fn key_file_under(&self, data_dir: &Path) -> PathBuf {
        if self.signing_key_file.as_os_str().is_empty() {
            data_dir.join("attachments.key")
        } else {
            self.signing_key_file.clone()
        }
    }

    /// The tenants with a quota.
    pub fn quota_tenants(&self) -> Vec<TenantId> {
        (self.tenants.iter())
            .filter(|(_, t)| t.quota_bytes > 0)
            .filter_map(|(id, _)| id.parse().ok().map(TenantId))
            .collect()
    }

    pub fn tenant(&self, tenant: TenantId) -> TenantAttachments {
        self.tenants
            .get(&tenant.to_string())
            .cloned()
            .unwrap_or_default()
    }

    /// Whether `tenant` may upload files of `content_type`.
    pub fn allows(&self, tenant: TenantId, content_type: &str) -> bool {
        let own = self.tenant(tenant).content_types;
        let allowed = if own.is_empty() {
            &self.content_types
        } else {
            &own
        };
        allowed.is_empty()
            || allowed.iter().any(|a| match a.strip_suffix('*') {
                Some(prefix) => content_type.starts_with(prefix),
                None => a == content_type,
            })
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        check_range(
            "attachments.part_bytes",
            self.part_bytes,
            64 * 1024,
            5 * 1024 * 1024 * 1024,
        )?;
        if self.store == TierStore::S3 {
            check(
                "attachments.part_bytes",
                self.part_bytes >= 5 * 1024 * 1024,
                "S3 parts are at least 5 MiB",
            )?;
            self.s3.validate([
                "attachments.s3.bucket",
                "attachments.s3.access_key_id",
                "attachments.s3.endpoint",
            ])?;
        }
        check_range(
            "attachments.max_file_bytes",
            self.max_file_bytes,
            1,
            self.part_bytes.saturating_mul(10_000),
        )?;
        check_range(
            "attachments.upload_url_secs",
            self.upload_url_secs,
            1,
            7 * 86_400,
        )?;
        check_range(
            "attachments.download_url_secs",
            self.download_url_secs,
            1,
            7 * 86_400,
        )?;
        check_range(
            "attachments.upload_expiry_secs",
            self.upload_expiry_secs,
            60,
            30 * 86_400,
        )?;
        check_range(
            "attachments.max_per_message",
            self.max_per_message as u64,
            1,
            100,
        )?;
        check_range(
            "attachments.quota_sync_secs",
            self.quota_sync_secs,
            0,
            86_400,
        )?;
        check_range(
            "attachments.sweep_interval_ms",
            self.sweep_interval_ms,
            10,
            86_400_000,
        )?;
        check(
            "attachments.http_listen",
            self.http_listen.parse::<std::net::SocketAddr>().is_ok(),
            "a host:port to listen on",
        )?;
        check(
            "attachments.public_url",
            self.public_url.is_empty()
                || self.public_url.starts_with("http://")
                || self.public_url.starts_with("https://"),
            "an http:// or https:// URL",
        )?;
        if let Err(message) = self.tls.validate() {
            check("attachments.tls", false, &message)?;
        }
        check(
            "attachments.scan_webhook",
            self.scan_webhook.is_empty()
                || self.scan_webhook.starts_with("http://")
                || self.scan_webhook.starts_with("https://"),
            "an http:// or https:// URL",
        )?;
        for (region, files) in &self.regions {
            check(
                "attachments.regions",
                !region.is_empty() && !region.contains('/'),
                &format!("{region:?} is not a region name"),
            )?;
            match files.store {
                TierStore::S3 => files.s3.validate([
                    "attachments.regions.s3.bucket",
                    "attachments.regions.s3.access_key_id",
                    "attachments.regions.s3.endpoint",
                ])?,
                TierStore::Local => check(
                    "attachments.regions.local_dir",
                    !files.local_dir.as_os_str().is_empty(),
                    &format!("region {region}: the directory of its files"),
                )?,
            }
        }
        for tenant in self.tenants.keys() {
            check(
                "attachments.tenants",
                tenant.parse::<u64>().is_ok_and(|t| t > 0),
                &format!("{tenant:?} is not a tenant id"),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(config: &AttachmentsConfig) -> &'static str {
        match config.validate() {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("expected an invalid field, got {other:?}"),
        }
    }

    #[test]
    fn bad_settings_name_their_field() {
        assert!(AttachmentsConfig::default().validate().is_ok());
        let s3 = AttachmentsConfig {
            store: TierStore::S3,
            ..Default::default()
        };
        assert_eq!(field_of(&s3), "attachments.s3.bucket");
        let small_parts = AttachmentsConfig {
            store: TierStore::S3,
            part_bytes: 1024 * 1024,
            ..Default::default()
        };
        assert_eq!(field_of(&small_parts), "attachments.part_bytes");
        let listen = AttachmentsConfig {
            http_listen: "nowhere".into(),
            ..Default::default()
        };
        assert_eq!(field_of(&listen), "attachments.http_listen");
        let mut tenants = AttachmentsConfig::default();
        tenants
            .tenants
            .insert("acme".into(), TenantAttachments::default());
        assert_eq!(field_of(&tenants), "attachments.tenants");
    }

    #[test]
    fn content_types_match_exactly_or_by_prefix() {
        let mut config = AttachmentsConfig {
            content_types: vec!["image/*".into(), "application/pdf".into()],
            ..Default::default()
        };
        assert!(config.allows(TenantId(1), "image/png"));
        assert!(config.allows(TenantId(1), "application/pdf"));
        assert!(!config.allows(TenantId(1), "application/x-msdownload"));
        config.tenants.insert(
            "2".into(),
            TenantAttachments {
                quota_bytes: 0,
                content_types: vec!["text/plain".into()],
            },
        );
        assert!(config.allows(TenantId(2), "text/plain"));
        assert!(!config.allows(TenantId(2), "image/png"));
        assert!(AttachmentsConfig::default().allows(TenantId(1), "anything/at-all"));
    }
}
