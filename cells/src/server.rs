//! Running a cell: open storage, build the services, serve gRPC until told to
//! stop, then drain and close storage cleanly.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cellmesh_proto::server::standard_services;
use cellmesh_proto::v1::attachments_server::AttachmentsServer;
use cellmesh_proto::v1::backups_server::BackupsServer;
use cellmesh_proto::v1::cell_peer_server::CellPeerServer;
use cellmesh_proto::v1::messaging_server::MessagingServer;
use cellmesh_proto::v1::sync_server::SyncServer;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::clock::{Clock, SystemClock};
use crate::config::QueueBackend;
use crate::config::{CellConfig, ConfigError, REQUEST_OVERHEAD_BYTES};
use crate::error::CellError;
use crate::grpc::{AttachmentsApi, BackupsApi, MessagingApi, PeerApi, SyncApi};
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
use cellmesh_route_client::commands::register_cell;
use tonic::service::interceptor::InterceptedService;

/// File in the data directory holding the address the cell listens on, for
/// supervisors and scripts that started it on port 0; written once the cell
/// serves (and, when routed, is registered in the route table).
pub const ADDR_FILE: &str = "cell.addr";

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
    ColdTier(String),
    #[error("tls: {0}")]
    Tls(String),
    #[error("cannot open the attachments store: {0}")]
    Attachments(String),
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
    config.validate()?;
    cellmesh_proto::tls::install(&config.tls).map_err(StartError::Tls)?;
    std::fs::create_dir_all(&config.data_dir)?;
    let store = Store::open(&config.data_dir.join("db"), &config.storage)?;
    marks.attach(&store);
    store
        .failpoints()
        .clone()
        .watch(config.data_dir.join("failpoints"));
    let config = Arc::new(config);
    let replicator = Arc::new(crate::replication::Replicator::start(
        &config,
        homes.clone(),
        store.clone(),
    ));
    let coordination = connect_coordination(&config.routing).await?;
    let cold = match config.tiering.enabled {
        true => Some(Arc::new(
            crate::cold::ColdTier::open(
                &config.tiering,
                &config.data_dir,
                crate::cold::journal::Journal::new(coordination.clone(), &config.cell_id),
            )
            .map_err(StartError::ColdTier)?,
        )),
        false => None,
    };
    // A standalone cell (no region in its id) keeps its files as "local".
    let region = match config.cell_id.split_once('/') {
        Some((region, _)) if !region.is_empty() => region,
        _ => "local",
    };
    let attachments =
        crate::attachments::Attachments::open(&config.attachments, &config.data_dir, region)
            .map_err(StartError::Attachments)?;
    let files = match &attachments {
        Some(a) => a.serve(clock.clone()).await?,
        None => None,
    };
    let files_addr = files.as_ref().map(|(a, _)| *a);
    let search = (config.search.enabled).then(|| {
        Arc::new(crate::search::Search::new(
            &config.data_dir,
            config.search.clone(),
        ))
    });
    let service = Arc::new(
        MessageService::new(
            store.clone(),
            config.clone(),
            ownership,
            clock.clone(),
            replicator,
            marks.clone(),
        )?
        .with_cold(cold)
        .with_attachments(attachments)
        .with_search(search.clone()),
    );
    let hub = Arc::new(Hub::new(
        config.sync.presence_window_secs * 1000,
        config.sync.max_streams_per_user as usize,
    ));
    let sync = Arc::new(SyncService::new(
        store.clone(),
        hub.clone(),
        service.clone(),
        config.clone(),
        clock.clone(),
        homes.clone(),
    ));
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
        let service = service.clone();
        workers.push(crate::pipeline::supervise("search indexer", move || {
            let (search, service, queue, group) = (
                search.clone(),
                service.clone(),
                queue.clone(),
                group.clone(),
            );
            crate::search::indexer::run(search, service, queue, group)
        }));
    }
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| StartError::Bind {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr()?;

    let standard = standard_services::<MessagingServer<MessagingApi>>(&[
        <AttachmentsServer<AttachmentsApi> as tonic::server::NamedService>::NAME,
        <BackupsServer<BackupsApi> as tonic::server::NamedService>::NAME,
        <SyncServer<SyncApi> as tonic::server::NamedService>::NAME,
        <CellPeerServer<PeerApi> as tonic::server::NamedService>::NAME,
    ])
    .await
    .map_err(|e| StartError::Grpc(e.to_string()))?;
    // A store that failed a write refuses every later one: say so to
    // probes, so that the control plane fails this cell over.
    tokio::spawn({
        let (reporter, store) = (standard.reporter.clone(), Arc::downgrade(&store));
        async move {
            while let Some(store) = store.upgrade() {
                if let Some(reason) = store.failed() {
                    tracing::error!(%reason, "storage failed: reporting NOT_SERVING");
                    cellmesh_proto::server::report_not_serving(&reporter).await;
                    return;
                }
                drop(store);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
    let max_message = config.limits.max_body_bytes + REQUEST_OVERHEAD_BYTES;
    let secret = ClusterSecret::new(&config.routing.cluster_secret);
    let guard = |secret: ClusterSecret| move |r| secret.check(r);
    let messaging = InterceptedService::new(
        MessagingServer::new(MessagingApi::new(service.clone()))
            .max_decoding_message_size(max_message),
        guard(secret.clone()),
    );
    standard.reporter.set_serving::<SyncServer<SyncApi>>().await;
    let attachments_api = InterceptedService::new(
        AttachmentsServer::new(AttachmentsApi::new(service.clone())),
        guard(secret.clone()),
    );
    let backups = crate::backup::Backups::open(&config.backup, &config.cell_id, &config.data_dir)
        .map_err(|e| StartError::Backups(e.to_string()))?;
    let backups_api = InterceptedService::new(
        BackupsServer::new(BackupsApi::new(Arc::new(backups), service.clone())),
        guard(secret.clone()),
    );
    let sync_api = InterceptedService::new(
        SyncServer::new(SyncApi::new(sync.clone())),
        guard(secret.clone()),
    );
    crate::metrics::register();
    let metrics = cellmesh_telemetry::admin::serve_configured(&config.metrics_listen)
        .await
        .map_err(StartError::Metrics)?;
    let metrics_address = metrics
        .as_ref()
        .map(|(bound, _)| reachable(*bound, &config.routing.advertise))
        .unwrap_or_default();
    let (closing_tx, closing_rx) = tokio::sync::watch::channel(false);
    let peer_api = InterceptedService::new(
        CellPeerServer::new(
            PeerApi::new(
                pipeline.inbound,
                service.clone(),
                sync.clone(),
                secret.clone(),
            )
            .with_metrics_address(metrics_address)
            .with_closing(closing_rx),
        )
        .max_decoding_message_size(64 * 1024 * 1024),
        guard(secret.clone()),
    );
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let (drain, drain_limit) = (
        pipeline.drain.clone(),
        Duration::from_millis(config.fanout.drain_on_stop_ms),
    );
    let maintenance = tokio::spawn(maintain(service.clone(), hub.clone(), clock));
    let tierer = tokio::spawn(crate::message::run_tierer(Arc::downgrade(&service)));
    let sweeper = tokio::spawn(sweep_uploads(
        Arc::downgrade(&service),
        Duration::from_millis(config.attachments.sweep_interval_ms),
        Duration::from_secs(config.attachments.quota_sync_secs),
    ));
    let cleanup = tokio::spawn(clean_moved(
        service.clone(),
        sync.clone(),
        Duration::from_secs(config.routing.cleanup_grace_secs),
    ));
    let (begun, draining) = stop_gracefully(stop_rx, drain, drain_limit, hub.clone(), closing_tx);
    let task = tokio::spawn(async move {
        let served = cellmesh_proto::server::builder()
            .layer(cellmesh_telemetry::server::ServerLayer)
            .add_service(standard.health)
            .add_service(standard.reflection)
            .add_service(standard.reflection_v1alpha)
            .add_service(messaging)
            .add_service(sync_api)
            .add_service(attachments_api)
            .add_service(backups_api)
            .add_service(peer_api)
            .serve_with_incoming_shutdown(cellmesh_proto::server::incoming(listener), begun)
            .await;
        // The drain holds the store: it ends before the store closes.
        let _ = draining.await;
        maintenance.abort();
        tierer.abort();
        sweeper.abort();
        cleanup.abort();
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
    let mut registration = None;
    if let Some(routes) = routes {
        let advertise = if config.routing.advertise.is_empty() {
            format!("http://{addr}")
        } else {
            config.routing.advertise.clone()
        };
        // A standalone cell (no region in its id) keeps its files as "local".
        let region = match config.cell_id.split_once('/') {
            Some((region, _)) if !region.is_empty() => region,
            _ => "local",
        };
        routes
            .apply(register_cell(&config.cell_id, region, &advertise))
            .await
            .map_err(|e| StartError::Routing(format!("cannot register: {}", e.message())))?;
        routes.report_process("cell", &config.cell_id, &advertise);
        routes.keep_cell_release(&config.cell_id, region, &advertise);
        if let Some(etcd) = coordination.filter(|_| !config.routing.etcd_endpoints.is_empty()) {
            use cellmesh_coord::CELLS_PREFIX;
            let lease = etcd
                .register(
                    &format!("{CELLS_PREFIX}{}", config.cell_id),
                    &advertise,
                    Duration::from_millis(config.routing.lease_ttl_ms),
                )
                .await
                .map_err(|e| StartError::Routing(e.to_string()))?;
            registration = Some(lease);
        }
        let rounds = crate::hwm::round::Rounds::new(marks, routes, &config);
        tokio::spawn(rounds.run(
            Duration::from_millis(config.routing.checkpoint_interval_ms),
            Arc::downgrade(&service),
        ));
    }
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

/// Indexes open uploads once, then copies files that came from other
/// regions every second, asks the other cells for the bytes of the tenants
/// with a quota every `quota_sync`, and sweeps expired uploads and
/// recalled files every `sweep` while the service lives.
async fn sweep_uploads(
    service: std::sync::Weak<MessageService>,
    sweep: Duration,
    quota_sync: Duration,
) {
    // A store from before the open-upload index gets it, once.
    if let Some(service) = service.upgrade() {
        match service.store().index_open_uploads().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(indexed = n, "open uploads indexed"),
            Err(e) => tracing::warn!(error = %e, "indexing open uploads failed"),
        }
    }
    let mut last_sweep = tokio::time::Instant::now();
    let mut last_quota_sync: Option<tokio::time::Instant> = None;
    loop {
        tokio::time::sleep(sweep.min(Duration::from_secs(1))).await;
        let Some(service) = service.upgrade() else {
            return;
        };
        if !quota_sync.is_zero() && last_quota_sync.is_none_or(|at| at.elapsed() >= quota_sync) {
            last_quota_sync = Some(tokio::time::Instant::now());
            service.sync_quotas().await;
        }
        match service.copy_foreign_files().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(copied = n, "files copied in from other regions"),
            Err(e) => tracing::warn!(error = %e, "copying files in failed"),
        }
        if last_sweep.elapsed() < sweep {
            continue;
        }
        last_sweep = tokio::time::Instant::now();
        match service.sweep_uploads().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(swept = n, "uploads swept"),
            Err(e) => tracing::warn!(error = %e, "upload sweep failed"),
        }
    }
}

async fn maintain(service: Arc<MessageService>, hub: Arc<Hub>, clock: Arc<dyn Clock>) {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    loop {
        tick.tick().await;
        service.maintain();
        hub.prune(clock.now_ms());
    }
}

/// Drops this cell's copies of what moved away, once `grace` has passed
/// (0: keep them).
async fn clean_moved(service: Arc<MessageService>, sync: Arc<SyncService>, grace: Duration) {
    // Tenants sealed whole before a restart, their keys not yet marked.
    if let Err(e) = sync.expand_sealed_tenants().await {
        tracing::warn!(error = %e, "marking sealed tenants' keys failed");
    }
    if grace.is_zero() {
        return;
    }
    let mut tick =
        tokio::time::interval((grace / 4).clamp(Duration::from_secs(1), Duration::from_secs(60)));
    loop {
        tick.tick().await;
        if let Err(e) = service.clean_moved(grace).await {
            tracing::warn!(error = %e, "cleaning up moved conversations failed");
        }
        if let Err(e) = sync.clean_moved_users(grace).await {
            tracing::warn!(error = %e, "cleaning up moved user homes failed");
        }
    }
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
