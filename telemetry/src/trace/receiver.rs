//! An OTLP/gRPC trace receiver that keeps the last traces in memory: what
//! `cellmesh dev` runs when no `--otlp` collector is named (the console's
//! waterfall reads it) and what tests assert on. [`Receiver::serve`] takes
//! OTLP exports; [`Receiver::http`] answers `GET /traces` (the newest
//! traces, summarised) and `GET /traces/{id}` (one trace's spans) as JSON.
//! When full it drops the trace that received nothing for longest, so a
//! long trace whose root ends last (a drill, a tenant move) outlives the
//! short ones started meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use serde::{Deserialize, Serialize};

/// One received span, flattened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpanRecord {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a trace's root.
    pub parent_span_id: String,
    pub name: String,
    /// The exporting process's `service.name`.
    pub service: String,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    pub attributes: BTreeMap<String, String>,
    /// The exporting process's resource attributes.
    pub resource: BTreeMap<String, String>,
}

/// One trace, summarised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceSummary {
    pub trace_id: String,
    /// The root span's name (the earliest span's while the root is missing).
    pub root: String,
    pub start_unix_nano: u64,
    pub duration_nano: u64,
    pub spans: usize,
    /// Distinct exporting processes.
    pub services: Vec<String>,
}

#[derive(Default)]
struct Traces {
    /// Trace ids by when they last received a span (a counter).
    touched: BTreeMap<u64, String>,
    /// Per trace: its key in `touched`, and its spans.
    spans: HashMap<String, (u64, Vec<SpanRecord>)>,
    clock: u64,
}

impl Traces {
    /// The spans of trace `id`, now its most recently updated; the least
    /// recently updated traces are dropped beyond `capacity`.
    fn touch(&mut self, id: String, capacity: usize) -> &mut Vec<SpanRecord> {
        self.clock += 1;
        let now = self.clock;
        match self.spans.get_mut(&id) {
            Some((at, _)) => {
                self.touched.remove(at);
                *at = now;
            }
            None => {
                while self.spans.len() >= capacity {
                    let Some((_, old)) = self.touched.pop_first() else {
                        break;
                    };
                    self.spans.remove(&old);
                }
                self.spans.insert(id.clone(), (now, Vec::new()));
            }
        }
        self.touched.insert(now, id.clone());
        &mut self.spans.get_mut(&id).expect("just inserted").1
    }
}

/// The last `capacity` traces received.
#[derive(Clone)]
pub struct Receiver {
    traces: Arc<Mutex<Traces>>,
    capacity: usize,
}

/// Spans kept per trace at most (a huge fan-out must not exhaust memory).
const MAX_SPANS_PER_TRACE: usize = 2_000;

impl Receiver {
    pub fn new(capacity: usize) -> Self {
        Self {
            traces: Arc::new(Mutex::new(Traces::default())),
            capacity: capacity.max(1),
        }
    }

    /// Stores the spans of one export.
    pub fn accept(&self, request: ExportTraceServiceRequest) {
        let mut traces = self.traces.lock().expect("trace store");
        for resource_spans in request.resource_spans {
            let resource = resource_spans
                .resource
                .map(|r| attributes(&r.attributes))
                .unwrap_or_default();
            let service = resource.get("service.name").cloned().unwrap_or_default();
            for span in resource_spans
                .scope_spans
                .into_iter()
                .flat_map(|scope| scope.spans)
            {
                let record = SpanRecord {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name,
                    service: service.clone(),
                    start_unix_nano: span.start_time_unix_nano,
                    end_unix_nano: span.end_time_unix_nano,
                    attributes: attributes(&span.attributes),
                    resource: resource.clone(),
                };
                let spans = traces.touch(record.trace_id.clone(), self.capacity);
                if spans.len() < MAX_SPANS_PER_TRACE {
                    spans.push(record);
                }
            }
        }
    }

    /// One trace's spans, earliest first.
    pub fn trace(&self, trace_id: &str) -> Vec<SpanRecord> {
        let traces = self.traces.lock().expect("trace store");
        let mut spans = traces
            .spans
            .get(trace_id)
            .map(|(_, spans)| spans.clone())
            .unwrap_or_default();
        spans.sort_by_key(|s| (s.start_unix_nano, s.end_unix_nano));
        spans
    }

    /// Every trace held, the latest started first.
    pub fn summaries(&self) -> Vec<TraceSummary> {
        let traces = self.traces.lock().expect("trace store");
        let mut all: Vec<TraceSummary> = traces
            .spans
            .iter()
            .map(|(id, (_, spans))| summary(id, spans))
            .collect();
        all.sort_by_key(|t| std::cmp::Reverse(t.start_unix_nano));
        all
    }

    /// All spans held (tests look for the trace of one request).
    pub fn all_spans(&self) -> Vec<SpanRecord> {
        let traces = self.traces.lock().expect("trace store");
        traces
            .spans
            .values()
            .flat_map(|(_, spans)| spans.iter().cloned())
            .collect()
    }

