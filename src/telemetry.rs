//! Logging set-up and the process's shutdown signal.

use tracing_subscriber::EnvFilter;

/// Structured logs to stderr, filtered by `RUST_LOG` (default `info`).
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

pub use cellmesh_proto::server::shutdown_signal;
