//! The Routing API: lookups, table copies and the watch stream served from
//! this replica's applied state; writes, linearizable reads and membership
//! changes go through the leader. A follower forwards those to the leader
//! once; a request that still does not reach a leader is answered
//! RETRY_LATER/NOT_LEADER with the leader's API address in `x-cellmesh-leader`.

use cellmesh_proto::reason::Reason;
use cellmesh_proto::tls::Dial;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::status::to_status;
use cellmesh_proto::v1::routing_client::RoutingClient;
use cellmesh_proto::v1::routing_server::Routing;
use cellmesh_proto::v1::{self as pb, Consistency, ErrorCode};
use openraft::error::{ForwardToLeader, RaftError};
use openraft::{ServerState, TryAsRef};
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::convert::*;
use crate::storage::RouteStore;
use crate::types::{NodeId, Raft, RouterNode};

/// Metadata naming the leader's API address on a NOT_LEADER answer.
pub use cellmesh_route_client::client::LEADER_HEADER;
/// Marks a request a follower already forwarded (it is never forwarded twice).
const FORWARDED_HEADER: &str = "x-cellmesh-forwarded";
/// Change batches read per step of a watch.
const WATCH_BATCH: usize = 256;

pub struct RoutingService {
    pub raft: Raft,
    /// Weak: a stopped replica's storage closes even while clients hold
    /// connections open.
    store: Weak<RouteStore>,
    stopping: watch::Receiver<bool>,
    pub node_id: NodeId,
    pub node: RouterNode,
    pub secret: ClusterSecret,
    leaders: Mutex<BTreeMap<String, Channel>>,
    read_index: super::read_index::ReadIndex,
    proposer: super::propose::Proposer,
    processes: super::processes::Reports,
}

type ForwardFn<'a, Req, Resp> = Box<
    dyn FnOnce(
            RoutingClient<Channel>,
            Request<Req>,
        ) -> futures::future::BoxFuture<'a, Result<Response<Resp>, Status>>
        + Send
        + 'a,
>;

impl RoutingService {
    pub fn new(
        raft: Raft,
        store: &Arc<RouteStore>,
        stopping: watch::Receiver<bool>,
        node_id: NodeId,
        node: RouterNode,
        secret: ClusterSecret,
    ) -> Self {
        Self {
            read_index: super::read_index::ReadIndex::new(raft.clone()),
            proposer: super::propose::Proposer::new(raft.clone()),
            raft,
            store: Arc::downgrade(store),
            stopping,
            node_id,
            node,
            secret,
            leaders: Mutex::new(BTreeMap::new()),
            processes: Default::default(),
        }
    }

    fn not_leader(leader: Option<&RouterNode>) -> Status {
        let mut status = to_status(
            ErrorCode::RetryLater,
            Reason::NotLeader,
            match leader {
                Some(l) => format!("not the leader; the leader is at {}", l.api_addr),
                None => "no leader is known yet".into(),
            },
            100,
            None,
        );
        if let Some(l) = leader
            && let Ok(v) = MetadataValue::try_from(l.api_addr.as_str())
        {
            status.metadata_mut().insert(LEADER_HEADER, v);
        }
        status
    }

    /// Refuses a command the cluster version does not allow yet: a replica
    /// of an older release could not decode its log entry.
    fn gate(&self, command: &crate::table::Command) -> Result<(), Status> {
        use cellmesh_proto::version::{RESIDENCY, Version};
        if !matches!(command, crate::table::Command::SetTenantRegions { .. }) {
            return Ok(());
        }
        let version = self.store()?.table().cluster_version.clone();
        if Version::reported(&version).is_some_and(|v| v >= RESIDENCY) {
            return Ok(());
        }
        Err(crate::table::RouteError::VersionBehind(format!(
            "binding a tenant to regions needs cluster version {RESIDENCY} (it is {version:?}): \
             finalize the upgrade first"
        ))
        .to_status())
    }

    fn store(&self) -> Result<Arc<RouteStore>, Status> {
        self.store.upgrade().ok_or_else(stopped)
    }