    /// Serves OTLP/gRPC exports on `listener` until the task is aborted.
    pub fn serve(&self, listener: tokio::net::TcpListener) -> tokio::task::JoinHandle<()> {
        let service = TraceServiceServer::new(self.clone()).max_decoding_message_size(32 << 20);
        tokio::spawn(async move {
            // Exporters speak plaintext OTLP, whatever the deployment's
            // internal TLS.
            let incoming =
                cellmesh_proto::server::incoming_with(listener, cellmesh_proto::server::IDLE, None);
            if let Err(e) = cellmesh_proto::server::public_builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await
            {
                tracing::warn!(error = %e, "OTLP receiver stopped");
            }
        })
    }

    /// `GET /traces` and `GET /traces/{id}`.
    pub fn http(&self) -> axum::Router {
        use axum::extract::{Path, State};
        use axum::routing::get;
        axum::Router::new()
            .route(
                "/traces",
                get(|State(r): State<Receiver>| async move { axum::Json(r.summaries()) }),
            )
            .route(
                "/traces/{id}",
                get(
                    |State(r): State<Receiver>, Path(id): Path<String>| async move {
                        axum::Json(r.trace(&id))
                    },
                ),
            )
            .with_state(self.clone())
    }
}

fn summary(id: &str, spans: &[SpanRecord]) -> TraceSummary {
    let start = spans.iter().map(|s| s.start_unix_nano).min().unwrap_or(0);
    let end = spans.iter().map(|s| s.end_unix_nano).max().unwrap_or(start);
    let root = spans
        .iter()
        .find(|s| s.parent_span_id.is_empty())
        .or_else(|| spans.iter().min_by_key(|s| s.start_unix_nano))
        .map(|s| s.name.clone())
        .unwrap_or_default();
    let mut services: Vec<String> = spans.iter().map(|s| s.service.clone()).collect();
    services.sort();
    services.dedup();
    TraceSummary {
        trace_id: id.to_string(),
        root,
        start_unix_nano: start,
        duration_nano: end.saturating_sub(start),
        spans: spans.len(),
        services,
    }
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.accept(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            (
                kv.key.clone(),
                kv.value.as_ref().map(text).unwrap_or_default(),
            )
        })
        .collect()
}

fn text(value: &AnyValue) -> String {
    match &value.value {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    fn export(service: &str, trace: u8, spans: &[(u8, u8)]) -> ExportTraceServiceRequest {
        let kv = |k: &str, v: &str| KeyValue {
            key: k.into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(v.into())),
            }),
            ..Default::default()
        };
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![kv("service.name", service)],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans: spans
                        .iter()
                        .map(|&(id, parent)| Span {
                            trace_id: vec![trace; 16],
                            span_id: vec![id; 8],
                            parent_span_id: if parent == 0 { vec![] } else { vec![parent; 8] },
                            name: format!("s{id}"),
                            start_time_unix_nano: u64::from(id) * 10,
                            end_time_unix_nano: u64::from(id) * 10 + 5,
                            attributes: vec![kv("conv_id", "7")],
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn spans_are_grouped_by_trace_and_old_traces_are_dropped() {
        let receiver = Receiver::new(2);
        receiver.accept(export("edge", 1, &[(1, 0)]));
        receiver.accept(export("cell", 1, &[(2, 1), (3, 2)]));
        receiver.accept(export("edge", 2, &[(4, 0)]));
        let spans = receiver.trace(&"01".repeat(16));
        assert_eq!(spans.len(), 3);
        assert_eq!(spans[1].parent_span_id, spans[0].span_id);
        assert_eq!(spans[2].service, "cell");
        assert_eq!(spans[2].attributes["conv_id"], "7");
        let summaries = receiver.summaries();
        assert_eq!(summaries[0].trace_id, "02".repeat(16));
        assert_eq!(summaries[1].root, "s1");
        assert_eq!(summaries[1].services, vec!["cell", "edge"]);
        assert_eq!(summaries[1].duration_nano, 25);
        receiver.accept(export("edge", 3, &[(5, 0)]));
        assert!(
            receiver.trace(&"01".repeat(16)).is_empty(),
            "oldest dropped"
        );
        assert_eq!(receiver.summaries().len(), 2);
    }

    #[test]
    fn a_trace_still_receiving_spans_outlives_newer_finished_ones() {
        let receiver = Receiver::new(3);
        // A drill: its fault spans arrive first, its root at the very end.
        receiver.accept(export("chaos", 1, &[(2, 1)]));
        for trace in 2..=3 {
            receiver.accept(export("edge", trace, &[(10 + trace, 0)]));
        }
        receiver.accept(export("chaos", 1, &[(3, 1)]));
        for trace in 4..=5 {
            receiver.accept(export("edge", trace, &[(10 + trace, 0)]));
        }
        receiver.accept(export("chaos", 1, &[(1, 0)]));
        assert_eq!(receiver.trace(&"01".repeat(16)).len(), 3, "the drill whole");
        let held: Vec<String> = receiver
            .summaries()
            .into_iter()
            .map(|t| t.trace_id)
            .collect();
        assert_eq!(
            held,
            ["05", "04", "01"].map(|t| t.repeat(16)),
            "the latest started first"
        );
    }
}
