//! A running `cellmesh dev` as the tools see it (`bench ... --dev`,
//! `chaos run --dev`, `ctl --dev`): endpoints, the demo tenant and the
//! deployment secret from `DATA_DIR/dev.json`, and client tokens for any user
//! signed with the token secret from `DATA_DIR/secrets.json`.

use cellmesh_proto::ids::{TenantId, UserId};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::Context;
use cellmesh_edge::auth::{Claims, TokenKey, now_secs};
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::table::Key;
use serde_json::Value;
use tonic::metadata::{Ascii, MetadataValue};

/// Written by `cellmesh chaos run region-partition`: `{"regions": [...]}`
/// cuts every cross-region link to and from the listed regions (both
/// directions stall, open connections are dropped); an empty list heals.
pub const PARTITION_FILE: &str = "partition.json";

/// The file drills write to take the mock Kafka cluster's brokers down
/// (`{"down": [broker ids]}`).
pub const KAFKA_FILE: &str = "kafka.json";

/// The file under a dev data dir that keeps child `name` down: the
/// supervisor does not restart it while the file exists.
pub fn held_file(data_dir: &Path, name: &str) -> PathBuf {
    data_dir.join("held").join(name.replace('/', "-"))
}

/// How long the tokens a tool mints stay valid.
const TOKEN_TTL_SECS: u64 = 3600;

pub struct DevTarget {
    dir: PathBuf,
    /// The eu-west edge.
    pub edge: String,
    /// Every region's edge.
    pub edges: Vec<String>,
    /// Region → its edge.
    pub edge_by_region: std::collections::BTreeMap<String, String>,
    pub tenant: u64,
    pub routers: Vec<String>,
    pub cluster_secret: String,
    pub etcd: Vec<String>,
    /// The control-plane replicas' admin API endpoints.
    pub admin: Vec<String>,
    /// The operator's certificate when the deployment runs mutual TLS.
    pub tls: cellmesh_proto::tls::TlsConfig,
    /// The demo conversations, in dev.json order.
    pub conversations: Vec<u64>,
    key: TokenKey,
    /// `authorization` values by tenant, user and device, minted once each.
    tokens: Mutex<HashMap<(u64, u64, String), MetadataValue<Ascii>>>,
}

fn read(dir: &Path, name: &str) -> anyhow::Result<Value> {
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read {} (is `cellmesh dev` running?)",
            path.display()
        )
    })?;
    Ok(serde_json::from_str(&text)?)
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}

/// Sends `sig` to a process of the dev deployment.
pub fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) on a process of the dev deployment under drill.
    unsafe { libc::kill(pid, sig) };
}

impl DevTarget {
    /// dev.json as it is now (the supervisor rewrites it when a child
    /// restarts).
    pub fn info(&self) -> anyhow::Result<Value> {
        read(&self.dir, "dev.json")
    }

