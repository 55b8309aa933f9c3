//! The route client: a local copy of the route table, started from a table
//! copy and kept current by the watch stream (resuming from the last applied
//! index after any disconnect, on any replica), plus writes that find the
//! leader. Cells use it to check ownership, edges to find owners.

use cellmesh_proto::reason::Reason;
use cellmesh_proto::tls::Dial;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::status::{error_code, to_status};
use cellmesh_proto::v1::routing_client::RoutingClient;
use cellmesh_proto::v1::{self as pb, Consistency, ErrorCode};
use cellmesh_telemetry::trace::grpc::{Channel, Traceable};
use tokio::sync::{broadcast, watch};
use tonic::{Request, Status};

use crate::convert::{change_from_pb, key_to_pb, table_from_pb};
use crate::table::{Change, Key, Resolved, RouteTable};

/// The response header in which a replica that is not the leader names the
/// leader's address.
pub const LEADER_HEADER: &str = "x-cellmesh-leader";

/// Changes applied at one log index, as the watch stream delivers them.
pub type WatchBatch = (u64, Vec<Change>);

/// How often a process reports itself to the replicas.
pub const REPORT_EVERY: Duration = Duration::from_secs(5);

/// How many replicas a write tries (following leader hints) before giving up.
const WRITE_ATTEMPTS: usize = 8;
/// How long one attempt of a call may take before the next replica is
/// tried (a hung replica must not hold the call): table copies may be
/// large; writes are small and commit within a few round trips.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
const WRITE_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);
/// The same for linearizable lookups, which owner leases are renewed with:
/// while the leader hangs, the lookup must reach the replica that takes
/// over well within a lease.
const LOOKUP_ATTEMPT_TIMEOUT: Duration = Duration::from_millis(400);

#[derive(Clone)]
pub struct RouteClient {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: Vec<String>,
    secret: ClusterSecret,
    table: RwLock<RouteTable>,
    applied: watch::Sender<u64>,
    events: broadcast::Sender<WatchBatch>,
    channels: Mutex<HashMap<String, Channel>>,
    /// The endpoint that answered last.
    preferred: AtomicUsize,
    /// Tells the watch to leave its replica for the preferred one (the
    /// replica it follows went silent: a hung process does not close its
    /// streams).
    rewatch: Arc<tokio::sync::Notify>,
}

impl RouteClient {
    /// Copies the table from the first replica that answers and starts
    /// following its changes.
    pub async fn connect(endpoints: Vec<String>, secret: ClusterSecret) -> Result<Self, Status> {
        if endpoints.is_empty() {
            return Err(to_status(
                ErrorCode::InvalidArgument,
                Reason::NoRouters,
                "no router endpoints configured".into(),
                0,
                None,
            ));
        }
        let (applied, _) = watch::channel(0);
        let (events, _) = broadcast::channel(1024);
        let inner = Arc::new(Inner {
            endpoints,
            secret,
            table: RwLock::new(RouteTable::default()),
            applied,
            events,
            channels: Mutex::new(HashMap::new()),
            preferred: AtomicUsize::new(0),
            rewatch: Arc::new(tokio::sync::Notify::new()),
        });
        let table = inner.fetch_table(Consistency::Stale).await?;
        inner.replace(table);
        tokio::spawn(follow(Arc::downgrade(&inner)));
        Ok(Self { inner })
    }

    /// The cached route of `key`.
    pub fn resolve(&self, key: &Key) -> Option<Resolved> {
        self.read(|t| t.resolve(key))
    }

    pub fn read<R>(&self, f: impl FnOnce(&RouteTable) -> R) -> R {
        f(&self.inner.table.read().expect("route cache lock"))
    }

    /// Index of the last change in the cache.
    pub fn applied(&self) -> u64 {
        *self.inner.applied.borrow()
    }

    /// Every change batch the cache applies, in order (a reset appears as
    /// a batch of the whole table).
    pub fn changes(&self) -> broadcast::Receiver<WatchBatch> {
        self.inner.events.subscribe()
    }

