//! The control-plane loop (`cellmesh control-plane`): probes every
//! registered cell's gRPC health service, and when the detector declares a
//! cell failed, marks it Down and moves everything it owned to its fallback
//! (re-planning until nothing points at it). A recovered cell is marked Up
//! again but gets nothing back on its own: failing back is an operator's
//! migration.

use cellmesh_proto::tls::Dial;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::Instrument;

use cellmesh_proto::config::{ConfigError, check, check_grpc_urls, check_listen, check_range};
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::CellStatus as PbCellStatus;
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::commands::set_cell_status;
use cellmesh_route_client::convert::cell_status_to_pb;
use cellmesh_route_client::peers::Peers;
use cellmesh_route_client::table::{CellInfo, CellStatus};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::failover::detector::Detector;
use crate::failover::execute;
use crate::failover::holds::{Holds, Watched};
use crate::failover::planner::{plan_failover, safety_margin};
use crate::failover::trigger::{self, CellNow, Step};
use crate::operations::OperationStore;
use crate::operations::api::OperationsApi;
use crate::operations::runner::run_operations;
use crate::start_error::StartError;
use crate::status::Sampler;
use cellmesh_coord::embedded::EmbeddedCoordination;
use cellmesh_coord::etcd::EtcdCoordination;
use cellmesh_coord::local::LocalCoordination;
use cellmesh_coord::{CELLS_PREFIX, CONTROL_PLANE_ELECTION, Coordination};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControlPlaneConfig {
    pub routers: Vec<String>,
    pub cluster_secret: String,
    pub probe_interval_ms: u64,
    pub probe_timeout_ms: u64,
    /// Consecutive failed probes before a cell is failed over.
    pub down_after: u32,
    /// Consecutive good probes before a failed cell is Up again.
    pub up_after: u32,
    /// How long a replica that takes the lead gives each cell it has not
    /// yet seen serving before counting that cell's failed probes: cells
    /// of a deployment that starts (or restarts) as a whole are not failed
    /// over while they open their storage. A cell dead when the lead
    /// changes is failed over this much later.
    pub startup_grace_ms: u64,
    pub failover: FailoverConfig,
    pub coordination: CoordinationConfig,
    /// Where the web console listens (`host:port`); empty turns it off.
    pub console_listen: String,
    /// The console's read-only credential: HTTP basic (any user, this as
    /// the password) or `Authorization: Bearer`. Required (16+ bytes) when
    /// the console listens beyond loopback; empty on loopback: open.
    pub console_token: String,
    /// Where the admin API (`cellmesh.v1.Operations` gRPC) listens
    /// (`host:port`); empty turns it off.
    pub admin_listen: String,
    /// Where Prometheus scrapes `/metrics` (`host:port`, HTTP); empty (the
    /// default) turns it off.
    pub metrics_listen: String,
    /// A trace store the console reads recent traces from (`GET /traces`,
    /// `GET /traces/{id}`: what `cellmesh dev` runs); empty: none.
    pub traces_url: String,
    /// OpenTelemetry trace export (`[telemetry]`); off without an endpoint.
    pub telemetry: cellmesh_telemetry::trace::TraceConfig,
    /// Mutual TLS on the deployment's internal links (`[tls]`: the CA, this
    /// process's certificate and key); none set: plaintext.
    pub tls: cellmesh_proto::tls::TlsConfig,
    /// Runs without `[tls]`: every internal link in plaintext, readable and
    /// forgeable by anyone on the network path. A config file must say so
    /// (`insecure_plaintext = true`) or configure `[tls]`; one that does
    /// neither is refused. `cellmesh dev` without `--tls` sets it.
    #[serde(default, skip_serializing_if = "cellmesh_proto::config::is_off")]
    pub insecure_plaintext: bool,
    /// Addresses reached through a proxy: target → the address to dial.
    pub links: std::collections::BTreeMap<String, String>,
    /// Resuming moves whose migrator went away.
    pub migrations: crate::migration::orphans::OrphanConfig,
    /// Backups of every cell on a schedule (`[backups]`).
    pub backups: crate::operations::backup::BackupSchedule,
    /// How long finished operation records are kept (`[operations]`).
    pub operations: crate::operations::retention::OperationsConfig,
}