    /// The deployment `cellmesh dev` runs in `dir`. When it runs with
    /// `--tls`, this process takes the operator's certificate for its calls
    /// to routers and cells (the edges take plaintext clients).
    pub fn load(dir: &Path) -> anyhow::Result<Self> {
        let info = read(dir, "dev.json")?;
        let secrets = read(dir, "secrets.json")?;
        let tls: cellmesh_proto::tls::TlsConfig =
            serde_json::from_value(info["tls"].clone()).unwrap_or_default();
        cellmesh_proto::tls::install(&tls).map_err(anyhow::Error::msg)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            edge: info["edges"]["eu-west"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            edges: info["edges"]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(_, url)| url.as_str().map(str::to_string))
                .collect(),
            edge_by_region: info["edges"]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(region, url)| Some((region.clone(), url.as_str()?.to_string())))
                .collect(),
            tenant: info["demo"]["tenant"].as_u64().unwrap_or(1),
            routers: strings(&info["routers"]),
            cluster_secret: info["cluster_secret"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            etcd: strings(&info["etcd"]),
            admin: strings(&info["control_plane"]["admin"]),
            tls,
            conversations: info["demo"]["conversations"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["id"].as_u64())
                .collect(),
            key: TokenKey::new(secrets["token"].as_str().unwrap_or_default()),
            tokens: Mutex::new(HashMap::new()),
        })
    }

    /// Fills a tool's routing flags from the deployment: routers and
    /// secret, and its etcd unless the command line named one.
    pub fn fill_routing(
        &self,
        routers: &mut Vec<String>,
        secret: &mut String,
        etcd: &mut Vec<String>,
    ) {
        routers.clone_from(&self.routers);
        secret.clone_from(&self.cluster_secret);
        if etcd.is_empty() {
            etcd.clone_from(&self.etcd);
        }
    }

    /// The deployment's data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn secret(&self) -> ClusterSecret {
        ClusterSecret::new(&self.cluster_secret)
    }

    /// A route client of the deployment's routers.
    pub async fn routes(&self) -> anyhow::Result<RouteClient> {
        RouteClient::connect(self.routers.clone(), self.secret())
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot reach the routers: {}",
                    cellmesh_proto::status::describe(&e)
                )
            })
    }

    /// Places `tenant` on the demo tenant's cell unless the route table
    /// places it already (a neighbour tenant for drills, a second tenant
    /// for benches).
    pub async fn place_beside_demo(&self, tenant: u64) -> anyhow::Result<()> {
        let routes = self.routes().await?;
        if routes.read(|t| t.entry(&Key::tenant(TenantId(tenant))).is_some()) {
            return Ok(());
        }
        let cell = routes
            .read(|t| {
                t.entry(&Key::tenant(TenantId(self.tenant)))
                    .map(|e| e.cell.clone())
            })
            .ok_or_else(|| anyhow::anyhow!("the demo tenant is not placed"))?;
        self.place_on(tenant, &cell).await
    }

    /// Places `tenant` on `cell` unless the route table places it already;
    /// refuses when it places it on another cell.
    pub async fn place_on(&self, tenant: u64, cell: &str) -> anyhow::Result<()> {
        let routes = self.routes().await?;
        match routes.read(|t| {
            t.entry(&Key::tenant(TenantId(tenant)))
                .map(|e| e.cell.clone())
        }) {
            Some(placed) if placed == cell => return Ok(()),
            Some(placed) => anyhow::bail!("tenant {tenant} is placed on {placed}, not {cell}"),
            None => {}
        }
        routes
            .place_tenant(TenantId(tenant), cell)
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "placing tenant {tenant}: {}",
                    cellmesh_proto::status::describe(&e)
                )
            })?;
        Ok(())
    }

    /// `message` as `user` of the demo tenant, with that user's token.
    pub fn request<T>(&self, message: T, user: u64) -> tonic::Request<T> {
        self.request_as(message, user, "tool")
    }

    /// `message` as `user` of the demo tenant on `device`, with a token for
    /// that device.
    pub fn request_as<T>(&self, message: T, user: u64, device: &str) -> tonic::Request<T> {
        self.request_in(self.tenant, message, user, device)
    }

    /// A token for `user` of `tenant` on `device` (for clients that carry
    /// their own, such as file uploads).
    pub fn token(&self, tenant: u64, user: u64, device: &str) -> String {
        self.key.issue(&Claims {
            tenant: TenantId(tenant),
            user: UserId(user),
            device: device.into(),
            exp: now_secs() + TOKEN_TTL_SECS,
            ..Default::default()
        })
    }

    /// `message` as `user` of `tenant` on `device`, with a token for that
    /// device.
    pub fn request_in<T>(
        &self,
        tenant: u64,
        message: T,
        user: u64,
        device: &str,
    ) -> tonic::Request<T> {
        let value = self
            .tokens
            .lock()
            .expect("token cache")
            .entry((tenant, user, device.to_string()))
            .or_insert_with(|| {
                format!("Bearer {}", self.token(tenant, user, device))
                    .parse()
                    .expect("tokens are header-safe")
            })
            .clone();
        let mut request = tonic::Request::new(message);
        request.metadata_mut().insert("authorization", value);
        request
    }

    /// Whether the deployment's queue is the mock Kafka cluster of
    /// `cellmesh dev --kafka mock` (its brokers can be taken down).
    pub fn kafka_mock(&self) -> bool {
        self.info().is_ok_and(|info| info["kafka"] == "mock")
    }

    /// The current process id of the dev child `name` (e.g.
    /// `router-eu-west`, `control-plane-1`).
    pub fn pid(&self, name: &str) -> anyhow::Result<i32> {
        let info = self.info()?;
        info["processes"][name]
            .as_i64()
            .map(|p| p as i32)
            .with_context(|| format!("no process {name} in dev.json"))
    }

    /// The cells' current process ids (dev.json is rewritten when the
    /// supervisor restarts one), by cell id.
    pub fn cell_pids(&self) -> anyhow::Result<Vec<(String, i32)>> {
        let info = self.info()?;
        let processes = &info["processes"];
        Ok(info["cells"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(id, _)| {
                let pid = processes[id.replace('/', "-")].as_i64()?;
                Some((id.clone(), pid as i32))
            })
            .collect())
    }
}