    fn leader_channel(&self, addr: &str) -> Result<Channel, Status> {
        let mut leaders = self.leaders.lock().expect("leader channels");
        if let Some(c) = leaders.get(addr) {
            return Ok(c.clone());
        }
        let channel = cellmesh_proto::tls::endpoint(addr.to_string())
            .map_err(|e| Status::internal(format!("leader address {addr:?}: {e}")))?
            .dial_lazy();
        leaders.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }

    /// Sends `message` to the leader named by `error`, once.
    async fn forward<'a, Req: Send + 'a, Resp, E>(
        &'a self,
        error: &RaftError<NodeId, E>,
        already_forwarded: bool,
        message: Req,
        call: ForwardFn<'a, Req, Resp>,
    ) -> Result<Response<Resp>, Status>
    where
        E: Debug + TryAsRef<ForwardToLeader<NodeId, RouterNode>>,
    {
        let Some(forward) = error.forward_to_leader::<RouterNode>() else {
            return Err(match error {
                RaftError::APIError(e) => to_status(
                    ErrorCode::RetryLater,
                    Reason::RaftUnavailable,
                    format!("{e:?}"),
                    100,
                    None,
                ),
                RaftError::Fatal(e) => to_status(
                    ErrorCode::Internal,
                    Reason::RaftFatal,
                    e.to_string(),
                    0,
                    None,
                ),
            });
        };
        let leader = forward.leader_node.as_ref();
        let Some(node) = leader.filter(|n| !already_forwarded && n.api_addr != self.node.api_addr)
        else {
            return Err(Self::not_leader(leader));
        };
        let client = RoutingClient::new(self.leader_channel(&node.api_addr)?);
        let mut request = Request::new(message);
        self.secret.attach(&mut request);
        request
            .metadata_mut()
            .insert(FORWARDED_HEADER, MetadataValue::from_static("1"));
        call(client, request).await
    }
}

fn stopped() -> Status {
    to_status(
        ErrorCode::RetryLater,
        Reason::Stopping,
        "this replica is shutting down".into(),
        100,
        None,
    )
}

fn forwarded<T>(request: &Request<T>) -> bool {
    request.metadata().contains_key(FORWARDED_HEADER)
}