/// Leader election between control-plane replicas, and cell liveness from
/// their lease registrations when etcd is used.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CoordinationConfig {
    /// `embedded` (one control plane, probes only), `local` (replicas on
    /// one host, elected through lock files in `dir`) or `etcd`.
    pub backend: CoordinationBackend,
    pub etcd_endpoints: Vec<String>,
    /// The shared directory of the `local` backend.
    pub dir: String,
    /// This replica's name in the election.
    pub name: String,
    pub lease_ttl_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CoordinationBackend {
    Embedded,
    Local,
    Etcd,
}

impl Default for CoordinationConfig {
    fn default() -> Self {
        Self {
            backend: CoordinationBackend::Embedded,
            etcd_endpoints: Vec::new(),
            dir: String::new(),
            name: "control-plane-1".into(),
            lease_ttl_ms: 3000,
        }
    }
}

impl CoordinationConfig {
    pub async fn connect(&self) -> Result<Arc<dyn Coordination>, cellmesh_coord::CoordError> {
        Ok(match self.backend {
            CoordinationBackend::Embedded => Arc::new(EmbeddedCoordination::default()),
            CoordinationBackend::Local => Arc::new(LocalCoordination::open(Path::new(&self.dir))?),
            CoordinationBackend::Etcd => {
                Arc::new(EtcdCoordination::connect(&self.etcd_endpoints).await?)
            }
        })
    }
}

/// What bounds a conversation's seq growth between checkpoints; must match
/// the cells' `rate_limit` and `routing.checkpoint_interval_ms`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FailoverConfig {
    pub conversation_per_sec: u64,
    pub conversation_burst: u64,
    pub checkpoint_interval_ms: u64,
    /// The owner lease assumed for a cell that announced none (a release
    /// before 0.3.0): at least such cells' `routing.owner_lease_ms`. A cell
    /// is failed over only once its lease (the one it announced when it
    /// registered, else this; plus a tenth for clock drift) has passed since
    /// it was first seen failing, so it has stopped writing by then.
    pub owner_lease_ms: u64,
}

impl Default for ControlPlaneConfig {
    fn default() -> Self {
        Self {
            routers: vec!["http://127.0.0.1:7300".into()],
            cluster_secret: String::new(),
            probe_interval_ms: 250,
            probe_timeout_ms: 250,
            down_after: 3,
            up_after: 3,
            startup_grace_ms: 10_000,
            failover: FailoverConfig::default(),
            coordination: CoordinationConfig::default(),
            console_listen: "127.0.0.1:7100".into(),
            console_token: String::new(),
            admin_listen: "127.0.0.1:7101".into(),
            metrics_listen: String::new(),
            traces_url: String::new(),
            telemetry: Default::default(),
            tls: Default::default(),
            // Configs built in code (tests, `cellmesh dev`) say what they
            // want; a file that does not say it gets `false`.
            insecure_plaintext: true,
            links: Default::default(),
            migrations: Default::default(),
            backups: Default::default(),
            operations: Default::default(),
        }
    }
}

impl Default for FailoverConfig {
    fn default() -> Self {
        Self {
            conversation_per_sec: 2000,
            conversation_burst: 4000,
            checkpoint_interval_ms: 1000,
            owner_lease_ms: 2000,
        }
    }
}

