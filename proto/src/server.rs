//! The standard services every cellmesh gRPC server carries next to its own:
//! `grpc.health.v1.Health` (for load balancers and probes) and server
//! reflection (for generic tools such as grpcurl).

use tonic::server::NamedService;
use tonic_health::server::{HealthReporter, health_reporter};

/// Health and reflection services, with `S` reported as serving.
pub struct StandardServices<H, R> {
    pub health: H,
    pub reflection: R,
    pub reporter: HealthReporter,
}

/// Builds the standard services for a server whose main service is `S`.
pub async fn standard_services<S: NamedService>() -> Result<
    StandardServices<
        tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
    >,
    tonic_reflection::server::Error,
> {
    let (reporter, health) = health_reporter();
    reporter.set_serving::<S>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    Ok(StandardServices {
        health,
        reflection,
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

/// Connections accepted from `listener` with Nagle's algorithm off: small
/// gRPC frames (acks, Raft appends) must not wait for delayed ACKs.
pub fn incoming(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|stream| {
        let stream = stream?;
        stream.set_nodelay(true)?;
        Ok(stream)
    })
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
