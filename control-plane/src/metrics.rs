//! The control plane's Prometheus metrics: failovers (count and time from
//! the first failed probe to the moved routes), failover holds in force,
//! backfills after a return (conversations copied, and what they gave up
//! on), operations by kind and
//! outcome, the largest freeze of each finished move, and the progress of
//! each running operation (its series go away when it ends). RPC counts and
//! latencies come from the admin server's layer.

use std::sync::LazyLock;

use cellmesh_telemetry::{
    Counter, Family, Gauge, Histogram, Unit, counter, counter_family, float_gauge_family, gauge,
    gauge_family, histogram, latency_buckets,
};
use prometheus_client::encoding::EncodeLabelSet;

use crate::operations::Spec;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    kind: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    operation: String,
    phase: String,
}

struct Metrics {
    failovers: Counter,
    failover_seconds: Histogram,
    holds: Gauge,
    backfilled: Counter,
    backfill_abandoned: Counter,
    operations: Family<OutcomeLabels, Counter>,
    freeze_seconds: Histogram,
    rows: Family<OperationLabels, Gauge>,
    progress: Family<OperationLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    phase: Family<PhaseLabels, Gauge>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    failovers: counter(
        "cellmesh_failovers",
        "Cells failed over by this control plane (their routes moved to standbys).",
    ),
    failover_seconds: histogram(
        "cellmesh_failover_duration",
        "Time from a cell's first failed probe to its routes moved.",
        Some(Unit::Seconds),
        latency_buckets(),
    ),
    holds: gauge(
        "cellmesh_failover_holds",
        "Cells whose failover an operator holds now (planned restarts).",
    ),
    backfilled: counter(
        "cellmesh_backfilled_conversations",
        "Conversations whose history a returned cell copied back into their owner.",
    ),
    backfill_abandoned: counter(
        "cellmesh_backfill_abandoned",
        "Backfill work given up after its retries: tenants a returned cell never listed and \
         conversations whose copy kept failing (their history stays unavailable).",
    ),
    operations: counter_family(
        "cellmesh_operations_finished",
        "Operations (moves, drains, failbacks) finished, by kind and outcome.",
    ),
    freeze_seconds: histogram(
        "cellmesh_migration_freeze",
        "The longest freeze (writes refused) of each finished tenant move.",
        Some(Unit::Seconds),
        latency_buckets(),
    ),
    rows: gauge_family(
        "cellmesh_operation_rows",
        "Rows (messages and sync events) a running operation has copied so far.",
    ),
    progress: float_gauge_family(
        "cellmesh_operation_progress_ratio",
        "Share of its items a running operation has moved (0 to 1).",
    ),
    phase: gauge_family(
        "cellmesh_operation_phase",
        "1 for the phase a running operation is in.",
    ),
});

/// Registers the control plane's metrics, so a scrape lists them at once.
pub fn register() {
    LazyLock::force(&METRICS);
}

/// A failover that moved a cell's routes, `took` after its first failed probe.
pub fn failed_over(took: std::time::Duration) {
    METRICS.failovers.inc();
    METRICS.failover_seconds.observe(took.as_secs_f64());
}

/// A backfill that copied `conversations` and gave up on `abandoned`.
pub fn backfilled(conversations: usize, abandoned: usize) {
    METRICS.backfilled.inc_by(conversations as u64);
    METRICS.backfill_abandoned.inc_by(abandoned as u64);
}

/// How many cells are held from failover now.
pub fn holds(held: usize) {
    METRICS.holds.set(held as i64);
}

fn kind(spec: &Spec) -> &'static str {
    match spec {
        Spec::MoveConversation { .. } => "move_conversation",
        Spec::MoveUser { .. } => "move_user",
        Spec::MoveTenant { .. } => "move_tenant",
        Spec::Drain { .. } => "drain",
        Spec::Failback { .. } => "failback",
        Spec::Backup { .. } => "backup",
        Spec::ExpireHistory { .. } => "expire_history",
    }
}

/// A running operation's progress (`phase` "" when it has none yet).
pub fn progress(id: &str, spec: &Spec, phase: &str, done: u64, total: u64, rows: u64) {
    let labels = OperationLabels {
        operation: id.to_string(),
        kind: kind(spec),
    };
    METRICS.rows.get_or_create(&labels).set(rows as i64);
    if total > 0 {
        let ratio = (done as f64 / total as f64).min(1.0);
        METRICS.progress.get_or_create(&labels).set(ratio);
    }
    let mut phases = PHASES.lock().unwrap_or_else(|e| e.into_inner());
    let previous = phases.insert(id.to_string(), phase.to_string());
    if let Some(previous) = previous.filter(|p| p != phase) {
        METRICS.phase.remove(&PhaseLabels {
            operation: id.to_string(),
            phase: previous,
        });
    }
    if !phase.is_empty() {
        METRICS
            .phase
            .get_or_create(&PhaseLabels {
                operation: id.to_string(),
                phase: phase.to_string(),
            })
            .set(1);
    }
}

/// The phase each running operation last reported.
static PHASES: LazyLock<std::sync::Mutex<std::collections::HashMap<String, String>>> =
    LazyLock::new(Default::default);

/// An operation ended: counted by outcome; its progress series go away.
pub fn finished(id: &str, spec: &Spec, succeeded: bool, frozen_ms: u64) {
    let kind = kind(spec);
    let outcome = if succeeded { "succeeded" } else { "failed" };
    METRICS
        .operations
        .get_or_create(&OutcomeLabels { kind, outcome })
        .inc();
    if succeeded && matches!(spec, Spec::MoveTenant { .. }) {
        METRICS.freeze_seconds.observe(frozen_ms as f64 / 1000.0);
    }
    let labels = OperationLabels {
        operation: id.to_string(),
        kind,
    };
    METRICS.rows.remove(&labels);
    METRICS.progress.remove(&labels);
    let phase = PHASES.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    if let Some(phase) = phase {
        METRICS.phase.remove(&PhaseLabels {
            operation: id.to_string(),
            phase,
        });
    }
}
