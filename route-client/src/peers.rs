//! How any process dials a cell named in the route table: through the
//! deployment's `links` (a proxy standing in for an address), with this
//! process's TLS when it has one, a connect timeout, `TCP_NODELAY`, trace
//! propagation and the peers' 64 MiB message limits, one lazily connecting
//! channel per address. Cells (forwarders, replication, mark rounds, copy
//! sources, meta fetches), the control plane (moves, backfills), edges and
//! the drills all dial through [`Peers`], so a configured link carries
//! every kind of traffic.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellmesh_proto::tls::Dial;
use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
use cellmesh_telemetry::trace::grpc::{Channel, Traceable};

/// The largest message a peer call carries either way.
pub const MAX_MESSAGE: usize = 64 << 20;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// An address (or the link standing in for it) that is not an endpoint.
#[derive(Debug, Clone, thiserror::Error)]
#[error("cell address {address:?}: {message}")]
pub struct DialError {
    pub address: String,
    pub message: String,
}

/// Channels to cells by address, through `links`; clones share them.
#[derive(Clone, Default)]
pub struct Peers {
    links: Arc<BTreeMap<String, String>>,
    channels: Arc<Mutex<HashMap<String, Channel>>>,
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peers").field("links", &self.links).finish()
    }
}

impl Peers {
    pub fn new(links: BTreeMap<String, String>) -> Self {
        Self {
            links: Arc::new(links),
            channels: Arc::default(),
        }
    }

    /// What `address` is dialled as (its link, or itself).
    pub fn via<'a>(&'a self, address: &'a str) -> &'a str {
        cellmesh_proto::config::via(&self.links, address)
    }

    /// The channel to the process at `address` (connecting on first use).
    pub fn channel(&self, address: &str) -> Result<Channel, DialError> {
        let via = self.via(address);
        let mut channels = self.channels.lock().expect("peer channels");
        if let Some(channel) = channels.get(via) {
            return Ok(channel.clone());
        }
        let channel = cellmesh_proto::tls::endpoint(via.to_string())
            .map_err(|e| DialError {
                address: address.to_string(),
                message: e.to_string(),
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .dial_lazy()
            .traced();
        channels.insert(via.to_string(), channel.clone());
        Ok(channel)
    }

    /// A `CellPeer` client of the cell at `address`.
    pub fn cell(&self, address: &str) -> Result<CellPeerClient<Channel>, DialError> {
        Ok(CellPeerClient::new(self.channel(address)?)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE))
    }

    /// A `Backups` client of the cell at `address`.
    pub fn backups(
        &self,
        address: &str,
    ) -> Result<cellmesh_proto::v1::backups_client::BackupsClient<Channel>, DialError> {
        Ok(cellmesh_proto::v1::backups_client::BackupsClient::new(
            self.channel(address)?,
        ))
    }

    /// Forgets the channel of `address` (its process came back elsewhere,
    /// or its connection is suspect).
    pub fn forget(&self, address: &str) {
        let via = self.via(address).to_string();
        self.channels.lock().expect("peer channels").remove(&via);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_link_stands_in_for_its_address_and_channels_are_shared() {
        let links = BTreeMap::from([("http://10.0.0.9:7000".into(), "http://127.0.0.1:1".into())]);
        let peers = Peers::new(links);
        assert_eq!(peers.via("http://10.0.0.9:7000"), "http://127.0.0.1:1");
        assert_eq!(peers.via("http://127.0.0.1:2"), "http://127.0.0.1:2");
        peers.cell("http://10.0.0.9:7000").unwrap();
        peers.clone().cell("http://127.0.0.1:1").unwrap();
        assert_eq!(
            peers.channels.lock().unwrap().len(),
            1,
            "one channel per link"
        );
        peers.forget("http://10.0.0.9:7000");
        assert!(peers.channels.lock().unwrap().is_empty());
        let err = peers.cell("not an address").unwrap_err();
        assert_eq!(err.address, "not an address");
    }
}
