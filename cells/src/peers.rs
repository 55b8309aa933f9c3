//! How this cell dials another cell's `CellPeer` service: through the
//! configured `links` (a proxy standing in for an address), with this
//! process's TLS when it has one, a connect timeout, trace propagation and
//! the peers' 64 MiB message limits — one place for what every caller
//! (forwarders, sync replication, mark rounds, meta fetches) needs.

use std::collections::BTreeMap;
use std::time::Duration;

use cellmesh_proto::tls::Dial;
use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
use cellmesh_telemetry::trace::grpc::{Channel, Traceable};

/// The largest message a peer call carries either way.
const MAX_MESSAGE: usize = 64 << 20;

/// A lazily connecting client of the cell at `address`; why not, when the
/// address (or the link standing in for it) is not a valid endpoint.
pub fn dial(
    links: &BTreeMap<String, String>,
    address: &str,
) -> Result<CellPeerClient<Channel>, String> {
    let via = cellmesh_proto::config::via(links, address);
    let channel = cellmesh_proto::tls::endpoint(via.to_string())
        .map_err(|e| format!("{address}: {e}"))?
        .connect_timeout(Duration::from_secs(2))
        .dial_lazy()
        .traced();
    Ok(CellPeerClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE))
}
