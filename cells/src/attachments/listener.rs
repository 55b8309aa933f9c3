//! The file listener over TLS (`[attachments] tls`): connections
//! handshaken by the same acceptor the gRPC servers use (certificate files
//! watched and reloaded), handed to axum one by one.

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};

use cellmesh_proto::server::{Conn, TlsSource, incoming_with};

/// A connection idle this long is closed (uploads of a part keep it busy).
const IDLE: Duration = Duration::from_secs(300);

pub struct TlsListener {
    incoming: Pin<Box<dyn Stream<Item = std::io::Result<Conn>> + Send>>,
    addr: std::net::SocketAddr,
}

impl TlsListener {
    pub fn new(listener: tokio::net::TcpListener, tls: TlsSource) -> Self {
        let addr = listener
            .local_addr()
            .unwrap_or_else(|_| std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
        Self {
            incoming: Box::pin(incoming_with(listener, IDLE, Some(tls))),
            addr,
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = Conn;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.incoming.next().await {
                Some(Ok(conn)) => return (conn, self.addr),
                // A failed handshake is that client's problem only.
                Some(Err(e)) => tracing::debug!(error = %e, "a file client's connection failed"),
                // The acceptor ends only with the process.
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}
