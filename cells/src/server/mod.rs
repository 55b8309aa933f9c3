//! Running a cell: open storage, build the services, serve gRPC until told to
//! stop, then drain and close storage cleanly.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::clock::{Clock, SystemClock};
use crate::config::QueueBackend;
use crate::config::{CellConfig, ConfigError};
use crate::error::CellError;
use crate::homes::Homes;
use crate::homes::StaticHomes;
use crate::hwm::HighWaterMarks;
use crate::message::MessageService;
use crate::ownership::{OwnAll, Ownership};
use crate::queue::{EventQueue, QueueError, embedded::EmbeddedQueue};
use crate::routed::Routed;
use crate::storage::{StorageError, Store};
use crate::sync::{Hub, SyncService};
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_route_client::client::RouteClient;

/// File in the data directory holding the address the cell listens on, for
/// supervisors and scripts that started it on port 0; written once the cell
/// serves (and, when routed, is registered in the route table).
pub const ADDR_FILE: &str = "cell.addr";

mod apis;
mod background;
mod open;
mod register;

use background::Background;
use open::{Opened, open};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot open storage: {0}")]
    Storage(#[from] StorageError),
    #[error("cannot start the message service: {0}")]
    Service(#[from] CellError),
    #[error("cannot open the event queue: {0}")]
    Queue(#[from] QueueError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("grpc: {0}")]
    Grpc(String),
    #[error("route table: {0}")]
    Routing(String),
    #[error("cannot serve metrics: {0}")]
    Metrics(String),
    #[error("cannot open the cold tier: {0}")]
    ColdTier(crate::cold::BucketError),
    #[error("tls: {0}")]
    Tls(String),
    #[error("cannot open the attachments store: {0}")]
    Attachments(crate::cold::BucketError),
    #[error("cannot open the backup store: {0}")]
    Backups(String),
}

/// How a cell learns what it owns and where its users live.
pub struct Placement {
    pub ownership: Arc<dyn Ownership>,
    pub homes: Arc<dyn Homes>,
    /// Set when the cell follows a route table: it registers there at start.
    pub routes: Option<RouteClient>,
    /// Failover high-water marks (the routed ownership fences on them).
    pub marks: Arc<HighWaterMarks>,
}

impl Placement {
    /// Owns every conversation; remote homes from `homes.remote`.
    pub fn standalone(config: &CellConfig) -> Self {
        Self {
            ownership: Arc::new(OwnAll),
            homes: Arc::new(StaticHomes::from_config(&config.homes)),
            routes: None,
            marks: Default::default(),
        }
    }

    /// Follows the route table of `routing.routers`.
    pub async fn routed(config: &CellConfig) -> Result<Self, StartError> {
        // The route table is dialled with this cell's certificate.
        cellmesh_proto::tls::install(&config.tls).map_err(StartError::Tls)?;
        let client = RouteClient::connect(
            config.routing.routers.clone(),
            ClusterSecret::new(&config.routing.cluster_secret),
        )
        .await
        .map_err(|e| StartError::Routing(e.message().to_string()))?;
        let margin = cellmesh_route_client::table::safety_margin(
            u64::from(config.rate_limit.conversation_per_sec),
            u64::from(config.rate_limit.conversation_burst),
            config.routing.checkpoint_interval_ms,
        );
        let lease = (config.routing.owner_lease_ms > 0)
            .then(|| Duration::from_millis(config.routing.owner_lease_ms));
        let marks = Arc::new(HighWaterMarks::default());
        let routed = Arc::new(Routed::new(
            client.clone(),
            config.cell_id.clone(),
            margin,
            lease,
            marks.clone(),
        ));
        tokio::spawn(Routed::keep_lease(Arc::downgrade(&routed)));
        tokio::spawn(Routed::watch_takeovers(Arc::downgrade(&routed)));
        Ok(Self {
            ownership: routed.clone(),
            homes: routed,
            routes: Some(client),
            marks,
        })
    }

    /// Routed when routers are configured, else standalone.
    pub async fn from_config(config: &CellConfig) -> Result<Self, StartError> {
        if config.routing.routers.is_empty() {
            Ok(Self::standalone(config))
        } else {
            Self::routed(config).await
        }
    }
}

/// A cell serving in the background.
pub struct RunningCell {
    pub addr: SocketAddr,
    /// The local file store's listener of signed URLs (none with S3 or
    /// attachments off).
    pub files_addr: Option<SocketAddr>,
    pub service: Arc<MessageService>,
    pub sync: Arc<SyncService>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), StartError>>,
    /// The cell's lease registration in etcd, held while it serves.
    _registration: Option<cellmesh_coord::Lease>,
}

impl RunningCell {
    /// Stops serving, waits for in-flight requests, closes storage.
    pub async fn shutdown(mut self) -> Result<(), StartError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task
            .await
            .map_err(|e| StartError::Grpc(e.to_string()))?
    }

    /// Waits until the cell stops on its own (its shutdown signal fired).
    pub async fn wait(self) -> Result<(), StartError> {
        self.task
            .await
            .map_err(|e| StartError::Grpc(e.to_string()))?
    }
}

