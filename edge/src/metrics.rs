//! The edge's own series next to its RPC layer's: how often a client
//! request had to be tried again at a cell, and why (`wrong_cell` after a
//! route moved, `no_route`, a cell's `frozen`, `route_behind` or
//! `owner_lease_expired` answer, or `owner_unreachable`).

use std::sync::LazyLock;

use cellmesh_telemetry::{Counter, Family, counter_family};
use prometheus_client::encoding::EncodeLabelSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RetryLabels {
    pub reason: &'static str,
}

static RETRIES: LazyLock<Family<RetryLabels, Counter>> = LazyLock::new(|| {
    counter_family(
        "cellmesh_edge_retries",
        "Client requests the edge tried again at a cell, by why.",
    )
});

/// Counts one retry of a client request.
pub(crate) fn retried(reason: &'static str) {
    if cellmesh_telemetry::registry::enabled() {
        RETRIES.get_or_create(&RetryLabels { reason }).inc();
    }
}
