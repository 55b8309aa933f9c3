//! The process-wide registry and the helpers that create a metric and
//! register it in one step, so a metric is named and described where it is
//! defined. Names follow Prometheus conventions: `cellmesh_` prefix, base
//! units, counters exposed with `_total`, durations in `_seconds`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
pub use prometheus_client::registry::Unit;
use prometheus_client::registry::{Metric, Registry};

/// Whether this process records per-call metrics (it serves `/metrics`).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Turns per-call recording (the RPC layer) on; [`crate::admin::serve`]
/// does when the process serves its metrics.
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Whether per-call recording is on.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(|| {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(crate::process::ProcessCollector));
    Mutex::new(registry)
});

fn with_registry(f: impl FnOnce(&mut Registry)) {
    f(&mut REGISTRY.lock().unwrap_or_else(|e| e.into_inner()));
}

/// Latency buckets in seconds: 100 µs to ≈ 13 s, doubling.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0001, 2.0, 18)
}

/// Count buckets (batch sizes, page sizes): 1 to 4096, doubling.
pub fn size_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(1.0, 2.0, 13)
}

/// The bounds of a label set.
pub trait Labels:
    EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static
{
}

impl<T> Labels for T where
    T: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static
{
}

/// A metric of type `M` registered as `name` (the library ends `help` with
/// a period; one given here is dropped).
pub fn registered<M: Metric + Clone + Default>(name: &str, help: &str) -> M {
    let metric = M::default();
    with_registry(|r| r.register(name, help.trim_end_matches('.'), metric.clone()));
    metric
}

/// A counter named `name` (exposed as `name_total`).
pub fn counter(name: &str, help: &str) -> Counter {
    registered(name, help)
}

/// Counters by label set `L` (exposed as `name_total`).
pub fn counter_family<L: Labels>(name: &str, help: &str) -> Family<L, Counter> {
    registered(name, help)
}

/// A gauge named `name`.
pub fn gauge(name: &str, help: &str) -> Gauge {
    registered(name, help)
}

/// A gauge named `name` holding a fractional value (seconds, ratios).
pub fn float_gauge(name: &str, help: &str) -> Gauge<f64, AtomicU64> {
    registered(name, help)
}

/// Gauges by label set `L`.
pub fn gauge_family<L: Labels>(name: &str, help: &str) -> Family<L, Gauge> {
    registered(name, help)
}

/// Fractional gauges by label set `L`.
pub fn float_gauge_family<L: Labels>(name: &str, help: &str) -> Family<L, Gauge<f64, AtomicU64>> {
    registered(name, help)
}

/// A histogram over `buckets`; `unit` seconds appends `_seconds`.
pub fn histogram(
    name: &str,
    help: &str,
    unit: Option<Unit>,
    buckets: impl Iterator<Item = f64>,
) -> Histogram {
    let histogram = Histogram::new(buckets);
    with_registry(|r| match unit {
        Some(unit) => {
            r.register_with_unit(name, help.trim_end_matches('.'), unit, histogram.clone())
        }
        None => r.register(name, help.trim_end_matches('.'), histogram.clone()),
    });
    histogram
}

/// Histograms by label set `L`, each over the buckets `make` gives.
pub fn histogram_family<L: Labels>(
    name: &str,
    help: &str,
    unit: Option<Unit>,
    make: fn() -> Histogram,
) -> Family<L, Histogram, fn() -> Histogram> {
    let family = Family::<L, Histogram, fn() -> Histogram>::new_with_constructor(make);
    with_registry(|r| match unit {
        Some(unit) => r.register_with_unit(name, help.trim_end_matches('.'), unit, family.clone()),
        None => r.register(name, help.trim_end_matches('.'), family.clone()),
    });
    family
}

/// Everything registered, as OpenMetrics text (what Prometheus asks for).
pub fn encode() -> String {
    let mut text = String::new();
    let registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
    text
}

/// Everything registered in the classic Prometheus text format (0.0.4),
/// for scrapers and tools that do not speak OpenMetrics (`promtool check
/// metrics`, older agents): the same samples, with counters' descriptors
/// named like their `_total` samples and no `# UNIT` or `# EOF` lines.
pub fn encode_prometheus() -> String {
    to_prometheus_text(&encode())
}

/// Rewrites this library's OpenMetrics output as Prometheus text.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let mut counters = std::collections::HashSet::new();
    for line in openmetrics.lines() {
        if let Some(name) = line
            .strip_prefix("# TYPE ")
            .and_then(|rest| rest.strip_suffix(" counter"))
        {
            counters.insert(name.to_string());
        }
    }
    let mut text = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let descriptor = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|prefix| line.strip_prefix(prefix).map(|rest| (prefix, rest)));
        match descriptor {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let tail = match tail {
                    "info" | "unknown" | "stateset" | "gaugehistogram" => "untyped",
                    other => other,
                };
                let suffix = if counters.contains(name) {
                    "_total"
                } else {
                    ""
                };
                text.push_str(&format!("{prefix}{name}{suffix} {tail}\n"));
            }
            None => {
                text.push_str(line);
                text.push('\n');
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_described_by_their_sample_name() {
        let om = "# HELP a_requests Requests.\n# TYPE a_requests counter\na_requests_total{m=\"x\"} 3\n\
                  # HELP b_seconds Time.\n# TYPE b_seconds histogram\n# UNIT b_seconds seconds\n\
                  b_seconds_sum 1.5\nb_seconds_count 2\nb_seconds_bucket{le=\"+Inf\"} 2\n# EOF\n";
        let text = to_prometheus_text(om);
        assert_eq!(
            text,
            "# HELP a_requests_total Requests.\n# TYPE a_requests_total counter\na_requests_total{m=\"x\"} 3\n\
             # HELP b_seconds Time.\n# TYPE b_seconds histogram\n\
             b_seconds_sum 1.5\nb_seconds_count 2\nb_seconds_bucket{le=\"+Inf\"} 2\n"
        );
    }

    #[test]
    fn help_texts_end_in_one_period() {
        let _ = counter("cellmesh_test_things", "Things counted.");
        let text = encode();
        assert!(
            text.contains("# HELP cellmesh_test_things Things counted.\n"),
            "{text}"
        );
    }
}