impl ControlPlaneConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        cellmesh_proto::config::load_toml(path, Self::validate)
    }

    /// Every field, then whether the internal links are secured (or
    /// knowingly not).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_fields()?;
        cellmesh_proto::config::check_transport(&self.tls, self.insecure_plaintext)
    }

    fn validate_fields(&self) -> Result<(), ConfigError> {
        cellmesh_proto::config::check_tls(
            &self.tls,
            cellmesh_proto::tls::Role::ControlPlane,
            None,
        )?;
        check(
            "routers",
            !self.routers.is_empty(),
            "must name at least one router",
        )?;
        check_grpc_urls("routers", &self.routers)?;
        const MINUTES_10: u64 = 600_000;
        check_range("probe_interval_ms", self.probe_interval_ms, 10, MINUTES_10)?;
        check_range("probe_timeout_ms", self.probe_timeout_ms, 1, MINUTES_10)?;
        check_range("down_after", self.down_after, 1, 1_000)?;
        check_range("up_after", self.up_after, 1, 1_000)?;
        let f = &self.failover;
        check_range(
            "failover.conversation_per_sec",
            f.conversation_per_sec,
            1,
            1_000_000,
        )?;
        check_range(
            "failover.conversation_burst",
            f.conversation_burst,
            1,
            1_000_000,
        )?;
        check_range("failover.owner_lease_ms", f.owner_lease_ms, 0, MINUTES_10)?;
        let m = &self.migrations;
        check_range(
            "migrations.resume_after_ms",
            m.resume_after_ms,
            0,
            86_400_000,
        )?;
        check_range(
            "migrations.resume_frozen_after_ms",
            m.resume_frozen_after_ms,
            0,
            86_400_000,
        )?;
        check_range("migrations.tenant_parallel", m.tenant_parallel, 1, 1_024)?;
        check_range(
            "backups.interval_secs",
            self.backups.interval_secs,
            0,
            30 * 86_400,
        )?;
        check(
            "coordination.etcd_endpoints",
            self.coordination.backend != CoordinationBackend::Etcd
                || !self.coordination.etcd_endpoints.is_empty(),
            "must name etcd endpoints for the etcd backend",
        )?;
        cellmesh_proto::config::check_etcd(
            "coordination.etcd_endpoints",
            &self.coordination.etcd_endpoints,
            &self.tls,
        )?;
        check(
            "coordination.dir",
            self.coordination.backend != CoordinationBackend::Local
                || !self.coordination.dir.is_empty(),
            "must name a directory for the local backend",
        )?;
        check_range(
            "coordination.lease_ttl_ms",
            self.coordination.lease_ttl_ms,
            1_000,
            MINUTES_10,
        )?;
        check_listen("console_listen", &self.console_listen)?;
        let loopback = self
            .console_listen
            .parse::<SocketAddr>()
            .is_ok_and(|a| a.ip().is_loopback());
        check(
            "console_token",
            self.console_token.is_empty() && (loopback || self.console_listen.is_empty())
                || self.console_token.len() >= 16,
            "must be at least 16 bytes, and is required when console_listen is beyond loopback",
        )?;
        check_listen("admin_listen", &self.admin_listen)?;
        check_listen("metrics_listen", &self.metrics_listen)?;
        check(
            "traces_url",
            self.traces_url.is_empty() || self.traces_url.starts_with("http://"),
            "must be an http:// URL",
        )?;
        self.telemetry.validate()?;
        check_range(
            "failover.checkpoint_interval_ms",
            self.failover.checkpoint_interval_ms,
            10,
            MINUTES_10,
        )?;
        Ok(())
    }

    pub fn margin(&self) -> u64 {
        safety_margin(
            self.failover.conversation_per_sec,
            self.failover.conversation_burst,
            self.failover.checkpoint_interval_ms,
        )
    }
}

/// Something the control plane did, for operators and tests.
#[derive(Debug, Clone)]
pub enum Event {
    FailedOver {
        cell: String,
        fallback: String,
        moved_entries: usize,
        /// From the first failed probe to the last route write.
        took: Duration,
    },
    Recovered {
        cell: String,
    },
    Backfilled {
        cell: String,
        /// What it copied, and what it gave up on.
        done: crate::failover::backfill::Outcome,
    },
}

pub struct RunningControlPlane {
    pub routes: RouteClient,
    /// Where the web console answers, when it is on.
    pub console: Option<SocketAddr>,
    /// Where the admin API answers, when it is on.
    pub admin: Option<SocketAddr>,
    /// Where `/metrics` answers, when it is on.
    pub metrics: Option<SocketAddr>,
    events: Arc<Mutex<Vec<Event>>>,
    leading: watch::Receiver<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl RunningControlPlane {
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().expect("events").clone()
    }

