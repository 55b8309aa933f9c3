//! The W3C trace context (`traceparent`) in and out of carriers: HTTP/gRPC
//! headers, and a plain string stored in the records one stage hands the
//! next (outbox event, queue record, forwarded event), so a span started
//! later in another task or process joins the trace of the send that wrote
//! the record.

use std::collections::HashMap;

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TraceContextExt;
use tracing_opentelemetry::OpenTelemetrySpanExt;

const TRACEPARENT: &str = "traceparent";

pub(crate) struct HeaderInjector<'a>(pub &'a mut http::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            http::header::HeaderName::from_bytes(key.as_bytes()),
            http::header::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

pub(crate) struct HeaderExtractor<'a>(pub &'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Writes `span`'s context into `headers` (nothing when traces are off).
pub fn inject(span: &tracing::Span, headers: &mut http::HeaderMap) {
    if !super::enabled() || span.is_disabled() {
        return;
    }
    let cx = span.context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut HeaderInjector(headers))
    });
}

/// Makes the context in `headers` the parent of `span`.
pub fn extract(span: &tracing::Span, headers: &http::HeaderMap) {
    if !super::enabled() || headers.get(TRACEPARENT).is_none() {
        return;
    }
    let cx =
        opentelemetry::global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(headers)));
    let _ = span.set_parent(cx);
}

/// `span`'s context as a `traceparent` value for a record; empty when
/// traces are off or the trace is not sampled (nothing to join).
pub fn traceparent(span: &tracing::Span) -> String {
    if !super::enabled() || span.is_disabled() {
        return String::new();
    }
    let cx = span.context();
    if !cx.span().span_context().is_sampled() {
        return String::new();
    }
    let mut carrier = HashMap::new();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut carrier));
    carrier.remove(TRACEPARENT).unwrap_or_default()
}

/// Makes the trace a record carries (`traceparent`, may be empty) the
/// parent of `span`. Returns whether there was one.
pub fn follow(span: &tracing::Span, traceparent: &str) -> bool {
    if traceparent.is_empty() || !super::enabled() {
        return false;
    }
    let carrier = HashMap::from([(TRACEPARENT.to_string(), traceparent.to_string())]);
    let cx = opentelemetry::global::get_text_map_propagator(|p| p.extract(&carrier));
    span.set_parent(cx).is_ok()
}
