//! Why a control-plane replica did not start, by cause: its config, its
//! TLS files, the route table, the coordination store, or a listener.

use cellmesh_proto::config::ConfigError;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("tls: {0}")]
    Tls(String),
    #[error("cannot reach the route table: {}", .0.message())]
    Routes(tonic::Status),
    #[error("cannot open the coordination store: {0}")]
    Coordination(#[from] cellmesh_coord::CoordError),
    #[error("{what} {listen:?} is not an address: {source}")]
    Address {
        what: &'static str,
        listen: String,
        source: std::net::AddrParseError,
    },
    #[error("{what} {listen}: {source}")]
    Listen {
        what: &'static str,
        listen: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot serve metrics: {0}")]
    Metrics(String),
}

impl StartError {
    /// `listen` (the setting `what`) as a socket address.
    pub(crate) fn address(what: &'static str, listen: &str) -> Result<std::net::SocketAddr, Self> {
        listen.parse().map_err(|source| StartError::Address {
            what,
            listen: listen.to_string(),
            source,
        })
    }
}