    /// The cluster version. A cluster this release forms writes its version
    /// right after its first election, so an empty version in a table with
    /// no route yet is waited for (up to `wait`); an empty version beside
    /// routes is that of a cluster formed before versions existed.
    pub async fn cluster_version(&self, wait: Duration) -> String {
        let deadline = tokio::time::Instant::now() + wait;
        let mut rx = self.inner.applied.subscribe();
        loop {
            let (version, formed) =
                self.read(|t| (t.cluster_version.clone(), !t.routes.is_empty()));
            if !version.is_empty() || formed {
                return version;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                _ => return version,
            }
        }
    }

    /// Waits until the cache has applied `index`; false on timeout.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> bool {
        let mut rx = self.inner.applied.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|&a| a >= index))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Brings the cache up to at least `epoch` (an epoch a cell answered
    /// with): waits for the watch briefly, else copies the table from the
    /// leader.
    pub async fn refresh(&self, epoch: u64) -> Result<(), Status> {
        if self.wait_applied(epoch, Duration::from_millis(500)).await {
            return Ok(());
        }
        self.catch_up().await
    }

    /// Copies the table from the leader now and follows the watch from the
    /// replica that answered: for a caller that learned of an index this
    /// cache has not reached (its watch may be on a replica that hangs).
    pub async fn catch_up(&self) -> Result<(), Status> {
        let table = self.inner.fetch_table(Consistency::Linearizable).await?;
        if table.applied > self.applied() {
            self.inner.replace(table);
        }
        self.inner.rewatch.notify_one();
        Ok(())
    }

    /// Binds `tenant` to `regions` (empty: unbinds it), expecting its
    /// entry's latest epoch (read through the leader), and waits until this
    /// cache has applied the binding.
    pub async fn bind_regions(
        &self,
        tenant: cellmesh_proto::ids::TenantId,
        regions: &[String],
    ) -> Result<(), Status> {
        self.catch_up().await?;
        let epoch = self
            .resolve(&Key::tenant(tenant))
            .ok_or_else(|| Status::not_found(format!("tenant {tenant} is not placed")))?
            .entry
            .epoch;
        let command = crate::commands::set_tenant_regions(tenant, regions, epoch);
        let applied = self.apply(command).await?;
        self.refresh(applied.index).await
    }

    /// A linearizable lookup on the leader.
    pub async fn resolve_linearizable(&self, key: &Key) -> Result<pb::ResolveResponse, Status> {
        let request = pb::ResolveRequest {
            key: Some(key_to_pb(key)),
            consistency: Consistency::Linearizable as i32,
        };
        self.inner
            .call_with(request, LOOKUP_ATTEMPT_TIMEOUT, |mut c, r| async move {
                c.resolve(r).await
            })
            .await
    }

    /// A linearizable lookup asked of every replica at once; the first
    /// answer wins (only the leader, with a quorum, gives one). While the
    /// leader hangs and the others elect a new one, this answers as soon
    /// as the new leader can, instead of waiting on the hung replica and
    /// the stale leader hints that name it (owner-lease renewals).
    pub async fn resolve_linearizable_any(&self, key: &Key) -> Result<pb::ResolveResponse, Status> {
        let request = pb::ResolveRequest {
            key: Some(key_to_pb(key)),
            consistency: Consistency::Linearizable as i32,
        };
        let mut calls = tokio::task::JoinSet::new();
        for (i, endpoint) in self.inner.endpoints.iter().enumerate() {
            let mut client = self.inner.client(endpoint)?;
            let call = self.inner.request(request, LOOKUP_ATTEMPT_TIMEOUT);
            calls.spawn(async move {
                let answer =
                    tokio::time::timeout(LOOKUP_ATTEMPT_TIMEOUT, client.resolve(call)).await;
                (i, answer)
            });
        }
        let mut last = Status::unavailable("no router answered");
        while let Some(done) = calls.join_next().await {
            match done {
                Ok((i, Ok(Ok(r)))) => {
                    self.inner.preferred.store(i, Ordering::Relaxed);
                    return Ok(r.into_inner());
                }
                Ok((_, Ok(Err(status)))) => last = status,
                Ok((_, Err(_))) => {
                    last = Status::deadline_exceeded(format!(
                        "no router answered within {LOOKUP_ATTEMPT_TIMEOUT:?}"
                    ))
                }
                Err(e) => last = Status::internal(e.to_string()),
            }
        }
        Err(last)
    }

    /// A route write, sent to the leader wherever it is.
    pub async fn apply(&self, command: pb::RouteCommand) -> Result<pb::ApplyResponse, Status> {
        self.inner
            .call_with(command, WRITE_ATTEMPT_TIMEOUT, |mut c, r| async move {
                c.apply(r).await
            })
            .await
    }

    /// Adds the deployment secret to a request made with [`Self::routing`].
    pub fn attach_secret<T>(&self, request: &mut Request<T>) {
        self.inner.secret.attach(request);
    }

    /// Reports this process — `role`, `name`, this build's release and
    /// `address` — to every replica now and every [`REPORT_EVERY`] while
    /// the client lives (see the router's process reports). A replica of
    /// an earlier release answers UNIMPLEMENTED: nothing to do.
    pub fn report_process(&self, role: &str, name: &str, address: &str) {
        let report = pb::ProcessReport {
            role: role.into(),
            name: name.into(),
            version: cellmesh_proto::version::BINARY.into(),
            address: address.into(),
        };
        let inner = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                let Some(live) = inner.upgrade() else { return };
                let endpoints = live.endpoints.clone();
                for endpoint in endpoints {
                    let Ok(mut client) = live.client(&endpoint) else {
                        continue;
                    };
                    let request = live.request(report.clone(), WRITE_ATTEMPT_TIMEOUT);
                    if let Err(status) = client.report_process(request).await
                        && status.code() != tonic::Code::Unimplemented
                    {
                        tracing::debug!(%endpoint, %status, "process report not taken");
                    }
                }
                drop(live);
                tokio::time::sleep(REPORT_EVERY).await;
            }
        });
    }

    /// Registers cell `cell_id` again, every [`REPORT_EVERY`] while the
    /// client lives, whenever the table does not show this build's release
    /// for it at `address`: a leader of an earlier release, which does not
    /// know the field, dropped it from the registration. The cluster
    /// version waits for every cell's.
    pub fn keep_cell_release(&self, cell_id: &str, region: &str, address: &str, lease_ms: u64) {
        let command = crate::commands::register_leased_cell(cell_id, region, address, lease_ms);
        let (cell_id, address) = (cell_id.to_string(), address.to_string());
        let inner = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REPORT_EVERY).await;
                let Some(live) = inner.upgrade() else { return };
                let client = Self { inner: live };
                let current = client.read(|t| {
                    t.cell(&cell_id).is_some_and(|c| {
                        (c.version == cellmesh_proto::version::BINARY
                            && c.owner_lease_ms == lease_ms)
                            || c.address != address
                    })
                });
                if !current && let Err(e) = client.apply(command.clone()).await {
                    tracing::debug!(error = %e.message(), "registering the cell's release again failed");
                }
            }
        });
    }

    /// Every process some replica heard from lately, the newest report of
    /// each (role, name); replicas that cannot be reached are skipped.
    /// A route-table backup: the snapshot of the replica that has applied
    /// the most (each replica answers from its own state machine).
    pub async fn snapshot(&self) -> Result<pb::RouteSnapshot, Status> {
        let mut best: Option<pb::RouteSnapshot> = None;
        let mut last_error = None;
        for endpoint in &self.inner.endpoints {
            let Ok(mut client) = self.inner.client(endpoint) else {
                continue;
            };
            let request = self
                .inner
                .request(pb::RouteSnapshotRequest {}, Duration::from_secs(60));
            match client.snapshot(request).await {
                Ok(r) => {
                    let r = r.into_inner();
                    if best
                        .as_ref()
                        .is_none_or(|b| b.applied_index < r.applied_index)
                    {
                        best = Some(r);
                    }
                }
                Err(e) => last_error = Some(e),
            }
        }
        best.ok_or_else(|| {
            last_error.unwrap_or_else(|| Status::unavailable("no router replica answered"))
        })
    }

    pub async fn processes(&self) -> Vec<pb::ReportedProcess> {
        let mut newest: std::collections::BTreeMap<(String, String), pb::ReportedProcess> =
            Default::default();
        for endpoint in &self.inner.endpoints {
            let Ok(mut client) = self.inner.client(endpoint) else {
                continue;
            };
            let request = self
                .inner
                .request(pb::ListProcessesRequest {}, ATTEMPT_TIMEOUT);
            let Ok(list) = client.list_processes(request).await else {
                continue;
            };
            for p in list.into_inner().processes {
                let Some(r) = &p.report else { continue };
                let key = (r.role.clone(), r.name.clone());
                if newest.get(&key).is_none_or(|known| known.age_ms > p.age_ms) {
                    newest.insert(key, p);
                }
            }
        }
        newest.into_values().collect()
    }

    /// A client for other Routing calls (status, membership).
    pub fn routing(&self) -> Result<RoutingClient<Channel>, Status> {
        let i = self.inner.preferred.load(Ordering::Relaxed);
        self.inner
            .client(&self.inner.endpoints[i % self.inner.endpoints.len()])
    }
}