    /// Whether this replica is the active one.
    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    pub fn stop(self) {
        for task in self.tasks {
            task.abort();
        }
    }
}

pub async fn start(config: ControlPlaneConfig) -> Result<RunningControlPlane, StartError> {
    config.validate()?;
    cellmesh_proto::tls::install(&config.tls).map_err(StartError::Tls)?;
    let routes = RouteClient::connect(
        config.routers.clone(),
        ClusterSecret::new(&config.cluster_secret),
    )
    .await
    .map_err(StartError::Routes)?;
    let coordination = config.coordination.connect().await?;
    let events = Arc::new(Mutex::new(Vec::new()));
    let (leading_tx, leading) = watch::channel(false);
    let mut tasks = Vec::new();
    let console = if config.console_listen.is_empty() {
        None
    } else {
        let listen = StartError::address("console_listen", &config.console_listen)?;
        let (latest, sampler) = sample(&config, coordination.clone(), routes.clone());
        let (addr, server) = crate::console::serve(
            listen,
            latest,
            config.traces_url.clone(),
            config.console_token.clone(),
        )
        .await
        .map_err(|source| StartError::Listen {
            what: "console_listen",
            listen,
            source,
        })?;
        tasks.extend([sampler, server]);
        Some(addr)
    };
    let admin = if config.admin_listen.is_empty() {
        None
    } else {
        let listen = StartError::address("admin_listen", &config.admin_listen)?;
        let (addr, server) = serve_admin(listen, &config, coordination.clone(), routes.clone())
            .await
            .map_err(|source| StartError::Listen {
                what: "admin_listen",
                listen,
                source,
            })?;
        tasks.push(server);
        Some(addr)
    };
    let name = match config.coordination.name.as_str() {
        "" => admin.map_or_else(String::new, |a| a.to_string()),
        name => name.to_string(),
    };
    routes.report_process(
        "control-plane",
        &name,
        &admin.map_or_else(String::new, |a| a.to_string()),
    );
    crate::metrics::register();
    let metrics = cellmesh_telemetry::admin::serve_configured(&config.metrics_listen)
        .await
        .map_err(StartError::Metrics)?
        .map(|(addr, server)| {
            tasks.push(server);
            addr
        });
    tasks.push(tokio::spawn(lead(
        config,
        coordination,
        routes.clone(),
        events.clone(),
        leading_tx,
    )));
    Ok(RunningControlPlane {
        routes,
        console,
        admin,
        metrics,
        events,
        leading,
        tasks,
    })
}

/// The latest operations (newest first) for the console.
async fn recent_operations(store: &OperationStore) -> serde_json::Value {
    const SHOWN: usize = 20;
    match store.list().await {
        Ok(ops) => ops
            .values()
            .rev()
            .take(SHOWN)
            .map(|op| {
                serde_json::json!({
                    "id": op.id, "description": op.spec.describe(), "state": op.shown_state(),
                    "phase": op.phase, "done": op.done, "total": op.total,
                    "runner": op.runner, "message": op.message,
                    "rows": op.rows, "lag": op.lag, "frozen_ms": op.frozen_ms,
                    "bytes": op.bytes, "eta_ms": op.eta_ms,
                })
            })
            .collect(),
        Err(e) => serde_json::json!({"error": e.to_string()}),
    }
}

/// The failover holds in force for the console: by cell, the time left
/// and the reason.
async fn holds_in_force(holds: &Holds) -> serde_json::Value {
    let now = crate::operations::now_ms();
    match holds.live(now).await {
        Ok(live) => live
            .values()
            .map(|h| {
                let hold = serde_json::json!({"left_ms": h.until_ms - now, "reason": h.reason});
                (h.cell.clone(), hold)
            })
            .collect::<serde_json::Map<_, _>>()
            .into(),
        Err(e) => serde_json::json!({"error": e.to_string()}),
    }
}

