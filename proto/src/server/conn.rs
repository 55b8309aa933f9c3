//! Accepted connections: Nagle's algorithm off (small gRPC frames, acks
//! and Raft appends, must not wait for delayed ACKs), closed once idle
//! ([`Guarded`]), and on a TLS server handshaken off the accept loop (a
//! slow or silent client holds up no one; one that has not finished within
//! [`HANDSHAKE`] is dropped), writes gathered into fewer system calls
//! ([`Coalesced`]). Each request learns its connection's [`ConnInfo`]: the
//! remote address, and who the client certificate names.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};
use tokio_stream::Stream;
use tonic::transport::server::Connected;

use super::coalesce::Coalesced;
use crate::tls::Peer;

/// A TLS handshake not done in this long is dropped.
pub const HANDSHAKE: Duration = Duration::from_secs(10);

/// The server side of TLS, as it is at each handshake (files reloaded).
pub type TlsSource = Arc<dyn Fn() -> Arc<rustls::ServerConfig> + Send + Sync>;

/// What a request knows of its connection.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub remote: Option<SocketAddr>,
    /// Who the client's certificate names (`None` on plaintext, or for a
    /// certificate without a cellmesh identity).
    pub peer: Option<Peer>,
    /// The client certificate's serial number, checked against the
    /// revocation list at every call (a connection outlives a revocation).
    pub serial: Option<Arc<[u8]>>,
}

/// Connections accepted from `listener`, closed once idle for `idle`, and
/// handshaken with `tls` when given.
pub fn incoming_with(
    listener: tokio::net::TcpListener,
    idle: Duration,
    tls: Option<TlsSource>,
) -> impl Stream<Item = std::io::Result<Conn>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(accept(listener, idle, tls, tx));
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

type Accepted = mpsc::Sender<std::io::Result<Conn>>;

/// Accepts until the server drops its end. An error accepting (out of
/// file descriptors) is waited out, not the end of the server.
async fn accept(
    listener: tokio::net::TcpListener,
    idle: Duration,
    tls: Option<TlsSource>,
    tx: Accepted,
) {
    loop {
        let accepted = tokio::select! {
            _ = tx.closed() => return,
            accepted = listener.accept() => accepted,
        };
        let (io, remote) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if io.set_nodelay(true).is_err() {
            continue;
        }
        let io = Guarded::new(io, idle);
        let Some(tls) = &tls else {
            let conn = Conn {
                io: Coalesced::new(Io::Plain(io)),
                info: ConnInfo {
                    remote: Some(remote),
                    peer: None,
                    serial: None,
                },
            };
            if tx.send(Ok(conn)).await.is_err() {
                return;
            }
            continue;
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(tls());
        let tx = tx.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE, acceptor.accept(io)).await {
                Ok(Ok(stream)) => {
                    let cert = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|certs| certs.first());
                    let conn = Conn {
                        info: ConnInfo {
                            remote: Some(remote),
                            peer: cert.and_then(|cert| Peer::of_certificate(cert.as_ref())),
                            serial: cert.and_then(|cert| crate::tls::serial_of(cert.as_ref())),
                        },
                        io: Coalesced::new(Io::Tls(Box::new(stream))),
                    };
                    let _ = tx.send(Ok(conn)).await;
                }
                Ok(Err(e)) => tracing::debug!(%remote, error = %e, "TLS handshake refused"),
                Err(_) => tracing::debug!(%remote, "TLS handshake timed out"),
            }
        });
    }
}

/// An accepted connection, plaintext or TLS.
pub struct Conn {
    io: Coalesced<Io>,
    info: ConnInfo,
}

enum Io {
    Plain(Guarded),
    Tls(Box<tokio_rustls::server::TlsStream<Guarded>>),
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(io) => Pin::new(io).poll_read(cx, buf),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(io) => Pin::new(io).poll_write(cx, buf),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(io) => io.is_write_vectored(),
            Io::Tls(io) => io.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(io) => Pin::new(io).poll_flush(cx),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(io) => Pin::new(io).poll_shutdown(cx),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_shutdown(cx),
        }
    }
}

/// An accepted connection that fails its reads (and so is closed) once
/// nothing has arrived for its idle limit. A read only notes its time; the
/// timer is moved on when it fires early, not at every read.
pub struct Guarded {
    io: TcpStream,
    idle: Duration,
    last_read: Instant,
    deadline: Pin<Box<Sleep>>,
}

impl Guarded {
    fn new(io: TcpStream, idle: Duration) -> Self {
        Self {
            io,
            idle,
            last_read: Instant::now(),
            deadline: Box::pin(tokio::time::sleep(idle)),
        }
    }

    /// Ready when the connection has been idle for its limit.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        while self.deadline.as_mut().poll(cx).is_ready() {
            let due = self.last_read + self.idle;
            if due <= Instant::now() {
                return Poll::Ready(());
            }
            self.deadline.as_mut().reset(due);
        }
        Poll::Pending
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.last_read = Instant::now();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match self.poll_idle(cx) {
                Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "connection idle: closed",
                ))),
                Poll::Pending => Poll::Pending,
            },
            ready => ready,
        }
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
