//! The cell's Prometheus metrics, defined once here and updated where the
//! work happens: the commit path (batch sizes, fsync time, failed writes),
//! the pipeline (outbox and queue lag, fan-out lag), sync (online devices,
//! push latency, pulls that reported unavailable history), the send path
//! (idempotent replays, rate-limited requests) and migrations (rows copied
//! in and out) and the cold tier (segments written, deleted, corrupt). RPC counts and latencies come from the server's layer.

use std::sync::LazyLock;

use cellmesh_telemetry::{
    Counter, Family, Gauge, Histogram, Unit, counter, counter_family, float_gauge, gauge,
    gauge_family, histogram, histogram_family, latency_buckets, size_buckets,
};
use prometheus_client::encoding::EncodeLabelSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LaneLabel {
    pub lane: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScopeLabel {
    pub scope: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabel {
    pub direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    pub tenant: u64,
}

pub struct CellMetrics {
    pub commit_batch_mutations: Family<LaneLabel, Histogram, fn() -> Histogram>,
    pub commit_write_seconds: Family<LaneLabel, Histogram, fn() -> Histogram>,
    pub commit_failed: Counter,
    pub outbox_lag_events: Gauge,
    pub queue_lag_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub fanout_lag_seconds: Histogram,
    pub fanout_batch_entries: Histogram,
    pub fanout_phase_seconds: Family<PhaseLabel, Histogram, fn() -> Histogram>,
    pub push_latency_seconds: Histogram,
    pub online_devices: Gauge,
    pub pulls_unavailable: Counter,
    pub search_indexed: Counter,
    pub search_lag_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub idempotent_replays: Counter,
    pub rate_limited: Family<ScopeLabel, Counter>,
    pub messages_committed: Counter,
    pub member_change_calls: Counter,
    pub member_change_events: Counter,
    pub migration_rows: Family<DirectionLabel, Counter>,
    pub segments_written: Counter,
    pub messages_tiered: Counter,
    pub segments_deleted: Counter,
    pub segments_corrupt: Counter,
    pub cold_pulls: Counter,
    pub screen_pages: Counter,
    pub pushes_dropped: Counter,
    pub uploads_reserved: Counter,
    pub uploads_completed: Counter,
    pub uploads_swept: Counter,
    pub download_urls: Counter,
    pub files_copied_in: Counter,
    pub attachment_bytes: Family<TenantLabel, Gauge>,
}

fn size_histogram() -> Histogram {
    Histogram::new(size_buckets())
}

fn latency_histogram() -> Histogram {
    Histogram::new(latency_buckets())
}

static METRICS: LazyLock<CellMetrics> = LazyLock::new(|| CellMetrics {
    commit_batch_mutations: histogram_family(
        "cellmesh_commit_batch_mutations",
        "Mutations written together in one WriteBatch (one WAL fsync), by commit lane.",
        None,
        size_histogram,
    ),
    commit_write_seconds: histogram_family(
        "cellmesh_commit_write",
        "Time to write one WriteBatch with its WAL fsync, by commit lane.",
        Some(Unit::Seconds),
        latency_histogram,
    ),
    commit_failed: counter(
        "cellmesh_commit_failed_writes",
        "WriteBatches that failed (after one, the store refuses writes until restarted).",
    ),
    outbox_lag_events: gauge(
        "cellmesh_outbox_lag_events",
        "Outbox events written but not yet relayed to the event queue.",
    ),
    queue_lag_seconds: float_gauge(
        "cellmesh_queue_lag_seconds",
        "Age of the newest event the fan-out took from the event queue, when it took it.",
    ),
    fanout_lag_seconds: histogram(
        "cellmesh_fanout_lag",
        "Time from a message's acknowledgement to its members' sync-queue entries being durable.",
        Some(Unit::Seconds),
        latency_buckets(),
    ),
    fanout_batch_entries: histogram(
        "cellmesh_fanout_batch_entries",
        "Conversation-list entries (member × conversation) updated per fan-out batch.",
        None,
        size_buckets(),
    ),
    fanout_phase_seconds: histogram_family(
        "cellmesh_fanout_phase",
        "Time one fan-out batch spent in each phase on the processor: planning its effects (apply), \
         until they are durable (commit), waking its users' streams (announce).",
        Some(Unit::Seconds),
        latency_histogram,
    ),
    push_latency_seconds: histogram(
        "cellmesh_push_latency",
        "Time from a message's acknowledgement to its push to an online device.",
        Some(Unit::Seconds),
        latency_buckets(),
    ),
    online_devices: gauge(
        "cellmesh_online_devices",
        "Devices with a live sync stream on this cell.",
    ),
    search_indexed: counter(
        "cellmesh_search_indexed_events",
        "Queue events the search indexer has applied and committed.",
    ),
    search_lag_seconds: float_gauge(
        "cellmesh_search_lag_seconds",
        "At the indexer's last commit: how long after its acknowledgement the oldest message of the batch became searchable.",
    ),
    pulls_unavailable: counter(
        "cellmesh_pulls_unavailable_history",
        "History pulls whose answer reported unavailable history (the gap rate's numerator).",
    ),
    segments_written: counter(
        "cellmesh_cold_segments_written",
        "Segments of history moved to the cold tier (manifest committed, hot rows deleted).",
    ),
    messages_tiered: counter(
        "cellmesh_cold_messages_tiered",
        "Messages moved from the hot tier to cold segments.",
    ),
    segments_deleted: counter(
        "cellmesh_cold_segments_deleted",
        "Cold segments deleted by retention or swept as orphans.",
    ),
    segments_corrupt: counter(
        "cellmesh_cold_segments_corrupt",
        "Cold segments whose bytes did not match their manifest checksum (never served).",
    ),
    cold_pulls: counter(
        "cellmesh_cold_pulls",
        "History pages that read cold segments.",
    ),
    screen_pages: counter(
        "cellmesh_screen_pages",
        "History pages of large groups answered from their newest messages kept in memory.",
    ),
    pushes_dropped: counter(
        "cellmesh_pushes_dropped",
        "Transient pushes (hints, typing notices) a device missed: its stream was full.",
    ),
    uploads_reserved: counter(
        "cellmesh_uploads_reserved",
        "Uploads reserved (CreateUpload).",
    ),
    uploads_completed: counter(
        "cellmesh_uploads_completed",
        "Uploads whose stored bytes matched their size and SHA-256.",
    ),
    uploads_swept: counter(
        "cellmesh_uploads_swept",
        "Files deleted: expired reservations, orphans and recalled files past their grace.",
    ),
    files_copied_in: counter(
        "cellmesh_files_copied_in",
        "Files that came with a conversation from another region, copied into this cell's store.",
    ),
    download_urls: counter("cellmesh_download_urls", "Signed download URLs handed out."),
    attachment_bytes: gauge_family(
        "cellmesh_attachment_bytes",
        "Bytes of reserved and completed files this cell keeps, by tenant.",
    ),
    idempotent_replays: counter(
        "cellmesh_idempotent_replays",
        "Sends answered from the idempotency record (a retry of an acknowledged send).",
    ),
    rate_limited: counter_family(
        "cellmesh_rate_limited_requests",
        "Requests refused by a rate limit, by scope (user, conversation).",
    ),
    messages_committed: counter(
        "cellmesh_messages_committed",
        "Messages made durable and acknowledged by this cell as owner.",
    ),
    member_change_calls: counter(
        "cellmesh_member_change_calls",
        "AddMembers and RemoveMembers calls applied (calls queued together share one commit).",
    ),
    member_change_events: counter(
        "cellmesh_member_change_events",
        "MembersChanged events written: one per commit of merged membership changes.",
    ),
    migration_rows: counter_family(
        "cellmesh_migration_rows",
        "Rows copied by conversation and tenant moves, by direction (out: served as source, in: stored as target).",
    ),
});

/// The cell's metrics (registered on first use).
pub fn metrics() -> &'static CellMetrics {
    &METRICS
}

/// Registers every cell metric, so a scrape lists them before first use.
pub fn register() {
    LazyLock::force(&METRICS);
}