fn write_response(
    (index, result): super::propose::Written,
) -> Result<Response<pb::ApplyResponse>, Status> {
    match result {
        Ok(changes) => Ok(Response::new(pb::ApplyResponse {
            index,
            changes: changes.iter().map(change_to_pb).collect(),
        })),
        Err(e) => Err(e.to_status()),
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Routing for RoutingService {
    async fn resolve(
        &self,
        request: Request<pb::ResolveRequest>,
    ) -> Result<Response<pb::ResolveResponse>, Status> {
        let fwd = forwarded(&request);
        let req = request.into_inner();
        let key = key_from_pb(req.key)?;
        if req.consistency == Consistency::Linearizable as i32
            && let Err(e) = self.read_index.ensure(&self.raft).await
        {
            return self
                .forward(
                    &e,
                    fwd,
                    req,
                    Box::new(|mut c, r| Box::pin(async move { c.resolve(r).await })),
                )
                .await;
        }
        let (resolved, applied) = self.store()?.read(|t| (t.resolve(&key), t.applied));
        let resolved = resolved
            .ok_or_else(|| crate::table::RouteError::NoRoute(key.to_string()).to_status())?;
        Ok(Response::new(pb::ResolveResponse {
            route: Some(route_to_pb(&resolved)),
            entry: Some(entry_to_pb(&resolved.entry)),
            applied_index: applied,
        }))
    }

    async fn get_table(
        &self,
        request: Request<pb::GetTableRequest>,
    ) -> Result<Response<pb::RouteTable>, Status> {
        let fwd = forwarded(&request);
        let req = request.into_inner();
        if req.consistency == Consistency::Linearizable as i32
            && let Err(e) = self.read_index.ensure(&self.raft).await
        {
            return self
                .forward(
                    &e,
                    fwd,
                    req,
                    Box::new(|mut c, r| Box::pin(async move { c.get_table(r).await })),
                )
                .await;
        }
        Ok(Response::new(self.store()?.read(table_to_pb)))
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        let from = request.into_inner().from_index.max(1);
        let (tx, rx) = mpsc::channel(16);
        self.store()?;
        tokio::spawn(run_watch(
            self.store.clone(),
            self.stopping.clone(),
            from,
            tx,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn apply(
        &self,
        request: Request<pb::RouteCommand>,
    ) -> Result<Response<pb::ApplyResponse>, Status> {
        if let Some(peer) = cellmesh_proto::tls::caller(&request) {
            super::authorize::may_apply(peer, request.get_ref())?;
        }
        let fwd = forwarded(&request);
        let req = request.into_inner();
        let command = command_from_pb(req.clone())?;
        self.gate(&command)?;
        match self.proposer.propose(command).await {
            Ok(written) => write_response(written),
            Err(e) => {
                self.forward(
                    &e,
                    fwd,
                    req,
                    Box::new(|mut c, r| Box::pin(async move { c.apply(r).await })),
                )
                .await
            }
        }
    }

    async fn add_learner(
        &self,
        request: Request<pb::AddLearnerRequest>,
    ) -> Result<Response<pb::MembershipResponse>, Status> {
        if let Some(peer) = cellmesh_proto::tls::caller(&request) {
            super::authorize::may_change_membership(peer)?;
        }
        let fwd = forwarded(&request);
        let req = request.into_inner();
        let node = req
            .node
            .clone()
            .ok_or_else(|| crate::table::RouteError::invalid("node", "missing").to_status())?;
        if node.node_id == 0 || node.raft_address.is_empty() || node.api_address.is_empty() {
            return Err(crate::table::RouteError::invalid(
                "node",
                "needs node_id, raft_address and api_address",
            )
            .to_status());
        }
        let member = RouterNode {
            region: node.region,
            raft_addr: node.raft_address,
            api_addr: node.api_address,
        };
        match self.raft.add_learner(node.node_id, member, true).await {
            Ok(resp) => Ok(Response::new(pb::MembershipResponse {
                index: resp.log_id.index,
            })),
            Err(e) => {
                self.forward(
                    &e,
                    fwd,
                    req,
                    Box::new(|mut c, r| Box::pin(async move { c.add_learner(r).await })),
                )
                .await
            }
        }
    }

    async fn change_membership(
        &self,
        request: Request<pb::ChangeMembershipRequest>,
    ) -> Result<Response<pb::MembershipResponse>, Status> {
        if let Some(peer) = cellmesh_proto::tls::caller(&request) {
            super::authorize::may_change_membership(peer)?;
        }
        let fwd = forwarded(&request);
        let req = request.into_inner();
        let voters: BTreeSet<NodeId> = req.voters.iter().copied().collect();
        if voters.is_empty() {
            return Err(crate::table::RouteError::invalid("voters", "empty").to_status());
        }
        match self.raft.change_membership(voters, false).await {
            Ok(resp) => Ok(Response::new(pb::MembershipResponse {
                index: resp.log_id.index,
            })),
            Err(e) => {
                if let RaftError::APIError(
                    openraft::error::ClientWriteError::ChangeMembershipError(c),
                ) = &e
                {
                    return Err(
                        crate::table::RouteError::invalid("voters", c.to_string()).to_status()
                    );
                }
                self.forward(
                    &e,
                    fwd,
                    req,
                    Box::new(|mut c, r| Box::pin(async move { c.change_membership(r).await })),
                )
                .await
            }
        }
    }

    async fn snapshot(
        &self,
        _request: Request<pb::RouteSnapshotRequest>,
    ) -> Result<Response<pb::RouteSnapshot>, Status> {
        let store = self.store()?;
        let (applied_index, data) = store
            .snapshot_bytes()
            .map_err(|e| Status::internal(format!("route snapshot: {e}")))?;
        let (cells, routes, cluster_version) = store.read(|t| {
            (
                t.cells.len() as u64,
                t.routes.len() as u64,
                t.cluster_version.clone(),
            )
        });
        Ok(Response::new(pb::RouteSnapshot {
            applied_index,
            data,
            cells,
            routes,
            cluster_version,
        }))
    }

    async fn status(
        &self,
        _request: Request<pb::RouterStatusRequest>,
    ) -> Result<Response<pb::RouterStatus>, Status> {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voter_ids: BTreeSet<NodeId> = membership.voter_ids().collect();
        let (voters, learners): (Vec<_>, Vec<_>) = membership
            .nodes()
            .map(|(id, n)| (voter_ids.contains(id), crate::wire::node_to_pb(*id, n)))
            .partition(|(is_voter, _)| *is_voter);
        let leader_api = m
            .current_leader
            .and_then(|l| membership.get_node(&l).map(|n| n.api_addr.clone()))
            .unwrap_or_default();
        Ok(Response::new(pb::RouterStatus {
            node_id: self.node_id,
            region: self.node.region.clone(),
            role: match m.state {
                ServerState::Leader => "Leader",
                ServerState::Follower => "Follower",
                ServerState::Learner => "Learner",
                ServerState::Candidate => "Candidate",
                ServerState::Shutdown => "Shutdown",
            }
            .into(),
            current_leader: m.current_leader.unwrap_or(0),
            leader_api_address: leader_api,
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
            voters: voters.into_iter().map(|(_, n)| n).collect(),
            learners: learners.into_iter().map(|(_, n)| n).collect(),
            version: cellmesh_proto::version::BINARY.into(),
            cluster_version: self.store()?.read(|t| t.cluster_version.clone()),
        }))
    }

    async fn report_process(
        &self,
        request: Request<pb::ProcessReport>,
    ) -> Result<Response<pb::ReportProcessResponse>, Status> {
        let peer = cellmesh_proto::tls::caller(&request).cloned();
        self.processes.record(request.into_inner(), peer.as_ref())?;
        Ok(Response::new(pb::ReportProcessResponse {
            cluster_version: self.store()?.read(|t| t.cluster_version.clone()),
        }))
    }

    async fn list_processes(
        &self,
        _request: Request<pb::ListProcessesRequest>,
    ) -> Result<Response<pb::ProcessList>, Status> {
        Ok(Response::new(self.processes.list()))
    }
}

/// Streams every change batch from `next` on. A watcher behind the
/// compacted history first gets the whole table (`reset`).
async fn run_watch(
    store: Weak<RouteStore>,
    mut stopping: watch::Receiver<bool>,
    mut next: u64,
    tx: mpsc::Sender<Result<pb::WatchEvent, Status>>,
) {
    let Some(mut applied) = store.upgrade().map(|s| s.subscribe()) else {
        return;
    };
    loop {
        let Some(store) = store.upgrade() else { return };
        let upto = *applied.borrow_and_update();
        if next <= store.compacted_through() {
            let table = store.table();
            next = table.applied + 1;
            let event = pb::WatchEvent {
                index: table.applied,
                reset: Some(table_to_pb(&table)),
                changes: Vec::new(),
            };
            if tx.send(Ok(event)).await.is_err() {
                return;
            }
            continue;
        }
        let batches = match store.changes_from(next, WATCH_BATCH) {
            Ok(b) => b,
            Err(e) => {
                let _ = tx.send(Err(Status::internal(e.to_string()))).await;
                return;
            }
        };
        // History compacted while reading: start over from a copy.
        if next <= store.compacted_through() {
            continue;
        }
        let full = batches.len() == WATCH_BATCH;
        for (index, changes) in batches {
            let event = pb::WatchEvent {
                index,
                reset: None,
                changes: changes.iter().map(change_to_pb).collect(),
            };
            if tx.send(Ok(event)).await.is_err() {
                return;
            }
            next = index + 1;
        }
        if full {
            continue;
        }
        next = next.max(upto + 1);
        drop(store);
        tokio::select! {
            changed = applied.changed() => if changed.is_err() { return },
            _ = tx.closed() => return,
            _ = stopping.changed() => {
                let _ = tx.send(Err(stopped())).await;
                return;
            }
        }
    }
}
