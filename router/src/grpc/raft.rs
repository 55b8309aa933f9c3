//! The RaftPeer service: replication RPCs from other replicas, decoded from
//! protobuf and handed to the local Raft. A replica that stopped answers
//! UNAVAILABLE (the sender backs off); a snapshot segment that does not
//! continue the one being received answers the mismatch. Votes, entries
//! and snapshots are taken only from the group's members (voters and
//! learners of the membership this replica knows); a replica that knows no
//! membership yet (one being added) takes them from whoever sends first.
//! An RPC addressed to another node id ([`ADDRESSEE`]) is refused: this
//! replica may be a new member listening where a lost one did.

use cellmesh_proto::raft::v1 as pb;
use cellmesh_proto::raft::v1::raft_peer_server::RaftPeer;
use openraft::Vote;
use openraft::error::{InstallSnapshotError, RaftError};
use tonic::{Request, Response, Status};

use crate::network::ADDRESSEE;
use crate::types::{NodeId, Raft};
use crate::wire;

pub struct RaftPeerService {
    pub raft: Raft,
}

fn malformed(e: wire::Malformed) -> Status {
    Status::invalid_argument(e.to_string())
}

/// Refuses an RPC its sender addressed to another node id (a sender
/// that names none is an older release: taken).
fn addressed_here<T>(raft: &Raft, request: &Request<T>) -> Result<(), Status> {
    let Some(to) = request.metadata().get(ADDRESSEE) else {
        return Ok(());
    };
    let me = raft.metrics().borrow().id;
    match to.to_str().ok().and_then(|t| t.parse::<NodeId>().ok()) {
        Some(to) if to == me => Ok(()),
        _ => Err(Status::failed_precondition(format!(
            "raft: this replica is node {me}, not node {to:?}"
        ))),
    }
}

/// Refuses an RPC whose sender (the candidate or leader named in `vote`)
/// is not a member of the group as this replica knows it.
fn admit(raft: &Raft, vote: &Vote<NodeId>) -> Result<(), Status> {
    let from = vote.leader_id.node_id;
    let metrics = raft.metrics();
    let metrics = metrics.borrow();
    let membership = metrics.membership_config.membership();
    let mut members = membership.nodes().map(|(id, _)| *id).peekable();
    if members.peek().is_none() || members.any(|id| id == from) {
        return Ok(());
    }
    Err(Status::permission_denied(format!(
        "raft: node {from} is not a member of this group"
    )))
}

fn refused<E: std::error::Error>(e: RaftError<NodeId, E>) -> Status {
    Status::unavailable(format!("raft: {e}"))
}

#[tonic::async_trait]
impl RaftPeer for RaftPeerService {
    async fn append_entries(
        &self,
        request: Request<pb::AppendEntriesRequest>,
    ) -> Result<Response<pb::AppendEntriesResponse>, Status> {
        addressed_here(&self.raft, &request)?;
        let peer = cellmesh_proto::tls::caller(&request).cloned();
        let rpc = wire::append_request_from_pb(request.into_inner()).map_err(malformed)?;
        super::authorize::is_router(peer.as_ref(), rpc.vote.leader_id.node_id)?;
        admit(&self.raft, &rpc.vote)?;
        let resp = self.raft.append_entries(rpc).await.map_err(refused)?;
        Ok(Response::new(wire::append_response_to_pb(&resp)))
    }

    async fn vote(
        &self,
        request: Request<pb::VoteRequest>,
    ) -> Result<Response<pb::VoteResponse>, Status> {
        addressed_here(&self.raft, &request)?;
        let peer = cellmesh_proto::tls::caller(&request).cloned();
        let rpc = wire::vote_request_from_pb(request.into_inner()).map_err(malformed)?;
        super::authorize::is_router(peer.as_ref(), rpc.vote.leader_id.node_id)?;
        admit(&self.raft, &rpc.vote)?;
        let resp = self.raft.vote(rpc).await.map_err(refused)?;
        Ok(Response::new(wire::vote_response_to_pb(&resp)))
    }

    async fn install_snapshot(
        &self,
        request: Request<pb::InstallSnapshotRequest>,
    ) -> Result<Response<pb::InstallSnapshotResponse>, Status> {
        addressed_here(&self.raft, &request)?;
        let peer = cellmesh_proto::tls::caller(&request).cloned();
        let rpc = wire::snapshot_request_from_pb(request.into_inner()).map_err(malformed)?;
        super::authorize::is_router(peer.as_ref(), rpc.vote.leader_id.node_id)?;
        admit(&self.raft, &rpc.vote)?;
        let answer = match self.raft.install_snapshot(rpc).await {
            Ok(resp) => Ok(resp),
            Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(m))) => Err(m),
            Err(e) => return Err(refused(e)),
        };
        Ok(Response::new(wire::snapshot_response_to_pb(&answer)))
    }
}
