//! Route-table backups: the data of a router replica's Raft snapshot
//! (`Routing.Snapshot`: cells, tenants, overrides, epochs, the cluster
//! version, the retained change history), stored in the backup store under
//! `backups/routes/<id>/` with a manifest (applied index, counts, size,
//! SHA-256) written last. `cellmesh router --restore-from` seeds a new
//! group from one (`ctl backup restore-routes` fetches and checks it).

use serde::{Deserialize, Serialize};

use super::{BackupConfig, BackupError, Backups, Result};

/// Where route-table backups live beside the cells' (a cell id always
/// has a region: no cell is named this).
pub const ROUTES: &str = "routes";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteManifest {
    pub id: String,
    pub created_ms: u64,
    pub applied_index: u64,
    pub cells: u64,
    pub routes: u64,
    pub cluster_version: String,
    pub size: u64,
    pub sha256: String,
}

fn sha256_hex(bytes: &[u8]) -> String {
    <sha2::Sha256 as sha2::Digest>::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The route-table backups in the store `config` names (`data_dir`: where
/// a local store's default directory is found).
pub fn open(config: &BackupConfig, data_dir: &std::path::Path) -> Result<Backups> {
    Backups::open(config, ROUTES, data_dir)
}

impl Backups {
    /// Stores a route-table snapshot.
    pub async fn put_routes(
        &self,
        snapshot: &cellmesh_proto::v1::RouteSnapshot,
        now_ms: u64,
    ) -> Result<RouteManifest> {
        let id = super::manifest::new_id(now_ms);
        let manifest = RouteManifest {
            id: id.clone(),
            created_ms: now_ms,
            applied_index: snapshot.applied_index,
            cells: snapshot.cells,
            routes: snapshot.routes,
            cluster_version: snapshot.cluster_version.clone(),
            size: snapshot.data.len() as u64,
            sha256: sha256_hex(&snapshot.data),
        };
        self.store
            .put(
                &self.path(&format!("{id}/snapshot.bin")),
                snapshot.data.clone().into(),
            )
            .await?;
        let body = serde_json::to_vec(&manifest).map_err(|e| BackupError::Io(e.to_string()))?;
        self.store
            .put(&self.path(&Self::manifest_key(&id)), body.into())
            .await?;
        Ok(manifest)
    }

    /// Every route-table backup, oldest first.
    pub async fn route_backups(&self) -> Result<Vec<RouteManifest>> {
        self.list_as().await
    }

    /// Route-table backup `id` (empty: the latest) and its snapshot's
    /// data, checked against the manifest.
    pub async fn get_routes(&self, id: &str) -> Result<(RouteManifest, Vec<u8>)> {
        let manifest: RouteManifest = match id {
            "" => self
                .latest_as()
                .await?
                .ok_or_else(|| BackupError::NotFound("(latest)".into()))?,
            id => self.read_manifest_as(id).await?,
        };
        let key = self.path(&format!("{}/snapshot.bin", manifest.id));
        let data = match self.store.get(&key).await {
            Ok(got) => got.bytes().await?.to_vec(),
            Err(object_store::Error::NotFound { .. }) => {
                return Err(BackupError::Missing(key.to_string()));
            }
            Err(e) => return Err(e.into()),
        };
        if data.len() as u64 != manifest.size || sha256_hex(&data) != manifest.sha256 {
            return Err(BackupError::Io(format!(
                "{key} does not match its manifest (size or SHA-256)"
            )));
        }
        Ok((manifest, data))
    }
}