/// The server's shutdown signal. Once stopped, it starts the server's
/// graceful shutdown (no new connections or requests; requests executing
/// finish), waits for the pipeline to apply and forward what those and
/// earlier writes left (pushes still reach online devices meanwhile), and
/// only then ends the live sync and delivery streams, which would
/// otherwise hold shutdown open.
fn stop_gracefully(
    stop: oneshot::Receiver<()>,
    drain: crate::pipeline::drain::Drain,
    limit: Duration,
    hub: Arc<Hub>,
    closing: tokio::sync::watch::Sender<bool>,
) -> (impl Future<Output = ()> + Send + 'static, JoinHandle<()>) {
    let (begin_tx, begin_rx) = oneshot::channel::<()>();
    let draining = tokio::spawn(async move {
        // A dropped handle stops the cell too.
        let _ = stop.await;
        let _ = begin_tx.send(());
        if !limit.is_zero() {
            let drained = drain
                .run(DRAIN_SETTLE, DRAIN_PATIENCE.min(limit), limit)
                .await;
            if drained.complete {
                tracing::info!("stopping: everything acknowledged is applied and forwarded");
            } else {
                tracing::warn!(
                    unapplied = drained.unapplied,
                    forwards_waiting = drained.forwards_waiting,
                    "stopping before the pipeline drained; the rest waits for a restart"
                );
            }
        }
        hub.close();
        let _ = closing.send(true);
    });
    let begun = async move {
        let _ = begin_rx.await;
    };
    (begun, draining)
}

/// A drain ends once nothing new was written this long.
const DRAIN_SETTLE: Duration = Duration::from_millis(50);
/// A drain gives up once nothing progressed this long.
const DRAIN_PATIENCE: Duration = Duration::from_secs(1);

/// Runs a cell until `shutdown` resolves.
pub async fn run(
    config: CellConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let placement = Placement::from_config(&config).await?;
    let cell = start_placed(config, placement, Arc::new(SystemClock)).await?;
    let RunningCell {
        stop,
        task,
        _registration: registration,
        ..
    } = cell;
    tokio::spawn(async move {
        shutdown.await;
        if let Some(stop) = stop {
            let _ = stop.send(());
        }
    });
    let result = task.await.map_err(|e| StartError::Grpc(e.to_string()))?;
    drop(registration);
    result
}

/// Starts a cell with `ownership` and the static homes of its config.
pub async fn start(
    config: CellConfig,
    ownership: Arc<dyn Ownership>,
    clock: Arc<dyn Clock>,
) -> Result<RunningCell, StartError> {
    let placement = Placement {
        ownership,
        ..Placement::standalone(&config)
    };
    start_placed(config, placement, clock).await
}

