//! Starting a `cellmesh dev` deployment's processes: the cross-region
//! fault proxies, then each role's configs written from one [`Plan`] (the
//! ports, secrets, TLS, telemetry, etcd and Kafka every process shares)
//! and its processes handed to the supervisor.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use cellmesh_cell::CellConfig;
use cellmesh_cell::config::{QueueBackend, ReplicationMode};
use cellmesh_chaos::proxy::FaultProxy;
use cellmesh_control_plane::server::{ControlPlaneConfig, CoordinationBackend};
use cellmesh_edge::EdgeConfig;
use cellmesh_proto::tls::{Peer, Role, TlsConfig};
use cellmesh_router::config::{MemberConfig, RouterConfig};
use cellmesh_telemetry::trace::TraceConfig;

use super::kafka::MockKafka;
use super::supervisor::{Spec, Supervisor};
use super::topology::{CELLS_PER_REGION, Link, REGIONS, Topology};
use super::{DevArgs, Secrets, pki, write_config};

/// The control-plane replicas `cellmesh dev` runs.
pub(super) const CONTROL_PLANE_REPLICAS: usize = 2;

/// One fault proxy per cross-region path, each adding half of `latency`.
pub(super) async fn start_proxies(
    topo: &Topology,
    latency: Duration,
) -> anyhow::Result<(Vec<Link>, Vec<FaultProxy>)> {
    let one_way = latency / 2;
    let mut proxies = Vec::new();
    let links = topo.links();
    for link in &links {
        let upstream = link
            .target
            .trim_start_matches("http://")
            .parse()
            .context("link target")?;
        let proxy = FaultProxy::start(format!("127.0.0.1:{}", link.port).parse()?, upstream)
            .await
            .with_context(|| {
                format!(
                    "cannot listen on port {} (is another `cellmesh dev` running?)",
                    link.port
                )
            })?;
        proxy.set_latency(one_way, one_way / 10);
        proxies.push(proxy);
    }

    Ok((links, proxies))
}

/// What every process's config is made from.
pub(super) struct Plan<'a> {
    pub args: &'a DevArgs,
    pub configs: PathBuf,
    pub secrets: Secrets,
    pub pki: Option<pki::Pki>,
    pub topo: Topology,
    pub telemetry: TraceConfig,
    pub etcd_endpoints: Vec<String>,
    /// The cells' Kafka bootstrap servers (none: the embedded queue).
    pub brokers: Option<String>,
}

