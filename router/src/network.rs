//! Raft replication to peers: one lazily connected tonic client of the
//! RaftPeer service per target, openraft's messages in their protobuf form
//! ([`crate::wire`]). Transport failures and stopped peers are
//! `Unreachable` (openraft backs off); a snapshot mismatch the peer answered
//! is a `RemoteError`.

use cellmesh_proto::tls::Dial;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellmesh_proto::raft::v1::raft_peer_client::RaftPeerClient;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use tonic::transport::Channel;

use crate::types::{NodeId, RouterNode, TypeConfig};
use crate::wire;
use cellmesh_proto::secret::ClusterSecret;

/// Largest Raft message a replica sends or accepts (snapshots included).
pub const MAX_RAFT_MESSAGE: usize = 256 * 1024 * 1024;

#[derive(Clone)]
pub struct Network {
    pub secret: ClusterSecret,
    pub links: std::collections::BTreeMap<String, String>,
    /// One channel per peer address, shared by every client made for it.
    /// openraft makes a new client for each leadership check of a
    /// linearizable read: a fresh channel would be a fresh connection (and
    /// TLS handshake) inside a check that has one heartbeat interval.
    channels: Arc<Mutex<HashMap<String, Channel>>>,
}

impl Network {
    pub fn new(secret: ClusterSecret, links: std::collections::BTreeMap<String, String>) -> Self {
        Self {
            secret,
            links,
            channels: Default::default(),
        }
    }

    /// The channel to `address` (dialled lazily the first time).
    fn channel(&self, address: String) -> Result<Channel, String> {
        let mut channels = self.channels.lock().expect("channels lock");
        if let Some(channel) = channels.get(&address) {
            return Ok(channel.clone());
        }
        let channel = cellmesh_proto::tls::endpoint(address.clone())
            .map(|e| {
                // A connection that went silent (a partition) is dropped
                // and dialled again within seconds.
                e.connect_timeout(Duration::from_secs(1))
                    .tcp_nodelay(true)
                    .http2_keep_alive_interval(Duration::from_secs(1))
                    .keep_alive_timeout(Duration::from_secs(2))
                    .keep_alive_while_idle(true)
                    .dial_lazy()
            })
            .map_err(|e| e.to_string())?;
        channels.insert(address, channel.clone());
        Ok(channel)
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &RouterNode) -> PeerClient {
        let address = cellmesh_proto::config::via(&self.links, &node.raft_addr).to_string();
        PeerClient {
            target,
            client: self.channel(address).map(|channel| {
                RaftPeerClient::new(channel)
                    .max_decoding_message_size(MAX_RAFT_MESSAGE)
                    .max_encoding_message_size(MAX_RAFT_MESSAGE)
            }),
            secret: self.secret.clone(),
        }
    }
}

/// The metadata naming the node a Raft RPC is for: a replica that is
/// another node (a new member on a lost member's address) refuses it, so
/// the sender treats the lost member as unreachable instead of taking the
/// newcomer's empty log for that member's.
pub const ADDRESSEE: &str = "cellmesh-raft-to";

pub struct PeerClient {
    target: NodeId,
    client: Result<RaftPeerClient<Channel>, String>,
    secret: ClusterSecret,
}

impl PeerClient {
    /// The client, or why its address never parsed.
    fn client(&mut self) -> Result<&mut RaftPeerClient<Channel>, std::io::Error> {
        self.client
            .as_mut()
            .map_err(|e| std::io::Error::other(e.clone()))
    }

    fn request<T>(&self, message: T, option: &RPCOption) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(option.hard_ttl());
        self.secret.attach(&mut request);
        request
            .metadata_mut()
            .insert(ADDRESSEE, self.target.to_string().parse().expect("digits"));
        request
    }
}

/// A transport failure or a peer that refused (stopped, shutting down):
/// openraft backs off and retries.
fn unreachable<E: std::error::Error>(
    cause: impl std::error::Error + 'static,
) -> RPCError<NodeId, RouterNode, RaftError<NodeId, E>> {
    RPCError::Unreachable(Unreachable::new(&cause))
}

fn garbled<E: std::error::Error>(
    e: wire::Malformed,
) -> RPCError<NodeId, RouterNode, RaftError<NodeId, E>> {
    RPCError::Network(NetworkError::new(&e))
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, RouterNode, RaftError<NodeId>>>
    {
        let request = self.request(wire::append_request_to_pb(&rpc), &option);
        let sent = std::time::Instant::now();
        let reply = self
            .client()
            .map_err(unreachable)?
            .append_entries(request)
            .await;
        crate::metrics::phases()
            .append_rpc
            .observe(sent.elapsed().as_secs_f64());
        wire::append_response_from_pb(reply.map_err(unreachable)?.into_inner()).map_err(garbled)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, RouterNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let request = self.request(wire::snapshot_request_to_pb(&rpc), &option);
        let reply = self
            .client()
            .map_err(unreachable)?
            .install_snapshot(request)
            .await;
        let answer = wire::snapshot_response_from_pb(reply.map_err(unreachable)?.into_inner())
            .map_err(garbled)?;
        answer.map_err(|e| {
            RPCError::RemoteError(RemoteError::new(self.target, RaftError::APIError(e)))
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, RouterNode, RaftError<NodeId>>> {
        let request = self.request(wire::vote_request_to_pb(&rpc), &option);
        let reply = self.client().map_err(unreachable)?.vote(request).await;
        wire::vote_response_from_pb(reply.map_err(unreachable)?.into_inner()).map_err(garbled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every client openraft makes for a peer (one per leadership check of
    /// a linearizable read) shares that peer's one channel.
    #[tokio::test]
    async fn clients_for_one_peer_share_its_channel() {
        let mut network = Network::new(ClusterSecret::new("s"), Default::default());
        let node = |port: u16| RouterNode {
            region: "r".into(),
            raft_addr: format!("http://127.0.0.1:{port}"),
            api_addr: String::new(),
        };
        for _ in 0..3 {
            let client = network.new_client(2, &node(1)).await;
            assert!(client.client.is_ok());
        }
        assert_eq!(network.channels.lock().unwrap().len(), 1);
        let _ = network.new_client(3, &node(2)).await;
        assert_eq!(network.channels.lock().unwrap().len(), 2);
    }
}