/// Starts a cell and returns once it accepts connections (and, when it
/// follows a route table, is registered there).
pub async fn start_placed(
    config: CellConfig,
    placement: Placement,
    clock: Arc<dyn Clock>,
) -> Result<RunningCell, StartError> {
    let Placement {
        ownership,
        homes,
        routes,
        marks,
    } = placement;
    let Opened {
        config,
        store,
        coordination,
        service,
        search,
        files,
        hub,
        sync,
    } = open(config, ownership, homes.clone(), &marks, clock.clone()).await?;
    let files_addr = files.as_ref().map(|(a, _)| *a);
    let cluster_version = match &routes {
        Some(routes) => Some(routes.cluster_version(CLUSTER_VERSION_WAIT).await),
        None => None,
    };
    let queue = open_queue(&config, &store, cluster_version).await?;
    let pipeline = crate::pipeline::spawn(
        &config,
        store.clone(),
        queue.clone(),
        hub.clone(),
        clock.clone(),
        homes,
    );
    let mut workers = pipeline.workers;
    if let Some(search) = search {
        let group = crate::search::indexer::group(&config.processor_group());
        workers.push(crate::search::indexer::supervised(
            search,
            service.clone(),
            queue,
            group,
        ));
    }
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| StartError::Bind {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr()?;

    crate::metrics::register();
    let metrics = cellmesh_telemetry::admin::serve_configured(&config.metrics_listen)
        .await
        .map_err(StartError::Metrics)?;
    let (closing_tx, closing) = tokio::sync::watch::channel(false);
    let apis = apis::Apis {
        service: service.clone(),
        sync: sync.clone(),
        inbound: pipeline.inbound,
        metrics_address: (metrics.as_ref())
            .map(|(bound, _)| reachable(*bound, &config.routing.advertise))
            .unwrap_or_default(),
        closing,
    };
    let (routes_served, reporter) = apis.routes(&config).await?;
    background::report_storage_failure(reporter, &store);
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let (drain, drain_limit) = (
        pipeline.drain.clone(),
        Duration::from_millis(config.fanout.drain_on_stop_ms),
    );
    let background = Background::spawn(&config, &service, &sync, &hub, clock);
    let (begun, draining) = stop_gracefully(stop_rx, drain, drain_limit, hub.clone(), closing_tx);
    let task = tokio::spawn(async move {
        let served = cellmesh_proto::server::builder()
            .layer(cellmesh_telemetry::server::ServerLayer)
            .add_routes(routes_served)
            .serve_with_incoming_shutdown(cellmesh_proto::server::incoming(listener), begun)
            .await;
        // The drain holds the store: it ends before the store closes.
        let _ = draining.await;
        background.abort();
        if let Some((_, files)) = files {
            files.abort();
        }
        if let Some((_, server)) = metrics {
            server.abort();
        }
        for worker in workers {
            worker.abort();
            let _ = worker.await;
        }
        store.close();
        tracing::info!("cell stopped");
        served.map_err(|e| StartError::Grpc(e.to_string()))
    });
    let registration = match routes {
        Some(routes) => {
            register::register(&config, routes, marks, coordination, &service, addr).await?
        }
        None => None,
    };
    // Written once the cell serves and is registered: whoever waits for
    // the file finds the cell in the route table.
    write_addr_file(&config, addr)?;
    tracing::info!(cell = %config.cell_id, %addr, data_dir = %config.data_dir.display(), "cell serving");
    Ok(RunningCell {
        addr,
        files_addr,
        service,
        sync,
        stop: Some(stop_tx),
        task,
        _registration: registration,
    })
}

/// The deployment's coordination store: etcd when `routing.etcd_endpoints`
/// is set (the cell's lease and its records), else the host-local
/// directory `routing.coordination_dir` (records only), else none.
async fn connect_coordination(
    routing: &crate::config::RoutingConfig,
) -> Result<Option<Arc<dyn cellmesh_coord::Coordination>>, StartError> {
    let failed = |e: cellmesh_coord::CoordError| StartError::Routing(e.to_string());
    if !routing.etcd_endpoints.is_empty() {
        let etcd = cellmesh_coord::etcd::EtcdCoordination::connect(&routing.etcd_endpoints)
            .await
            .map_err(failed)?;
        return Ok(Some(Arc::new(etcd)));
    }
    if !routing.coordination_dir.is_empty() {
        let local = cellmesh_coord::local::LocalCoordination::open(std::path::Path::new(
            &routing.coordination_dir,
        ))
        .map_err(failed)?;
        return Ok(Some(Arc::new(local)));
    }
    Ok(None)
}

/// `bound` as others reach it: a wildcard address takes the host the cell
/// advertises (its gRPC URL), else loopback.
fn reachable(bound: SocketAddr, advertise: &str) -> String {
    if !bound.ip().is_unspecified() {
        return bound.to_string();
    }
    let host = advertise
        .split_once("://")
        .map(|(_, rest)| rest)
        .and_then(|rest| rest.rsplit_once(':'))
        .map(|(host, _)| host)
        .filter(|h| !h.is_empty())
        .unwrap_or("127.0.0.1");
    format!("{host}:{}", bound.port())
}

fn write_addr_file(config: &CellConfig, addr: SocketAddr) -> std::io::Result<()> {
    let path = config.data_dir.join(ADDR_FILE);
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, addr.to_string())?;
    std::fs::rename(tmp, path)
}

/// How long a cell of a cluster being formed waits for its cluster version
/// before it takes the queue of a cluster without one.
const CLUSTER_VERSION_WAIT: Duration = Duration::from_secs(10);

/// The cell's event queue. The embedded one reads the outbox in place only
/// once the cluster version says no process runs a release that could not
/// read a store consumed that way (a standalone cell has no other
/// release beside it); until then it keeps the partitioned log.
async fn open_queue(
    config: &CellConfig,
    store: &Arc<Store>,
    cluster_version: Option<String>,
) -> Result<Arc<dyn EventQueue>, StartError> {
    use crate::config::EmbeddedLog;
    Ok(match config.queue.backend {
        QueueBackend::Embedded => {
            let mut groups = vec![config.processor_group()];
            if config.search.enabled {
                groups.push(crate::search::indexer::group(&config.processor_group()));
            }
            // A store whose outbox was consumed in place stays so: the
            // partitioned log would hand its events out again.
            let consumed_in_place = store.queue_offset(
                &config.processor_group(),
                crate::queue::embedded::OUTBOX_PARTITION,
            )? > 0;
            let outbox = consumed_in_place
                || match config.queue.embedded_log {
                    EmbeddedLog::Outbox => true,
                    EmbeddedLog::Partitioned => false,
                    EmbeddedLog::Auto => cluster_version.is_none_or(|v| {
                        cellmesh_proto::version::enabled(&v, cellmesh_proto::version::OUTBOX_QUEUE)
                    }),
                };
            if outbox {
                Arc::new(EmbeddedQueue::open(store.clone())?.with_groups(groups))
            } else {
                tracing::info!(
                    "the cluster version is below {}: events keep the partitioned log of \
                     earlier releases until a restart after `ctl upgrade finalize`",
                    cellmesh_proto::version::OUTBOX_QUEUE
                );
                Arc::new(
                    crate::queue::partitioned::PartitionedQueue::open(
                        store.clone(),
                        config.queue.partitions,
                    )?
                    .with_groups(groups),
                )
            }
        }
        QueueBackend::Kafka => Arc::new(crate::queue::kafka::KafkaQueue::connect(config).await?),
    })
}
