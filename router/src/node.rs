//! One RoutingService replica: storage, the Raft instance, the RaftPeer
//! server on its own listener and the Routing API server. [`start`] binds
//! both listeners first so port 0 works, then serves until shut down.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cellmesh_proto::raft::v1::raft_peer_server::RaftPeerServer;
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::routing_server::RoutingServer;
use openraft::SnapshotPolicy;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::config::RouterConfig;
use crate::grpc::raft::RaftPeerService;
use crate::grpc::routing::RoutingService;
use crate::network::{MAX_RAFT_MESSAGE, Network};
use crate::storage::{self, RouteStore};
use crate::types::{NodeId, Raft, RouterNode};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] cellmesh_proto::config::ConfigError),
    #[error("cannot bind {what} {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot create data dir {0}: {1}")]
    DataDir(std::path::PathBuf, std::io::Error),
    #[error("storage: {0}")]
    Storage(#[from] crate::types::StorageError),
    #[error("tls: {0}")]
    Tls(String),
    #[error("raft: {0}")]
    Raft(String),
    #[error("cannot serve metrics: {0}")]
    Metrics(String),
}

/// A running replica.
pub struct RunningRouter {
    pub node_id: NodeId,
    pub node: RouterNode,
    pub raft: Raft,
    pub store: Arc<RouteStore>,
    pub api_addr: SocketAddr,
    pub raft_addr: SocketAddr,
    shutdown: Vec<oneshot::Sender<()>>,
    stopping: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
    /// The `/metrics` server, when `metrics_listen` is set.
    metrics: Option<JoinHandle<()>>,
}

pub async fn start(config: RouterConfig) -> Result<RunningRouter, StartError> {
    config.validate()?;
    cellmesh_proto::tls::install(&config.tls).map_err(StartError::Tls)?;
    std::fs::create_dir_all(&config.data_dir)
        .map_err(|e| StartError::DataDir(config.data_dir.clone(), e))?;
    let bind = |what, addr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Bind { what, addr, source })
    };
    let api_listener = bind("api_listen", config.api_listen).await?;
    let raft_listener = bind("raft_listen", config.raft_listen).await?;
    let api_addr = api_listener
        .local_addr()
        .map_err(|source| StartError::Bind {
            what: "api_listen",
            addr: config.api_listen,
            source,
        })?;
    let raft_addr = raft_listener
        .local_addr()
        .map_err(|source| StartError::Bind {
            what: "raft_listen",
            addr: config.raft_listen,
            source,
        })?;
    let or_bound = |advertised: &str, bound: SocketAddr| {
        if advertised.is_empty() {
            format!("http://{bound}")
        } else {
            advertised.to_string()
        }
    };
    let node = RouterNode {
        region: config.region.clone(),
        raft_addr: or_bound(&config.advertise_raft, raft_addr),
        api_addr: or_bound(&config.advertise_api, api_addr),
    };

    let (mut log_store, mut state_machine) =
        storage::open(&config.data_dir, config.raft.watch_history)?;
    seed_if_asked(&config, &mut log_store, &mut state_machine, &node).await?;
    let store = state_machine.store();
    let raft_config = raft_config(&config).map_err(|e| StartError::Raft(e.to_string()))?;
    let secret = ClusterSecret::new(&config.cluster_secret);
    let network = Network::new(secret.clone(), config.links.clone());
    let raft = Raft::new(
        config.node_id,
        Arc::new(raft_config),
        network,
        log_store,
        state_machine,
    )
    .await
    .map_err(|e| StartError::Raft(e.to_string()))?;

    let mut shutdown = Vec::new();
    let mut servers = Vec::new();
    let (stopping, _) = watch::channel(false);
    let (tx, task) = serve_raft_peers(raft.clone(), secret.clone(), raft_listener);
    shutdown.push(tx);
    servers.push(task);
    let routing = RoutingService::new(
        raft.clone(),
        &store,
        stopping.subscribe(),
        config.node_id,
        node.clone(),
        secret.clone(),
    );
    let (tx, task) = serve_routing(routing, secret.clone(), api_listener).await?;
    shutdown.push(tx);
    servers.push(task);

    let metrics = cellmesh_telemetry::admin::serve_configured(&config.metrics_listen)
        .await
        .map_err(StartError::Metrics)?
        .map(|(_, task)| task);
    tokio::spawn(crate::metrics::follow(raft.clone()));
    let running = RunningRouter {
        node_id: config.node_id,
        node,
        raft,
        store,
        api_addr,
        raft_addr,
        shutdown,
        stopping,
        servers,
        metrics,
    };
    if config.cluster.bootstrap {
        let members = config
            .cluster
            .members
            .iter()
            .map(|m| {
                (
                    m.node_id,
                    RouterNode {
                        region: m.region.clone(),
                        raft_addr: m.raft_addr.clone(),
                        api_addr: m.api_addr.clone(),
                    },
                )
            })
            .collect();
        running.initialize(members).await?;
    }
    tracing::info!(node = config.node_id, api = %api_addr, raft = %raft_addr, "router replica started");
    Ok(running)
}

