//! Raft replication to peers: one lazily connected tonic client of the
//! RaftPeer service per target, openraft's messages JSON-encoded. Transport
//! failures are `Unreachable` (openraft backs off), answers the peer refused
//! are `RemoteError`s.

use std::time::Duration;

use cellmesh_proto::raft::v1::RaftPayload;
use cellmesh_proto::raft::v1::raft_peer_client::RaftPeerClient;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::{Channel, Endpoint};

use crate::types::{NodeId, RouterNode, TypeConfig};
use cellmesh_proto::secret::ClusterSecret;

/// Largest Raft message a replica sends or accepts (snapshots included).
pub const MAX_RAFT_MESSAGE: usize = 256 * 1024 * 1024;

#[derive(Clone)]
pub struct Network {
    pub secret: ClusterSecret,
    pub links: std::collections::BTreeMap<String, String>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &RouterNode) -> PeerClient {
        let address = cellmesh_proto::config::via(&self.links, &node.raft_addr).to_string();
        let client = Endpoint::from_shared(address)
            .map(|e| {
                e.connect_timeout(Duration::from_secs(1))
                    .tcp_nodelay(true)
                    .connect_lazy()
            })
            .map_err(|e| e.to_string());
        PeerClient {
            target,
            client: client.map(|channel| {
                RaftPeerClient::new(channel)
                    .max_decoding_message_size(MAX_RAFT_MESSAGE)
                    .max_encoding_message_size(MAX_RAFT_MESSAGE)
            }),
            secret: self.secret.clone(),
        }
    }
}

pub struct PeerClient {
    target: NodeId,
    client: Result<RaftPeerClient<Channel>, String>,
    secret: ClusterSecret,
}

#[derive(Clone, Copy)]
enum Method {
    Append,
    Vote,
    Snapshot,
}

impl PeerClient {
    async fn call<Req, Resp, E>(
        &mut self,
        method: Method,
        rpc: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, RouterNode, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let client = match &mut self.client {
            Ok(c) => c,
            Err(e) => {
                return Err(RPCError::Unreachable(Unreachable::new(
                    &std::io::Error::other(e.clone()),
                )));
            }
        };
        let json = serde_json::to_vec(rpc).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut request = tonic::Request::new(RaftPayload { json });
        request.set_timeout(option.hard_ttl());
        self.secret.attach(&mut request);
        let reply = match method {
            Method::Append => client.append_entries(request).await,
            Method::Vote => client.vote(request).await,
            Method::Snapshot => client.install_snapshot(request).await,
        }
        .map_err(|status| RPCError::Unreachable(Unreachable::new(&status)))?;
        let result: Result<Resp, RaftError<NodeId, E>> =
            serde_json::from_slice(&reply.into_inner().json)
                .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, RouterNode, RaftError<NodeId>>>
    {
        self.call(Method::Append, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, RouterNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call(Method::Snapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, RouterNode, RaftError<NodeId>>> {
        self.call(Method::Vote, &rpc, &option).await
    }
}
