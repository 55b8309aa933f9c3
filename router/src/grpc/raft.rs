//! The RaftPeer service: replication RPCs from other replicas, decoded and
//! handed to the local Raft; openraft's answer travels back JSON-encoded.

use cellmesh_proto::raft::v1::RaftPayload;
use cellmesh_proto::raft::v1::raft_peer_server::RaftPeer;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::{Request, Response, Status};

use crate::types::Raft;

pub struct RaftPeerService {
    pub raft: Raft,
}

fn decode<T: DeserializeOwned>(request: Request<RaftPayload>) -> Result<T, Status> {
    serde_json::from_slice(&request.into_inner().json)
        .map_err(|e| Status::invalid_argument(format!("malformed raft message: {e}")))
}

fn encode<T: Serialize>(value: &T) -> Result<Response<RaftPayload>, Status> {
    serde_json::to_vec(value)
        .map(|json| Response::new(RaftPayload { json }))
        .map_err(|e| Status::internal(e.to_string()))
}

#[tonic::async_trait]
impl RaftPeer for RaftPeerService {
    async fn append_entries(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        encode(&self.raft.append_entries(decode(request)?).await)
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        encode(&self.raft.vote(decode(request)?).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        encode(&self.raft.install_snapshot(decode(request)?).await)
    }
}
