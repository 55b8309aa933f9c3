//! What a cellmesh process says about itself. Every role registers its
//! metrics in one process-wide Prometheus registry ([`registry`]), serves
//! them as Prometheus text at `/metrics` on its admin HTTP port
//! ([`admin::serve`]), and wraps its gRPC server in one layer that counts
//! and times every call by method and stable error code and places it in
//! its trace ([`server::ServerLayer`]).
//! [`scrape`] reads such an exposition back (the console's panels).
//! [`trace`] exports OpenTelemetry spans and carries the trace context
//! across processes.
//! Which process, cell and region a series belongs to is the scraper's
//! target labels, not part of the series.

pub mod admin;
pub mod process;
pub mod registry;
pub mod rpc;
pub mod scrape;
pub mod server;
pub mod trace;

pub use prometheus_client::metrics::{
    counter::Counter, family::Family, gauge::Gauge, histogram::Histogram,
};
pub use registry::{
    Unit, counter, counter_family, encode, float_gauge, float_gauge_family, gauge, gauge_family,
    histogram, histogram_family, latency_buckets, size_buckets,
};