/// Serves the admin API on `listen`; the bound address and the server.
async fn serve_admin(
    listen: SocketAddr,
    config: &ControlPlaneConfig,
    coordination: Arc<dyn Coordination>,
    routes: RouteClient,
) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    use cellmesh_proto::v1::operations_server::OperationsServer;
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let secret = ClusterSecret::new(&config.cluster_secret);
    let api = OperationsApi::new(
        OperationStore::new(coordination.clone()),
        Holds::new(coordination),
        routes,
    );
    let service = tonic::service::interceptor::InterceptedService::new(
        OperationsServer::new(api),
        move |r| secret.check(r),
    );
    let server = tokio::spawn(async move {
        let served = cellmesh_proto::server::builder()
            .layer(cellmesh_telemetry::server::ServerLayer)
            .add_service(service)
            .serve_with_incoming(cellmesh_proto::server::incoming(listener))
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the admin API stopped");
        }
    });
    Ok((addr, server))
}

/// Keeps the console's status object fresh (once a second).
fn sample(
    config: &ControlPlaneConfig,
    coordination: Arc<dyn Coordination>,
    routes: RouteClient,
) -> (watch::Receiver<serde_json::Value>, JoinHandle<()>) {
    let (tx, rx) = watch::channel(serde_json::Value::Null);
    let mut sampler = Sampler::new(
        config.routers.clone(),
        ClusterSecret::new(&config.cluster_secret),
    );
    let (name, backend) = (
        config.coordination.name.clone(),
        format!("{:?}", config.coordination.backend).to_lowercase(),
    );
    let operations = OperationStore::new(coordination.clone());
    let holds = Holds::new(coordination.clone());
    let task = tokio::spawn(async move {
        loop {
            let leader = coordination
                .leader(CONTROL_PLANE_ELECTION)
                .await
                .ok()
                .flatten();
            let control_plane = serde_json::json!({"leader": leader, "coordination": backend, "serving_console": name});
            let mut status = sampler.sample(&routes, control_plane).await;
            status["operations"] = recent_operations(&operations).await;
            status["holds"] = holds_in_force(&holds).await;
            sampler.panels.track_operations(&mut status["operations"]);
            tx.send_replace(status);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    (rx, task)
}

/// Campaigns for leadership and runs the failover loop while leading; a
/// lost lease stops the loop and campaigns again.
async fn lead(
    config: ControlPlaneConfig,
    coordination: Arc<dyn Coordination>,
    routes: RouteClient,
    events: Arc<Mutex<Vec<Event>>>,
    leading: watch::Sender<bool>,
) {
    let ttl = Duration::from_millis(config.coordination.lease_ttl_ms);
    loop {
        let lease = match coordination
            .campaign(CONTROL_PLANE_ELECTION, &config.coordination.name, ttl)
            .await
        {
            Ok(lease) => lease,
            Err(e) => {
                tracing::warn!(error = %e, "campaign failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        tracing::info!(name = %config.coordination.name, "leading the control plane");
        leading.send_replace(true);
        let mut lost = lease.lost.clone();
        let peers = Peers::new(config.links.clone());
        let orphans = crate::migration::orphans::resume_orphans(
            crate::migration::Migrator::new(
                routes.clone(),
                ClusterSecret::new(&config.cluster_secret),
                Default::default(),
            )
            .with_peers(peers.clone()),
            config.migrations.clone(),
            Some(OperationStore::new(coordination.clone())),
        );
        let operations = run_operations(
            OperationStore::new(coordination.clone()),
            Arc::new(
                crate::migration::Migrator::new(
                    routes.clone(),
                    ClusterSecret::new(&config.cluster_secret),
                    Default::default(),
                )
                .with_peers(peers),
            ),
            config.coordination.name.clone(),
        );
        let backups = crate::operations::backup::schedule(
            config.backups.clone(),
            routes.clone(),
            OperationStore::new(coordination.clone()),
        );
        let pruning = crate::operations::retention::prune(
            config.operations.clone(),
            OperationStore::new(coordination.clone()),
        );
        tokio::select! {
            _ = run(config.clone(), coordination.clone(), routes.clone(), events.clone()) => {}
            _ = orphans => {}
            _ = operations => {}
            _ = backups => {}
            _ = pruning => {}
            _ = async {
                // A closed channel means the lease cannot report loss.
                if lost.wait_for(|l| *l).await.is_err() {
                    std::future::pending::<()>().await;
                }
            } => tracing::warn!("control-plane leadership lost"),
        }
        leading.send_replace(false);
        drop(lease);
    }
}

async fn probe(address: String, timeout: Duration) -> bool {
    let attempt = async {
        let channel = cellmesh_proto::tls::endpoint(address)
            .ok()?
            .connect_timeout(timeout)
            .dial()
            .await
            .ok()?;
        let reply = HealthClient::new(channel)
            .check(HealthCheckRequest::default())
            .await
            .ok()?;
        Some(reply.into_inner().status == ServingStatus::Serving as i32)
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

async fn run(
    config: ControlPlaneConfig,
    coordination: Arc<dyn Coordination>,
    routes: RouteClient,
    events: Arc<Mutex<Vec<Event>>>,
) {
    let leases = config.coordination.backend == CoordinationBackend::Etcd;
    let mut detector = Detector::new(config.down_after, config.up_after)
        .with_startup_grace(Duration::from_millis(config.startup_grace_ms));
    let mut first_failure: std::collections::HashMap<String, Instant> = Default::default();
    // Cells the table fences: since when this replica knows it, and the
    // status the fence replaced.
    let mut fences: std::collections::HashMap<String, Fence> = Default::default();
    let timeout = Duration::from_millis(config.probe_timeout_ms);
    // One pool for the backfills of every cell that comes back.
    let peers = Peers::new(config.links.clone());
    let mut holds = Watched::new(Holds::new(coordination.clone()));
    let mut tick = tokio::time::interval(Duration::from_millis(config.probe_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next_due: Option<Instant> = None;
    loop {
        // A failover falls due between probes: it is not held for the next
        // tick, nor for the failed cell's probe to time out.
        let due = async {
            match next_due {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        let probe_now = tokio::select! {
            _ = tick.tick() => true,
            _ = due => false,
        };
        let cells: Vec<_> = routes.read(|t| t.cells.values().cloned().collect());
        if probe_now {
            let probed = Probed {
                config: &config,
                routes: &routes,
                events: &events,
                peers: &peers,
            };
            let registered = if leases {
                coordination.list(CELLS_PREFIX).await.ok()
            } else {
                None
            };
            holds.refresh().await;
            probed
                .observe(
                    &cells,
                    registered,
                    Judged {
                        detector: &mut detector,
                        first_failure: &mut first_failure,
                        fences: &fences,
                        holds: &holds,
                    },
                    timeout,
                )
                .await;
        }
        next_due = None;
        // Fence, then fail over, every failed cell that still owns
        // something (again after a lost compare-and-set).
        for cell in &cells {
            let lease = trigger::owner_lease(cell.owner_lease_ms, config.failover.owner_lease_ms);
            let failing = first_failure.contains_key(&cell.id);
            let failed = detector.is_failed(&cell.id);
            // Whether the cell owns anything matters only once it fails;
            // the scan of every route is not made for healthy cells at
            // every probe.
            let (owns, status) = routes.read(|t| {
                (
                    (failing || failed) && t.routes.values().any(|e| e.cell == cell.id),
                    t.cell(&cell.id).map_or(CellStatus::Up, |c| c.status),
                )
            });
            if status.fenced() {
                // Fenced by another replica: what it replaced is not known.
                (fences.entry(cell.id.clone())).or_insert_with(|| Fence::new(CellStatus::Up));
            } else {
                fences.remove(&cell.id);
            }
            let mut now = CellNow {
                failing,
                failed,
                owns,
                fenced: status.fenced(),
                marked_down: status == CellStatus::Down,
                fenced_for: fences.get(&cell.id).map(|f| f.since.elapsed()),
                held: false,
            };
            now.held = holds.keeps(&cell.id, trigger::step(now, lease) != Step::Wait);
            match trigger::step(now, lease) {
                Step::Wait => {}
                Step::Fence => fence(&routes, &cell.id, status, &mut fences).await,
                Step::FailOver => {
                    let since = first_failure.get(&cell.id).copied();
                    fail_over(&config, &routes, &cell.id, since, &events).await;
                }
            }
            // As it stands after this step (a fence just written counts).
            let now = CellNow {
                fenced: fences.contains_key(&cell.id),
                fenced_for: fences.get(&cell.id).map(|f| f.since.elapsed()),
                ..now
            };
            if let Some(left) = trigger::due_in(now, lease).filter(|l| !l.is_zero()) {
                let at = Instant::now() + left;
                next_due = Some(next_due.map_or(at, |n| n.min(at)));
            }
        }
    }
}

/// Marks `cell` (now `status`) Degraded, and records the fence.
async fn fence(
    routes: &RouteClient,
    cell: &str,
    status: CellStatus,
    fences: &mut std::collections::HashMap<String, Fence>,
) {
    match routes
        .apply(set_cell_status(cell, PbCellStatus::Degraded))
        .await
    {
        Ok(_) => {
            tracing::warn!(cell, "fenced: marked Degraded until it passes a probe");
            fences.insert(cell.to_string(), Fence::new(status));
        }
        Err(e) => tracing::warn!(cell, error = %e.message(), "fence not written"),
    }
}

/// A fence this control plane knows of.
struct Fence {
    since: Instant,
    /// The status it replaced (Up, or Draining: a cell being emptied
    /// stays so once the fence is lifted).
    before: CellStatus,
}

impl Fence {
    fn new(before: CellStatus) -> Self {
        Self {
            since: Instant::now(),
            before,
        }
    }
}

/// What one round of probes judges the cells by.
struct Judged<'a> {
    detector: &'a mut Detector,
    first_failure: &'a mut std::collections::HashMap<String, Instant>,
    fences: &'a std::collections::HashMap<String, Fence>,
    holds: &'a Watched,
}

/// What one round of probes acts on.
struct Probed<'a> {
    config: &'a ControlPlaneConfig,
    routes: &'a RouteClient,
    events: &'a Arc<Mutex<Vec<Event>>>,
    peers: &'a Peers,
}

impl Probed<'_> {
    /// Probes every cell once, feeds `detector`, and lifts the fence of a
    /// cell that passes its probes again (its status before the fence, as
    /// `fences` knows it): at once if it was not called failed, else once
    /// the detector calls it recovered (backfilling one that was failed
    /// over). `registered`: the cells whose coordination lease lives
    /// (`None`: no leases). A held cell's failed probes are not counted
    /// against it: its restart is planned; nor are those of a cell the
    /// detector sees [starting](Detector::starting).
    async fn observe(
        &self,
        cells: &[CellInfo],
        registered: Option<std::collections::BTreeMap<String, String>>,
        judged: Judged<'_>,
        timeout: Duration,
    ) {
        let Judged {
            detector,
            first_failure,
            fences,
            holds,
        } = judged;
        let probes: Vec<_> = cells
            .iter()
            .map(|c| {
                let address =
                    cellmesh_proto::config::via(&self.config.links, &c.address).to_string();
                tokio::spawn(probe(address, timeout))
            })
            .collect();
        for (cell, probe) in cells.iter().zip(probes) {
            // With etcd, a cell whose lease expired is dead whatever it answers.
            let live = registered
                .as_ref()
                .is_none_or(|r| r.contains_key(&format!("{CELLS_PREFIX}{}", cell.id)));
            let healthy = probe.await.unwrap_or(false) && live;
            let down = cell.status == CellStatus::Down;
            // A held cell's failed probes count for nothing: its restart
            // is planned; nor do those of a cell still starting.
            let excused =
                !healthy && !down && (holds.holds(&cell.id) || detector.starting(&cell.id));
            if !healthy && !excused {
                first_failure
                    .entry(cell.id.clone())
                    .or_insert_with(Instant::now);
            } else if !detector.is_failed(&cell.id) {
                first_failure.remove(&cell.id);
            }
            if down && !detector.is_failed(&cell.id) && !healthy {
                detector.mark_failed(&cell.id);
            }
            if !excused {
                detector.observe(&cell.id, healthy);
            }
            if cell.status.fenced() && healthy && !detector.is_failed(&cell.id) {
                let before = fences.get(&cell.id).map_or(CellStatus::Up, |f| f.before);
                self.recovered(cell, before).await;
                first_failure.remove(&cell.id);
            }
        }
    }

    /// Gives `cell`, fenced, back the status `before` the fence (Up, or
    /// Draining): it passes its probes. One that was failed over owns
    /// nothing until failed back; what it acknowledged is backfilled into
    /// its routes' new owners.
    async fn recovered(&self, cell: &CellInfo, before: CellStatus) {
        if self
            .routes
            .apply(set_cell_status(&cell.id, cell_status_to_pb(before)))
            .await
            .is_err()
        {
            return;
        }
        if cell.status != CellStatus::Down {
            tracing::info!(cell = %cell.id, "cell passes its probes again before its failover: fence lifted");
            return;
        }
        tracing::info!(cell = %cell.id, "cell recovered; it owns nothing until failed back");
        self.events.lock().expect("events").push(Event::Recovered {
            cell: cell.id.clone(),
        });
        let (routes, events, id) = (self.routes.clone(), self.events.clone(), cell.id.clone());
        let (secret, peers) = (
            ClusterSecret::new(&self.config.cluster_secret),
            self.peers.clone(),
        );
        tokio::spawn(async move {
            let done = crate::failover::backfill::backfill(&routes, &peers, &secret, &id).await;
            crate::metrics::backfilled(done.conversations, done.abandoned());
            if done.abandoned() > 0 {
                tracing::error!(cell = %id, ?done, "backfill gave up: some history stays unavailable");
            } else {
                tracing::info!(cell = %id, ?done, "backfilled");
            }
            events
                .lock()
                .expect("events")
                .push(Event::Backfilled { cell: id, done });
        });
    }
}

/// Plans and writes the failover of `cell`, failing since `failing_since`,
/// recording it in `events`.
async fn fail_over(
    config: &ControlPlaneConfig,
    routes: &RouteClient,
    cell: &str,
    failing_since: Option<Instant>,
    events: &Mutex<Vec<Event>>,
) {
    let plan = match routes.read(|t| plan_failover(t, cell, config.margin())) {
        Ok(plan) => plan,
        Err(e) => {
            tracing::error!(cell = %cell, error = %e, "cannot fail over");
            return;
        }
    };
    tracing::warn!(cell = %cell, fallback = %plan.fallback, entries = plan.moved_entries, "failing over");
    if !plan.stranded.is_empty() {
        tracing::error!(
            cell = %cell,
            stranded = ?plan.stranded,
            "no healthy holder of the cell's marks lies in these tenants' regions: their routes stay on it"
        );
    }
    let span = tracing::info_span!(
        "failover",
        cell = %cell,
        fallback = %plan.fallback,
        entries = plan.moved_entries,
        cellmesh.always_sample = true,
    );
    if execute(routes, &plan.commands)
        .instrument(span)
        .await
        .is_ok()
    {
        let took = failing_since.map(|t| t.elapsed()).unwrap_or_default();
        crate::metrics::failed_over(took);
        events.lock().expect("events").push(Event::FailedOver {
            cell: cell.to_string(),
            fallback: plan.fallback.clone(),
            moved_entries: plan.moved_entries,
            took,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_config_is_the_default_and_bad_values_name_their_field() {
        let example: ControlPlaneConfig =
            cellmesh_proto::config::parse_toml(include_str!("../../config/control-plane.toml"))
                .unwrap();
        assert_eq!(
            format!("{example:?}"),
            format!("{:?}", ControlPlaneConfig::default())
        );
        assert_eq!(example.margin(), 8000);
        let bad = ControlPlaneConfig {
            down_after: 0,
            ..ControlPlaneConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("down_after")
        );
    }
}