impl Inner {
    fn client(&self, endpoint: &str) -> Result<RoutingClient<Channel>, Status> {
        let mut channels = self.channels.lock().expect("channel cache");
        let channel = match channels.get(endpoint) {
            Some(c) => c.clone(),
            None => {
                let c = cellmesh_proto::tls::endpoint(endpoint.to_string())
                    .map_err(|e| {
                        Status::invalid_argument(format!("router endpoint {endpoint:?}: {e}"))
                    })?
                    .connect_timeout(Duration::from_secs(1))
                    .tcp_nodelay(true)
                    .dial_lazy()
                    .traced();
                channels.insert(endpoint.to_string(), c.clone());
                c
            }
        };
        Ok(RoutingClient::new(channel))
    }

    fn request<T>(&self, message: T, timeout: Duration) -> Request<T> {
        let mut r = Request::new(message);
        r.set_timeout(timeout);
        self.secret.attach(&mut r);
        r
    }

    /// Tries the preferred replica, then the leader it names, then the
    /// others, until one answers something other than NOT_LEADER or a
    /// transport failure.
    async fn call<T, R, F, Fut>(&self, message: T, f: F) -> Result<R, Status>
    where
        T: Clone,
        F: Fn(RoutingClient<Channel>, Request<T>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<R>, Status>>,
    {
        self.call_with(message, ATTEMPT_TIMEOUT, f).await
    }

    /// [`Self::call`] with each attempt limited to `attempt_timeout`.
    async fn call_with<T, R, F, Fut>(
        &self,
        message: T,
        attempt_timeout: Duration,
        f: F,
    ) -> Result<R, Status>
    where
        T: Clone,
        F: Fn(RoutingClient<Channel>, Request<T>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let n = self.endpoints.len();
        let mut target = self.endpoints[self.preferred.load(Ordering::Relaxed) % n].clone();
        let mut last = Status::unavailable("no router answered");
        for attempt in 0..WRITE_ATTEMPTS {
            let request = self.request(message.clone(), attempt_timeout);
            // A hung replica does not enforce the deadline it was sent.
            let call = tokio::time::timeout(attempt_timeout, f(self.client(&target)?, request));
            let answer = call.await.unwrap_or_else(|_| {
                Err(Status::deadline_exceeded(format!(
                    "router {target} did not answer within {attempt_timeout:?}"
                )))
            });
            match answer {
                Ok(r) => {
                    if let Some(i) = self.endpoints.iter().position(|e| *e == target) {
                        self.preferred.store(i, Ordering::Relaxed);
                    }
                    return Ok(r.into_inner());
                }
                Err(status) => {
                    let leader = status
                        .metadata()
                        .get(LEADER_HEADER)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    // A replica that did not answer in time (tonic ends
                    // such a call as CANCELLED "Timeout expired") is passed
                    // over like one that is unavailable.
                    let retry = error_code(&status) == ErrorCode::RetryLater
                        || matches!(
                            status.code(),
                            tonic::Code::Unavailable
                                | tonic::Code::DeadlineExceeded
                                | tonic::Code::Cancelled
                        );
                    if !retry {
                        return Err(status);
                    }
                    last = status;
                    target = match leader {
                        Some(l) if l != target => l,
                        _ => {
                            tokio::time::sleep(Duration::from_millis(50 << attempt.min(4))).await;
                            self.endpoints[(attempt + 1) % n].clone()
                        }
                    };
                }
            }
        }
        Err(last)
    }

    async fn fetch_table(&self, consistency: Consistency) -> Result<RouteTable, Status> {
        let request = pb::GetTableRequest {
            consistency: consistency as i32,
        };
        let table = self
            .call(request, |mut c, r| async move { c.get_table(r).await })
            .await?;
        table_from_pb(table)
    }

    fn replace(&self, table: RouteTable) {
        let applied = table.applied;
        let changes = table.as_changes();
        *self.table.write().expect("route cache lock") = table;
        // The event goes out first: whoever sees `applied` move can read it.
        let _ = self.events.send((applied, changes));
        self.applied.send_replace(applied);
        crate::metrics::metrics().applied_index.set(applied as i64);
    }

    fn apply(&self, index: u64, changes: Vec<crate::table::Change>) {
        {
            let mut table = self.table.write().expect("route cache lock");
            if index <= table.applied {
                return;
            }
            for c in &changes {
                table.apply_change(c);
            }
            table.applied = index;
        }
        let _ = self.events.send((index, changes));
        self.applied.send_replace(index);
        crate::metrics::metrics().applied_index.set(index as i64);
    }
}

/// Follows the watch stream for as long as a client handle exists.
async fn follow(inner: Weak<Inner>) {
    let mut failures = 0u32;
    let Some(rewatch) = inner.upgrade().map(|i| i.rewatch.clone()) else {
        return;
    };
    loop {
        let mut moved = false;
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let n = strong.endpoints.len();
        let endpoint = strong.endpoints[strong.preferred.load(Ordering::Relaxed) % n].clone();
        let from = *strong.applied.borrow() + 1;
        if from > 1 {
            crate::metrics::metrics().rewatches.inc();
        }
        let stream = match strong.client(&endpoint) {
            Ok(mut c) => {
                let mut request = Request::new(pb::WatchRequest { from_index: from });
                strong.secret.attach(&mut request);
                c.watch(request).await.map(|r| r.into_inner())
            }
            Err(e) => Err(e),
        };
        drop(strong);
        if let Ok(mut stream) = stream {
            loop {
                let message = tokio::select! {
                    m = stream.message() => m,
                    _ = rewatch.notified() => {
                        moved = true;
                        break;
                    }
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {
                        if inner.strong_count() == 0 { return }
                        continue;
                    }
                };
                let Ok(Some(event)) = message else { break };
                let Some(strong) = inner.upgrade() else {
                    return;
                };
                failures = 0;
                if let Some(reset) = event.reset {
                    match table_from_pb(reset) {
                        Ok(table) => strong.replace(table),
                        Err(e) => tracing::warn!(error = %e, "undecodable route table reset"),
                    }
                    continue;
                }
                let changes: Result<Vec<_>, _> =
                    event.changes.into_iter().map(change_from_pb).collect();
                match changes {
                    Ok(changes) => strong.apply(event.index, changes),
                    Err(e) => {
                        tracing::warn!(error = %e, index = event.index, "undecodable route change")
                    }
                }
            }
        }
        // Reconnect elsewhere with backoff (or at once where told to).
        if moved {
            continue;
        }
        let Some(strong) = inner.upgrade() else {
            return;
        };
        strong.preferred.fetch_add(1, Ordering::Relaxed);
        drop(strong);
        failures += 1;
        tokio::time::sleep(Duration::from_millis(50 * u64::from(failures.min(20)))).await;
    }
}
