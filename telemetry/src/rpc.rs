//! The metrics half of the server layer ([`crate::server::ServerLayer`]):
//! counts each call by method and outcome (gRPC code and the stable
//! cellmesh reason of a failure) and times it. A call is timed until its
//! response headers: a unary call's whole life, a stream's set-up. A
//! failure reported in a stream's trailers counts as `OK` here. A process
//! that serves no metrics records nothing here.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, RwLock};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use crate::registry::{Unit, counter_family, histogram_family, latency_buckets};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    method: String,
    code: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: String,
}

struct RpcMetrics {
    calls: Family<CallLabels, Counter>,
    seconds: Family<MethodLabels, Histogram, fn() -> Histogram>,
}

static METRICS: LazyLock<RpcMetrics> = LazyLock::new(|| RpcMetrics {
    calls: counter_family(
        "cellmesh_rpc_server_requests",
        "gRPC calls served, by method, gRPC code and stable reason (empty when OK).",
    ),
    seconds: histogram_family(
        "cellmesh_rpc_server_duration",
        "Time from a gRPC call's arrival to its response headers.",
        Some(Unit::Seconds),
        || Histogram::new(latency_buckets()),
    ),
});

/// Registers the RPC series (at start-up, so they are listed before the
/// first call).
pub(crate) fn register() {
    LazyLock::force(&METRICS);
}

/// One call being timed: its method's series and when it arrived.
pub(crate) struct Timing {
    method: Arc<MethodHandles>,
    started: Instant,
}

impl Timing {
    /// Starts timing a call to `path`; `None` in a process that serves no
    /// metrics.
    pub(crate) fn start(path: &str) -> Option<Self> {
        if !crate::registry::enabled() {
            return None;
        }
        Some(Self {
            method: handles(path),
            started: Instant::now(),
        })
    }

    /// Counts the call by the outcome in its response headers (`None`: the
    /// service failed).
    pub(crate) fn finish(self, headers: Option<&http::HeaderMap>) {
        let m = &self.method;
        m.seconds.observe(self.started.elapsed().as_secs_f64());
        let (code, reason) = match headers {
            Some(headers) => outcome(headers),
            None => ("UNKNOWN".to_string(), String::new()),
        };
        if code == "OK" {
            m.ok.inc();
        } else {
            METRICS
                .calls
                .get_or_create(&CallLabels {
                    method: m.method.clone(),
                    code,
                    reason,
                })
                .inc();
        }
    }
}

/// One method's latency histogram and OK counter, looked up once: most
/// calls then cost no label allocation.
struct MethodHandles {
    method: String,
    seconds: Histogram,
    ok: Counter,
}

impl MethodHandles {
    fn of(method: String) -> Self {
        Self {
            seconds: METRICS
                .seconds
                .get_or_create(&MethodLabels {
                    method: method.clone(),
                })
                .clone(),
            ok: METRICS
                .calls
                .get_or_create(&CallLabels {
                    method: method.clone(),
                    code: "OK".into(),
                    reason: String::new(),
                })
                .clone(),
            method,
        }
    }
}

/// Distinct paths whose handles are kept (client-chosen paths beyond this
/// are looked up on every call instead of growing the cache).
const CACHED_METHODS: usize = 256;

static HANDLES: LazyLock<RwLock<HashMap<String, Arc<MethodHandles>>>> =
    LazyLock::new(Default::default);

fn handles(path: &str) -> Arc<MethodHandles> {
    if let Some(h) = HANDLES.read().expect("rpc handles").get(path) {
        return h.clone();
    }
    let h = Arc::new(MethodHandles::of(method_name(path)));
    let mut cache = HANDLES.write().expect("rpc handles");
    if cache.len() < CACHED_METHODS {
        cache.insert(path.to_string(), h.clone());
    }
    h
}

/// `cellmesh.v1.Messaging/Send` from `/cellmesh.v1.Messaging/Send`; paths
/// that are not a gRPC method collapse into one label value.
fn method_name(path: &str) -> String {
    let name = path.trim_start_matches('/');
    match name.split_once('/') {
        Some((service, method))
            if !service.is_empty() && !method.is_empty() && !method.contains('/') =>
        {
            name.to_string()
        }
        _ => "other".to_string(),
    }
}

/// The gRPC code (by name) and stable reason of a response whose status is
/// in its headers (a failure); `OK` otherwise.
fn outcome(headers: &http::HeaderMap) -> (String, String) {
    match tonic::Status::from_header_map(headers) {
        Some(status) if status.code() != tonic::Code::Ok => {
            let detail = cellmesh_proto::status::error_detail(&status);
            (code_name(status.code()), detail.reason)
        }
        _ => ("OK".to_string(), String::new()),
    }
}

/// `UNAVAILABLE`, `RESOURCE_EXHAUSTED`, … as gRPC spells them.
fn code_name(code: tonic::Code) -> String {
    let mut name = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(
            method_name("/cellmesh.v1.Messaging/Send"),
            "cellmesh.v1.Messaging/Send"
        );
        assert_eq!(method_name("/"), "other");
        assert_eq!(method_name("/a/b/c"), "other");
        assert_eq!(
            code_name(tonic::Code::ResourceExhausted),
            "RESOURCE_EXHAUSTED"
        );
        assert_eq!(code_name(tonic::Code::Ok), "OK");
        assert_eq!(code_name(tonic::Code::Unavailable), "UNAVAILABLE");
    }

    #[test]
    fn a_failure_is_named_by_code_and_reason() {
        let status = cellmesh_proto::status::to_status(
            cellmesh_proto::v1::ErrorCode::RateLimited,
            cellmesh_proto::reason::Reason::parse("USER_RATE_LIMITED").unwrap(),
            "slow down".into(),
            10,
            None,
        );
        let response = status.into_http::<()>();
        assert_eq!(
            outcome(response.headers()),
            (
                "RESOURCE_EXHAUSTED".to_string(),
                "USER_RATE_LIMITED".to_string()
            )
        );
        assert_eq!(
            outcome(&http::HeaderMap::new()),
            ("OK".to_string(), String::new())
        );
    }
}
