//! The trace context over gRPC: the server layer
//! ([`crate::server::ServerLayer`]) opens a span per traced call whose
//! parent is the caller's `traceparent` header ([`CallTrace`]), and
//! [`Traced`] on every client channel writes the current span's context
//! into each call's headers. Handlers name what the call is about on the
//! server span ([`record_call`]). Both do nothing while traces are off.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tower::Service;
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

/// What the server layer does for one call's trace.
pub(crate) enum CallTrace {
    /// Nothing (traces off, or a background call with no context).
    None,
    /// Records nothing; the calls it makes carry the "not sampled" context.
    Unsampled(http::HeaderValue),
    /// The call's span.
    Span(tracing::Span),
}

impl CallTrace {
    /// The trace of a call to `path` with `headers`.
    pub(crate) fn of(headers: &http::HeaderMap, path: &str) -> Self {
        if !super::enabled() {
            return CallTrace::None;
        }
        match head(headers, path) {
            Head::Skip => CallTrace::None,
            Head::Unsampled(traceparent) => CallTrace::Unsampled(traceparent),
            Head::Sampled => {
                let span = call_span(path, false);
                extract(&span, headers);
                CallTrace::Span(span)
            }
            Head::Root => CallTrace::Span(call_span(path, true)),
        }
    }

    pub(crate) fn is_none(&self) -> bool {
        matches!(self, CallTrace::None)
    }

    /// Runs `f` (the inner service's `call`) inside the call's span.
    pub(crate) fn enter<T>(&self, f: impl FnOnce() -> T) -> T {
        match self {
            CallTrace::Span(span) => span.in_scope(f),
            _ => f(),
        }
    }

    /// The call's future, in its span or with the unsampled context.
    pub(crate) fn run<E, R>(
        self,
        call: impl Future<Output = Result<http::Response<R>, E>> + Send + 'static,
    ) -> Pin<Box<dyn Future<Output = Result<http::Response<R>, E>> + Send>>
    where
        E: Send + 'static,
        R: Send + 'static,
    {
        match self {
            CallTrace::None => Box::pin(call),
            // Nothing of an unsampled call is recorded, but its calls
            // onwards carry the decision, so no process decides again.
            CallTrace::Unsampled(traceparent) => Box::pin(UNSAMPLED.scope(traceparent, call)),
            CallTrace::Span(span) => Box::pin(
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
            ),
        }
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
