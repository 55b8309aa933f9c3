//! What every cellmesh gRPC server shares: the standard services it
//! carries next to its own (`grpc.health.v1.Health` for load balancers and
//! probes, server reflection for generic tools such as grpcurl), and how it
//! holds connections ([`builder`], [`incoming`]): HTTP/2 keepalive pings,
//! and a connection that sends nothing for [`IDLE`] (one that never
//! completes its handshake, or a peer gone silent) is closed.

use std::sync::Arc;
use std::time::Duration;

use tokio_stream::Stream;
use tonic::server::NamedService;
use tonic_health::server::{HealthReporter, health_reporter};

mod coalesce;
mod conn;
pub use conn::{Conn, ConnInfo, HANDSHAKE, TlsSource, incoming_with};
pub use tonic_health::server::HealthReporter as Reporter;

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

/// The server builder every internal cellmesh server starts from, served
/// with [`incoming`]: with this process's TLS installed ([`crate::tls`])
/// it takes only clients with a certificate the CA signed, and only for
/// the services their role may call.
pub fn builder() -> tonic::transport::Server<
    tower::layer::util::Stack<crate::tls::Authorize, tower::layer::util::Identity>,
> {
    public_builder().layer(crate::tls::Authorize)
}

/// A client-facing server (the edge's): keepalive and idle limits, no
/// client certificates.
pub fn public_builder() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
}

/// Connections accepted from `listener` for an internal server: mutual
/// TLS when this process's TLS is installed, each closed once idle for
/// [`IDLE`].
pub fn incoming(listener: tokio::net::TcpListener) -> impl Stream<Item = std::io::Result<Conn>> {
    let tls = crate::tls::installed().map(|tls| -> TlsSource { Arc::new(|| tls.server_config()) });
    incoming_with(listener, IDLE, tls)
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
        let incoming = super::incoming_with(listener, idle, None).map(move |connection| {
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
