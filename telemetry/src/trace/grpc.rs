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
            let span = tracing::Span::current();
            if !span.is_disabled() {
                inject(&span, request.headers_mut());
            } else if let Ok(value) = UNSAMPLED.try_with(|v| v.clone()) {
                request.headers_mut().insert("traceparent", value);
            }
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
        let path = request.uri().path();
        let span = match head(request.headers(), path) {
            Head::Skip => return Box::pin(self.inner.call(request)),
            // Nothing of an unsampled call is recorded, but its calls
            // onwards carry the decision, so no process decides again.
            Head::Unsampled(traceparent) => {
                return Box::pin(UNSAMPLED.scope(traceparent, self.inner.call(request)));
            }
            Head::Sampled => {
                let span = call_span(path, false);
                extract(&span, request.headers());
                span
            }
            Head::Root => call_span(path, true),
        };
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

tokio::task_local! {
    /// The context of the unsampled call being served (its flags say "not
    /// sampled"), passed on to the calls it makes.
    static UNSAMPLED: http::HeaderValue;
}

/// The context of a call that starts an unsampled trace.
const NOT_SAMPLED: &str = "00-00000000000000000000000000000001-0000000000000001-00";

/// What the server does with a call's trace.
enum Head {
    /// Nothing: a background call with no trace context.
    Skip,
    /// Records nothing, passes the decision on.
    Unsampled(http::HeaderValue),
    /// A span whose parent is the caller's.
    Sampled,
    /// A span that starts a trace kept by the head decision.
    Root,
}

/// The head-based decision for a call to `path`: the caller's if it sent
/// one, else (a client or operator call) a draw at the sample ratio;
/// background calls (probes, stats, Raft, replication) start no trace.
fn head(headers: &http::HeaderMap, path: &str) -> Head {
    match headers.get("traceparent") {
        Some(value) if sampled(value) => Head::Sampled,
        Some(value) => Head::Unsampled(value.clone()),
        None if !starts_traces(path.trim_start_matches('/')) => Head::Skip,
        None if rand::random::<f64>() < super::sample_ratio() => Head::Root,
        None => Head::Unsampled(http::HeaderValue::from_static(NOT_SAMPLED)),
    }
}

/// Whether a `traceparent` value has the sampled flag.
fn sampled(value: &http::HeaderValue) -> bool {
    let bytes = value.as_bytes();
    // version-traceid-parentid-flags: the flags are the last two hex digits.
    bytes.len() >= 55
        && bytes
            .last()
            .and_then(|b| (*b as char).to_digit(16))
            .is_some_and(|flags| flags & 1 == 1)
}

/// The span of one served call.
fn call_span(path: &str, root: bool) -> tracing::Span {
    let method = path.trim_start_matches('/');
    tracing::info_span!(
        "rpc",
        otel.name = %method,
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.grpc.status_code = Empty,
        tenant = Empty,
        conv_id = Empty,
        user_id = Empty,
        req_id = Empty,
        { super::sampler::ALWAYS } = root,
    )
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

    #[test]
    fn the_sampled_flag_is_read_from_traceparent() {
        let value = |s: &'static str| http::HeaderValue::from_static(s);
        assert!(super::sampled(&value(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        )));
        assert!(!super::sampled(&value(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
        )));
        assert!(!super::sampled(&value(super::NOT_SAMPLED)));
        assert!(!super::sampled(&value("garbage-01")));
    }
}
