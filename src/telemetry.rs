//! Logging and trace set-up, and the process's shutdown signal. Logs go
//! to stderr, filtered by `RUST_LOG` (default `info`); a role whose config
//! names a `[telemetry] endpoint` also exports the cellmesh crates' spans
//! over OTLP.

use cellmesh_telemetry::trace::filter::CellmeshSpans;
use cellmesh_telemetry::trace::{Identity, TraceConfig, TraceGuard};
use tracing_subscriber::filter::EnvFilter;
use tracing_subscriber::prelude::*;

fn log_layer<S>() -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(filter)
}

/// Logs only (tools and `--check-config`).
pub fn init() {
    let _ = tracing_subscriber::registry().with(log_layer()).try_init();
}

/// Logs, and spans exported as `config` says. Keep the guard until the
/// process ends: dropping it flushes the last spans.
pub fn init_traced(config: &TraceConfig, identity: Identity) -> anyhow::Result<Option<TraceGuard>> {
    let registry = tracing_subscriber::registry().with(log_layer());
    match cellmesh_telemetry::trace::layer(config, &identity).map_err(anyhow::Error::msg)? {
        Some((spans, guard)) => {
            let _ = registry
                .with(spans.with_filter(CellmeshSpans::default()))
                .try_init();
            tracing::info!(endpoint = %config.endpoint, ratio = config.sample_ratio, "exporting traces");
            Ok(Some(guard))
        }
        None => {
            let _ = registry.try_init();
            Ok(None)
        }
    }
}

pub use cellmesh_proto::server::shutdown_signal;
