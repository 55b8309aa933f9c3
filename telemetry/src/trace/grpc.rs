//! The trace context over gRPC: [`TraceLayer`] on every server opens a
//! span per call whose parent is the caller's `traceparent` header, and
//! [`Traced`] on every client channel writes the current span's context
//! into each call's headers. Handlers name what the call is about on the
//! server span ([`record_call`]). Both do nothing while traces are off.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tower::{Layer, Service};
use tracing::Instrument;
use tracing::field::Empty;

use super::propagate::{extract, inject};

/// A client channel whose calls carry the caller's trace context.
pub type Channel = Traced<tonic::transport::Channel>;

/// Wraps `channel` so its calls carry the trace context.
pub fn channel(channel: tonic::transport::Channel) -> Channel {
    Traced(channel)
}

#[derive(Clone, Debug)]
pub struct Traced<S>(S);

impl<S, B> Service<http::Request<B>> for Traced<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        if super::enabled() {
            inject(&tracing::Span::current(), request.headers_mut());
        }
        self.0.call(request)
    }
}

/// Opens a span per served call (`Server::builder().layer(..)`).
#[derive(Clone, Copy, Debug, Default)]
pub struct TraceLayer;

impl<S> Layer<S> for TraceLayer {
    type Service = TracedServer<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TracedServer { inner }
    }
}

#[derive(Clone, Debug)]
pub struct TracedServer<S> {
    inner: S,
}

impl<S, B, R> Service<http::Request<B>> for TracedServer<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if !super::enabled() {
            return Box::pin(self.inner.call(request));
        }
        let method = request.uri().path().trim_start_matches('/').to_string();
        // Background calls (probes, stats, Raft, replication) start no
        // trace of their own: only client requests and operator calls do,
        // and any call made on behalf of a traced one.
        let carried = request.headers().contains_key("traceparent");
        if !carried && !starts_traces(&method) {
            return Box::pin(self.inner.call(request));
        }
        let span = tracing::info_span!(
            "rpc",
            otel.name = %method,
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.grpc.status_code = Empty,
            tenant = Empty,
            conv_id = Empty,
            user_id = Empty,
            req_id = Empty,
            cellmesh.large_group = Empty,
        );
        extract(&span, request.headers());
        let call = {
            let _entered = span.enter();
            self.inner.call(request)
        };
        Box::pin(
            async move {
                let response = call.await;
                if let Ok(response) = &response {
                    let code = response
                        .headers()
                        .get("grpc-status")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<i64>().ok())
                        .unwrap_or(0);
                    tracing::Span::current().record("rpc.grpc.status_code", code);
                }
                response
            }
            .instrument(span),
        )
    }
}

/// Services whose calls may start a trace: the client-facing API and the
/// operators' admin API.
const TRACE_ROOTS: [&str; 3] = [
    "cellmesh.v1.Messaging/",
    "cellmesh.v1.Sync/",
    "cellmesh.v1.Operations/",
];

fn starts_traces(method: &str) -> bool {
    TRACE_ROOTS.iter().any(|root| method.starts_with(root))
}

/// What a call is about, on the current call's span: the tenant, the
/// conversation, the user and the client's request id (zeros and empty
/// strings are left out).
pub fn record_call(tenant: u64, conversation: u64, user: u64, req_id: &str) {
    if !super::enabled() {
        return;
    }
    let span = tracing::Span::current();
    for (field, value) in [
        ("tenant", tenant),
        ("conv_id", conversation),
        ("user_id", user),
    ] {
        if value != 0 {
            span.record(field, value);
        }
    }
    if !req_id.is_empty() {
        span.record("req_id", req_id);
    }
}

/// Marks the current call as a send to a large group, before anything
/// starts its span: the sampler keeps such traces more often.
pub fn record_large_group() {
    if super::enabled() {
        tracing::Span::current().record(super::sampler::LARGE_GROUP, true);
    }
}

/// `channel.traced()`: [`channel`] as a method, at the end of a builder chain.
pub trait Traceable {
    fn traced(self) -> Channel;
}

impl Traceable for tonic::transport::Channel {
    fn traced(self) -> Channel {
        channel(self)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_client_and_operator_calls_start_traces() {
        assert!(super::starts_traces("cellmesh.v1.Messaging/Send"));
        assert!(super::starts_traces("cellmesh.v1.Operations/Start"));
        assert!(!super::starts_traces("grpc.health.v1.Health/Check"));
        assert!(!super::starts_traces("cellmesh.v1.CellPeer/Stats"));
        assert!(!super::starts_traces("cellmesh.raft.v1.RaftPeer/Append"));
    }
}
