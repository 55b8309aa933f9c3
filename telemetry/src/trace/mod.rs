//! OpenTelemetry traces. A process with `[telemetry] endpoint` set exports
//! its `tracing` spans (those of the cellmesh crates) over OTLP/gRPC,
//! sampled parent-based by [`sampler::CellmeshSampler`]; without it no span
//! leaves the process and the hooks below cost one atomic load. The W3C
//! trace context crosses every hop: gRPC metadata both ways ([`grpc`]) and
//! the records the pipeline hands on (outbox and queue records, Kafka
//! headers, forwarded events) as a `traceparent` string ([`propagate`]).
//! [`receiver`] is an in-memory OTLP receiver (what `cellmesh dev` runs and
//! tests assert on).

pub mod filter;
pub mod grpc;
pub mod propagate;
pub mod receiver;
pub mod sampler;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use cellmesh_proto::config::{ConfigError, check};
use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use serde::{Deserialize, Serialize};
use tracing::Subscriber;
use tracing_subscriber::registry::LookupSpan;

pub use propagate::{follow, traceparent};

static ENABLED: AtomicBool = AtomicBool::new(false);
/// `sample_ratio`, as f64 bits.
static RATIO: AtomicU64 = AtomicU64::new(0);

fn sample_ratio() -> f64 {
    f64::from_bits(RATIO.load(Ordering::Relaxed))
}

/// Whether this process exports traces.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The `[telemetry]` section of every role's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TraceConfig {
    /// OTLP/gRPC collector endpoint (`http://host:4317`); empty: no traces.
    pub endpoint: String,
    /// Share of new traces sampled (a span with a parent follows it).
    pub sample_ratio: f64,
    /// Share of sends sampled in conversations above the large-group
    /// threshold (at least `sample_ratio`).
    pub large_group_ratio: f64,
    /// `service.name`; empty: the role, region and cell
    /// (`cell/eu-west/c1`).
    pub service_name: String,
    /// Extra resource attributes (`deployment.environment = "prod"`).
    pub resource: BTreeMap<String, String>,
}

impl Default for TraceConfig {
    fn default() -> Self {
        Self {
            endpoint: String::new(),
            sample_ratio: 0.05,
            large_group_ratio: 0.2,
            service_name: String::new(),
            resource: BTreeMap::new(),
        }
    }
}

impl TraceConfig {
    /// The first bad field, named as in the file.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, ratio) in [
            ("telemetry.sample_ratio", self.sample_ratio),
            ("telemetry.large_group_ratio", self.large_group_ratio),
        ] {
            check(
                field,
                (0.0..=1.0).contains(&ratio),
                "must be between 0 and 1",
            )?;
        }
        if !self.endpoint.is_empty() {
            let uri = self.endpoint.parse::<http::Uri>().ok();
            check(
                "telemetry.endpoint",
                uri.is_some_and(|u| {
                    matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some()
                }),
                &format!(
                    "must be http://host:port or https://host:port, got {:?}",
                    self.endpoint
                ),
            )?;
        }
        Ok(())
    }
}

/// Which process the spans come from.
#[derive(Debug, Clone, Default)]
pub struct Identity {
    /// `cell`, `router`, `edge` or `control-plane`.
    pub role: &'static str,
    pub region: String,
    /// The cell id, for a cell.
    pub cell: String,
    /// The process's own name (node id, listen address).
    pub instance: String,
}

impl Identity {
    fn service_name(&self) -> String {
        let region = if self.cell.starts_with(&format!("{}/", self.region)) {
            ""
        } else {
            &self.region
        };
        [self.role, region, &self.cell]
            .into_iter()
            .filter(|part| !part.is_empty())
            .collect::<Vec<_>>()
            .join("/")
    }
}

/// Flushes and stops the exporter when dropped (the end of the process).
pub struct TraceGuard(SdkTracerProvider);

impl Drop for TraceGuard {
    fn drop(&mut self) {
        ENABLED.store(false, Ordering::Relaxed);
        if let Err(e) = self.0.shutdown_with_timeout(Duration::from_secs(3)) {
            eprintln!("trace export did not flush: {e}");
        }
    }
}

/// The `tracing` layer that exports this process's spans, and the guard
/// that flushes them; `None` when `config.endpoint` is empty. Call inside
/// a Tokio runtime.
#[allow(clippy::type_complexity)]
pub fn layer<S>(
    config: &TraceConfig,
    identity: &Identity,
) -> Result<
    Option<(
        tracing_opentelemetry::OpenTelemetryLayer<S, SdkTracer>,
        TraceGuard,
    )>,
    String,
>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    if config.endpoint.is_empty() {
        return Ok(None);
    }
    config.validate().map_err(|e| e.to_string())?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(config.endpoint.clone())
        .with_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| format!("telemetry.endpoint {:?}: {e}", config.endpoint))?;
    let service = if config.service_name.is_empty() {
        identity.service_name()
    } else {
        config.service_name.clone()
    };
    let mut attributes = vec![
        KeyValue::new("cellmesh.role", identity.role),
        KeyValue::new("service.instance.id", identity.instance.clone()),
    ];
    if !identity.region.is_empty() {
        attributes.push(KeyValue::new("cloud.region", identity.region.clone()));
    }
    if !identity.cell.is_empty() {
        attributes.push(KeyValue::new("cellmesh.cell", identity.cell.clone()));
    }
    attributes.extend(
        config
            .resource
            .iter()
            .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
    );
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(sampler::CellmeshSampler::new(
            config.sample_ratio,
            config.large_group_ratio,
        ))
        .with_resource(
            Resource::builder_empty()
                .with_service_name(service)
                .with_attributes(attributes)
                .build(),
        )
        .build();
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let tracer = provider.tracer("cellmesh");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        // Spans start when first needed (a child, an outgoing call, their
        // end), so a handler can still name the conversation the sampler
        // looks at.
        .with_context_activation(false)
        .with_tracked_inactivity(false)
        .with_threads(false)
        .with_location(false)
        .with_target(false);
    RATIO.store(config.sample_ratio.to_bits(), Ordering::Relaxed);
    ENABLED.store(true, Ordering::Relaxed);
    Ok(Some((layer, TraceGuard(provider))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_checked() {
        assert!(TraceConfig::default().validate().is_ok());
        let ratio = TraceConfig {
            sample_ratio: 1.5,
            ..TraceConfig::default()
        };
        let endpoint = TraceConfig {
            endpoint: "127.0.0.1:4317".into(),
            ..TraceConfig::default()
        };
        for (bad, field) in [
            (ratio, "telemetry.sample_ratio"),
            (endpoint, "telemetry.endpoint"),
        ] {
            let error = bad.validate().unwrap_err().to_string();
            assert!(error.contains(field), "{error}");
        }
        let good = TraceConfig {
            endpoint: "http://127.0.0.1:4317".into(),
            ..TraceConfig::default()
        };
        assert!(good.validate().is_ok());
    }

    #[test]
    fn the_service_name_is_role_region_and_cell() {
        let id = Identity {
            role: "cell",
            region: "eu-west".into(),
            cell: "eu-west/c1".into(),
            instance: String::new(),
        };
        assert_eq!(id.service_name(), "cell/eu-west/c1");
        let id = Identity {
            role: "edge",
            region: "us-east".into(),
            ..Identity::default()
        };
        assert_eq!(id.service_name(), "edge/us-east");
    }
}