/// Seeds an empty replica from `cluster.restore_from`, when set.
async fn seed_if_asked(
    config: &RouterConfig,
    log: &mut storage::LogStore,
    state: &mut storage::StateMachine,
    node: &RouterNode,
) -> Result<(), StartError> {
    let path = &config.cluster.restore_from;
    if path.is_empty() || state.store().applied_index() > 0 {
        return Ok(());
    }
    let data = std::fs::read(path)
        .map_err(|e| StartError::Raft(format!("route-table backup {path}: {e}")))?;
    let applied = storage::seed(log, state, data, config.node_id, node.clone()).await?;
    tracing::info!(applied, from = %path, "seeded from a route-table backup");
    Ok(())
}

/// The Raft settings of `config`, checked.
fn raft_config(config: &RouterConfig) -> Result<openraft::Config, Box<openraft::ConfigError>> {
    openraft::Config {
        cluster_name: "cellmesh-routing".into(),
        heartbeat_interval: config.raft.heartbeat_ms,
        election_timeout_min: config.raft.election_timeout_min_ms,
        election_timeout_max: config.raft.election_timeout_max_ms,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.raft.snapshot_every),
        max_in_snapshot_log_to_keep: config.raft.keep_logs_after_snapshot,
        install_snapshot_timeout: 10_000,
        ..Default::default()
    }
    .validate()
    .map_err(Box::new)
}

/// The Raft peer service on `listener`: the sender that stops it, and its
/// task.
fn serve_raft_peers(
    raft: Raft,
    secret: ClusterSecret,
    listener: TcpListener,
) -> (oneshot::Sender<()>, JoinHandle<()>) {
    let peer = RaftPeerServer::new(RaftPeerService { raft })
        .max_decoding_message_size(MAX_RAFT_MESSAGE)
        .max_encoding_message_size(MAX_RAFT_MESSAGE);
    let peer = tonic_interceptor(peer, secret);
    let (tx, rx) = oneshot::channel();
    let task = tokio::spawn(async move {
        let result = cellmesh_proto::server::builder()
            .layer(cellmesh_telemetry::server::ServerLayer)
            .add_service(peer)
            .serve_with_incoming_shutdown(cellmesh_proto::server::incoming(listener), async {
                let _ = rx.await;
            })
            .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "raft peer server stopped");
        }
    });
    (tx, task)
}

/// The Routing API (with health and reflection) on `listener`: the sender
/// that stops it, and its task.
async fn serve_routing(
    routing: RoutingService,
    secret: ClusterSecret,
    listener: TcpListener,
) -> Result<(oneshot::Sender<()>, JoinHandle<()>), StartError> {
    let routing = tonic_interceptor(RoutingServer::new(routing), secret);
    let std = cellmesh_proto::server::standard_services::<RoutingServer<RoutingService>>(&[])
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;
    let (tx, rx) = oneshot::channel();
    let task = tokio::spawn(async move {
        let result = cellmesh_proto::server::builder()
            .layer(cellmesh_telemetry::server::ServerLayer)
            .add_service(std.health)
            .add_service(std.reflection)
            .add_service(std.reflection_v1alpha)
            .add_service(routing)
            .serve_with_incoming_shutdown(cellmesh_proto::server::incoming(listener), async {
                let _ = rx.await;
            })
            .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "routing server stopped");
        }
    });
    Ok((tx, task))
}

fn tonic_interceptor<S>(
    service: S,
    secret: ClusterSecret,
) -> tonic::service::interceptor::InterceptedService<S, impl tonic::service::Interceptor + Clone> {
    tonic::service::interceptor::InterceptedService::new(service, move |r| secret.check(r))
}

/// A cluster this release forms starts at its cluster version: no earlier
/// release ever ran in it, so nothing needs to wait for a finalize. Written
/// by whichever replica leads first; the others see it applied.
fn start_at_this_release(raft: Raft, store: std::sync::Weak<RouteStore>) {
    use crate::table::Command;
    tokio::spawn(async move {
        let command = Command::SetClusterVersion {
            version: cellmesh_proto::version::BINARY.into(),
        };
        loop {
            let Some(live) = store.upgrade() else { return };
            if !live.read(|t| t.cluster_version.is_empty()) {
                return;
            }
            drop(live);
            match raft
                .client_write(crate::types::Commands(vec![command.clone()]))
                .await
            {
                Ok(_) => return,
                Err(openraft::error::RaftError::Fatal(_)) => return,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
}

impl RunningRouter {
    /// Forms a new cluster with these members. A replica that already has
    /// state ignores it.
    pub async fn initialize(
        &self,
        members: BTreeMap<NodeId, RouterNode>,
    ) -> Result<(), StartError> {
        match self.raft.initialize(members).await {
            Ok(()) => {
                start_at_this_release(self.raft.clone(), Arc::downgrade(&self.store));
                Ok(())
            }
            Err(openraft::error::RaftError::APIError(
                openraft::error::InitializeError::NotAllowed(_),
            )) => Ok(()),
            Err(e) => Err(StartError::Raft(e.to_string())),
        }
    }

    pub fn api_endpoint(&self) -> String {
        format!("http://{}", self.api_addr)
    }

    /// Stops serving, shuts Raft down and flushes storage's memtables, so
    /// that a restart replays no log (storage stays).
    pub async fn stop(mut self) {
        self.stopping.send_replace(true);
        for tx in self.shutdown.drain(..) {
            let _ = tx.send(());
        }
        let _ = self.raft.shutdown().await;
        if let Some(metrics) = self.metrics.take() {
            metrics.abort();
        }
        for s in self.servers.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), s).await;
        }
        let store = self.store.clone();
        let _ = tokio::task::spawn_blocking(move || store.close()).await;
    }
}
