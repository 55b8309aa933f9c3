//! What a route client says about its copy of the route table: the log
//! index it has applied (against the routers' `cellmesh_raft_applied_index`
//! that is its apply lag, e.g. `max(cellmesh_raft_applied_index) -
//! cellmesh_route_client_applied_index`) and how often its watch stream
//! had to be opened again.

use std::sync::LazyLock;

use cellmesh_telemetry::{Counter, Gauge, counter, gauge};

pub(crate) struct RouteClientMetrics {
    pub applied_index: Gauge,
    pub rewatches: Counter,
}

static METRICS: LazyLock<RouteClientMetrics> = LazyLock::new(|| RouteClientMetrics {
    applied_index: gauge(
        "cellmesh_route_client_applied_index",
        "Route-table log index this process's copy has applied.",
    ),
    rewatches: counter(
        "cellmesh_route_client_rewatches",
        "Times the route watch stream was opened again (after a break or on another replica).",
    ),
});

pub(crate) fn metrics() -> &'static RouteClientMetrics {
    &METRICS
}
