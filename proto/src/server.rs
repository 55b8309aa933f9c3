//! What every cellmesh gRPC server shares: the standard services it
//! carries next to its own (`grpc.health.v1.Health` for load balancers and
//! probes, server reflection for generic tools such as grpcurl), and how it
//! holds connections ([`builder`], [`incoming`]): HTTP/2 keepalive pings,
//! and a connection that sends nothing for [`IDLE`] (one that never
//! completes its handshake, or a peer gone silent) is closed.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tonic::server::NamedService;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic_health::server::{HealthReporter, health_reporter};

/// Health and reflection services, with `S` reported as serving.
/// Reflection is served as `v1` and as `v1alpha` (what standard clients
/// such as Python's grpcio-reflection speak).
pub struct StandardServices<H, R, A> {
    pub health: H,
    pub reflection: R,
    pub reflection_v1alpha: A,
    pub reporter: HealthReporter,
}

/// Builds the standard services for a server whose main service is `S`
/// and that serves the services named in `also` beside it: reflection
/// lists those, health and reflection, nothing else of the descriptor set.
pub async fn standard_services<S: NamedService>(
    also: &[&str],
) -> Result<
    StandardServices<
        tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    >,
    tonic_reflection::server::Error,
> {
    let (reporter, health) = health_reporter();
    reporter.set_serving::<S>().await;
    let served: Vec<&str> = [S::NAME]
        .into_iter()
        .chain(also.iter().copied())
        .chain([
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
        ])
        .collect();
    let builder = || {
        served.iter().fold(
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(crate::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET),
            |builder, name| builder.with_service_name(*name),
        )
    };
    Ok(StandardServices {
        health,
        reflection: builder().build_v1()?,
        reflection_v1alpha: builder().build_v1alpha()?,
        reporter,
    })
}

/// Reports the whole server (the empty service name, what probes ask
/// about) as not serving, e.g. after its storage failed.
pub async fn report_not_serving(reporter: &HealthReporter) {
    reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
}

/// How often a server pings each connection, and how long it waits for
/// the answer before it drops the connection.
pub const KEEPALIVE: Duration = Duration::from_secs(20);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection from which nothing arrives this long is closed. A live
/// client answers the pings every [`KEEPALIVE`], so only a peer that never
/// completed its handshake, or stopped answering, stays this quiet.
pub const IDLE: Duration = Duration::from_secs(60);

/// The server builder every internal cellmesh server starts from: with
/// this process's TLS installed ([`crate::tls`]) it takes only clients
/// with a certificate the CA signed, and only for the services their role
/// may call.
pub fn builder() -> tonic::transport::Server<
    tower::layer::util::Stack<crate::tls::Authorize, tower::layer::util::Identity>,
> {
    let server = public_builder();
    let server = match crate::tls::installed() {
        Some(tls) => server
            .tls_config(crate::tls::server_config(tls))
            .expect("checked when installed"),
        None => server,
    };
    server.layer(crate::tls::Authorize)
}

/// A client-facing server (the edge's): keepalive and idle limits, no
/// client certificates.
pub fn public_builder() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
}

/// Connections accepted from `listener` with Nagle's algorithm off (small
/// gRPC frames, acks and Raft appends, must not wait for delayed ACKs),
/// each closed once idle for [`IDLE`].
pub fn incoming(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<Guarded>> {
    incoming_with(listener, IDLE)
}

/// [`incoming`] with another idle limit.
pub fn incoming_with(
    listener: tokio::net::TcpListener,
    idle: Duration,
) -> impl tokio_stream::Stream<Item = std::io::Result<Guarded>> {
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(move |stream| {
        let stream = stream?;
        stream.set_nodelay(true)?;
        Ok(Guarded::new(stream, idle))
    })
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

impl Connected for Guarded {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutdown requested");
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use tokio::io::AsyncReadExt;
    use tokio_stream::StreamExt;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    #[tokio::test]
    async fn a_silent_connection_is_closed_and_a_talking_one_is_not() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (_reporter, health) = tonic_health::server::health_reporter();
        let idle = Duration::from_millis(300);
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        let incoming = super::incoming_with(listener, idle).map(move |connection| {
            counted.fetch_add(1, Ordering::SeqCst);
            connection
        });
        tokio::spawn(
            super::builder()
                .add_service(health)
                .serve_with_incoming(incoming),
        );
        // Connects and never sends the HTTP/2 preface.
        let mut silent = tokio::net::TcpStream::connect(address).await.unwrap();
        let mut buf = [0u8; 64];
        let closed = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match silent.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => continue,
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "the silent connection is still open");
        // Calls spaced below the limit keep their connection.
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = HealthClient::new(channel);
        for _ in 0..8 {
            client
                .check(HealthCheckRequest::default())
                .await
                .expect("served");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The silent connection and the client's one: never cut and redialled.
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }
}