impl Plan<'_> {
    /// The TLS config of the process `id` in `role` (none without `--tls`).
    pub fn tls(&self, role: Role, id: &str) -> anyhow::Result<TlsConfig> {
        match &self.pki {
            Some(pki) => pki.issue(&Peer::new(role, id)),
            None => Ok(TlsConfig::default()),
        }
    }

    /// One router replica per region: one Raft group across the regions.
    pub fn start_routers(&self, sup: &mut Supervisor) -> anyhow::Result<()> {
        let members: Vec<MemberConfig> = (0..REGIONS.len())
            .map(|r| MemberConfig {
                node_id: r as u64 + 1,
                region: REGIONS[r].into(),
                raft_addr: self.topo.router_raft(r),
                api_addr: self.topo.router_api(r),
            })
            .collect();
        for (r, region) in REGIONS.iter().enumerate() {
            let mut config = RouterConfig {
                node_id: r as u64 + 1,
                region: region.to_string(),
                data_dir: self.args.data_dir.join(format!("router-{region}")),
                api_listen: format!("127.0.0.1:{}", self.topo.router_api_port(r)).parse()?,
                raft_listen: format!("127.0.0.1:{}", self.topo.router_raft_port(r)).parse()?,
                cluster_secret: self.secrets.cluster.clone(),
                links: self.topo.links_from(r),
                metrics_listen: format!("127.0.0.1:{}", self.topo.router_metrics_port(r)),
                telemetry: self.telemetry.clone(),
                ..RouterConfig::default()
            };
            config.cluster.bootstrap = r == 0;
            config.cluster.members = members.clone();
            config.tls = self.tls(Role::Router, &(r + 1).to_string())?;
            config.insecure_plaintext = !self.args.tls;
            let path = write_config(&self.configs, &format!("router-{region}"), &config)?;
            sup.start(Spec {
                name: format!("router-{region}"),
                args: vec!["router".into(), "--config".into(), path],
            })?;
        }
        Ok(())
    }

    /// Every region's cells; with the mock Kafka, their topics first.
    pub fn start_cells(
        &self,
        sup: &mut Supervisor,
        mock_kafka: Option<&MockKafka>,
    ) -> anyhow::Result<()> {
        for (r, region) in REGIONS.iter().enumerate() {
            for c in 0..CELLS_PER_REGION {
                let id = self.topo.cell_id(r, c);
                let mut config = CellConfig {
                    cell_id: id.clone(),
                    listen: format!("127.0.0.1:{}", self.topo.cell_port(r, c)).parse()?,
                    data_dir: self.args.data_dir.join(id.replace('/', "-")),
                    instance_id: (r * CELLS_PER_REGION + c) as u16 + 1,
                    metrics_listen: format!("127.0.0.1:{}", self.topo.cell_metrics_port(r, c)),
                    telemetry: self.telemetry.clone(),
                    ..CellConfig::default()
                };
                config.routing.routers = self.topo.routers_from(r);
                config.routing.cluster_secret = self.secrets.cluster.clone();
                config.routing.links = self.topo.links_from(r);
                config.routing.etcd_endpoints = self.etcd_endpoints.clone();
                // The control plane's records (without etcd): retention's deletions.
                config.routing.coordination_dir = self
                    .args
                    .data_dir
                    .join("coordination")
                    .display()
                    .to_string();
                // One directory stands for the object store all cells share, so
                // moves hand cold history over by its manifest.
                config.tiering.local_dir = self.args.data_dir.join("cold");
                // Files live in their region's store (one directory per region,
                // shared by its cells, each serving it on its own signed URLs):
                // a move within the region hands over refs only.
                config.attachments.local_dir = self.args.data_dir.join("files").join(REGIONS[r]);
                for other in REGIONS.iter().filter(|o| **o != REGIONS[r]) {
                    let files = cellmesh_cell::attachments::RegionFiles {
                        local_dir: self.args.data_dir.join("files").join(other),
                        ..Default::default()
                    };
                    config.attachments.regions.insert(other.to_string(), files);
                }
                config.attachments.http_listen =
                    format!("127.0.0.1:{}", self.topo.cell_files_port(r, c));
                if let Some(n) = self.args.hot_messages {
                    config.tiering.hot_messages_per_conversation = n;
                    config.tiering.interval_ms = 1_000;
                }
                config.replication.mode = self.args.replication;
                config.tls = self.tls(Role::Cell, &id)?;
                config.insecure_plaintext = !self.args.tls;
                let other = match self.args.replication {
                    ReplicationMode::Async => ReplicationMode::Sync,
                    ReplicationMode::Sync => ReplicationMode::Async,
                };
                for tenant in &self.args.other_mode_tenants {
                    config.replication.tenants.insert(tenant.to_string(), other);
                }
                if let Some(brokers) = &self.brokers {
                    config.queue.backend = QueueBackend::Kafka;
                    config.queue.kafka.brokers = brokers.clone();
                    config.queue.kafka.topic = format!("cellmesh-{}", id.replace('/', "-"));
                    if let Some(mock) = mock_kafka {
                        config.queue.kafka.session_timeout_ms = 6_000;
                        mock.create_topic(&config.queue.kafka.topic, config.queue.partitions)?;
                    }
                }
                let path = write_config(&self.configs, &id.replace('/', "-"), &config)?;
                sup.start(Spec {
                    name: id.replace('/', "-"),
                    args: vec!["cell".into(), "--config".into(), path],
                })?;
            }
            let _ = region;
        }
        Ok(())
    }

    /// The control-plane replicas; their console and admin URLs.
    pub fn start_control_planes(
        &self,
        sup: &mut Supervisor,
        traces_url: &Option<String>,
    ) -> anyhow::Result<(Vec<String>, Vec<String>)> {
        // Two control-plane replicas: they elect the active one in etcd with
        // `--etcd`, else through lock files in the data directory.
        let mut consoles = Vec::new();
        let mut admins = Vec::new();
        for i in 0..CONTROL_PLANE_REPLICAS {
            let mut config = ControlPlaneConfig {
                routers: self.topo.routers_from(0),
                cluster_secret: self.secrets.cluster.clone(),
                ..ControlPlaneConfig::default()
            };
            config.coordination.name = format!("control-plane-{}", i + 1);
            // Both replicas live in eu-west: they probe other regions' cells
            // across the same links as everything else.
            config.links = self.topo.links_from(0);
            config.console_listen = format!("127.0.0.1:{}", self.topo.console_port(i));
            consoles.push(format!("http://{}/", config.console_listen));
            config.admin_listen = format!("127.0.0.1:{}", self.topo.admin_port(i));
            admins.push(format!("http://{}", config.admin_listen));
            config.metrics_listen =
                format!("127.0.0.1:{}", self.topo.control_plane_metrics_port(i));
            config.telemetry = self.telemetry.clone();
            config.traces_url = traces_url.clone().unwrap_or_default();
            config.tls = self.tls(Role::ControlPlane, &(i + 1).to_string())?;
            config.insecure_plaintext = !self.args.tls;
            if self.args.etcd {
                config.coordination.backend = CoordinationBackend::Etcd;
                config.coordination.etcd_endpoints = self.etcd_endpoints.clone();
            } else {
                config.coordination.backend = CoordinationBackend::Local;
                config.coordination.dir = self
                    .args
                    .data_dir
                    .join("coordination")
                    .display()
                    .to_string();
            }
            let path = write_config(&self.configs, &format!("control-plane-{}", i + 1), &config)?;
            sup.start(Spec {
                name: format!("control-plane-{}", i + 1),
                args: vec!["control-plane".into(), "--config".into(), path],
            })?;
        }
        Ok((consoles, admins))
    }

    /// One edge per region; their URLs by region.
    pub fn start_edges(&self, sup: &mut Supervisor) -> anyhow::Result<BTreeMap<String, String>> {
        let mut edges = BTreeMap::new();
        for (r, region) in REGIONS.iter().enumerate() {
            let config = EdgeConfig {
                listen: format!("127.0.0.1:{}", self.topo.edge_port(r)).parse()?,
                region: region.to_string(),
                routers: self.topo.routers_from(r),
                cluster_secret: self.secrets.cluster.clone(),
                token_secret: self.secrets.token.clone(),
                links: self.topo.links_from(r),
                metrics_listen: format!("127.0.0.1:{}", self.topo.edge_metrics_port(r)),
                telemetry: self.telemetry.clone(),
                tls: self.tls(Role::Edge, region)?,
                insecure_plaintext: !self.args.tls,
                // The web chat app at every edge's own origin.
                web_app: true,
                ..EdgeConfig::default()
            };
            let path = write_config(&self.configs, &format!("edge-{region}"), &config)?;
            sup.start(Spec {
                name: format!("edge-{region}"),
                args: vec!["edge".into(), "--config".into(), path],
            })?;
            edges.insert(region.to_string(), self.topo.edge(r));
        }
        Ok(edges)
    }
}
