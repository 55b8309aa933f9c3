//! The replica's Raft state as Prometheus gauges and counters, kept current
//! from openraft's metrics channel: term, last log and applied index, the
//! snapshot, whether this replica leads, and how often the leader changed;
//! and where a route write's time goes, phase by phase ([`phases`]). RPC
//! counts and latencies come from the servers' layer.

use std::sync::LazyLock;

use cellmesh_telemetry::{
    Counter, Gauge, Histogram, Unit, counter, gauge, histogram, latency_buckets, size_buckets,
};

use crate::types::Raft;

struct RaftMetrics {
    term: Gauge,
    last_log_index: Gauge,
    applied_index: Gauge,
    snapshot_index: Gauge,
    is_leader: Gauge,
    leader_changes: Counter,
}

static METRICS: LazyLock<RaftMetrics> = LazyLock::new(|| RaftMetrics {
    term: gauge("cellmesh_raft_term", "The replica's current Raft term."),
    last_log_index: gauge(
        "cellmesh_raft_last_log_index",
        "The last route-log index appended on this replica.",
    ),
    applied_index: gauge(
        "cellmesh_raft_applied_index",
        "The last route-log index applied to this replica's route table.",
    ),
    snapshot_index: gauge(
        "cellmesh_raft_snapshot_index",
        "The last route-log index included in this replica's snapshot.",
    ),
    is_leader: gauge(
        "cellmesh_raft_is_leader",
        "1 while this replica leads the route table's Raft group, else 0.",
    ),
    leader_changes: counter(
        "cellmesh_raft_leader_changes",
        "Times this replica saw the Raft leader change (including to none).",
    ),
});

/// A route write's phases on the leader, and the replicas' disk work.
pub struct WritePhases {
    /// From a write's arrival to its entry being proposed (waiting for one
    /// of the entries in flight to commit).
    pub queued: Histogram,
    /// From an entry's proposal to its being applied here: append, fsync,
    /// replication to a quorum, commit and apply.
    pub committed: Histogram,
    /// Writes proposed together as one entry.
    pub entry_commands: Histogram,
    /// One group fsync of the log's WAL.
    pub log_sync: Histogram,
    /// Applying committed entries to the table (one RocksDB write).
    pub apply: Histogram,
    /// An AppendEntries round trip to one follower, seen from the leader.
    pub append_rpc: Histogram,
}

static PHASES: LazyLock<WritePhases> = LazyLock::new(|| WritePhases {
    queued: seconds(
        "cellmesh_route_write_queued",
        "Time a route write waited on the leader before its entry was proposed.",
    ),
    committed: seconds(
        "cellmesh_route_write_committed",
        "Time from a route-write entry's proposal to its being applied on the leader.",
    ),
    entry_commands: histogram(
        "cellmesh_route_write_entry_commands",
        "Route writes proposed together as one log entry.",
        None,
        size_buckets(),
    ),
    log_sync: seconds(
        "cellmesh_raft_log_sync",
        "Time of one group fsync of the route log's WAL.",
    ),
    apply: seconds(
        "cellmesh_raft_apply",
        "Time to apply committed route-log entries to the table.",
    ),
    append_rpc: seconds(
        "cellmesh_raft_append_rpc",
        "AppendEntries round trip to a follower, from the leader (replication through any link).",
    ),
});

/// A latency histogram in seconds.
fn seconds(name: &str, help: &str) -> Histogram {
    histogram(name, help, Some(Unit::Seconds), latency_buckets())
}

/// The write-phase histograms.
pub fn phases() -> &'static WritePhases {
    &PHASES
}

/// Follows `raft`'s metrics until it shuts down.
pub async fn follow(raft: Raft) {
    let metrics = &*METRICS;
    let mut rx = raft.metrics();
    let mut leader = None;
    loop {
        {
            let m = rx.borrow_and_update();
            metrics.term.set(m.current_term as i64);
            metrics
                .last_log_index
                .set(m.last_log_index.unwrap_or(0) as i64);
            metrics
                .applied_index
                .set(m.last_applied.map_or(0, |l| l.index) as i64);
            metrics
                .snapshot_index
                .set(m.snapshot.map_or(0, |l| l.index) as i64);
            metrics
                .is_leader
                .set(i64::from(m.current_leader == Some(m.id)));
            if m.current_leader != leader {
                if leader.is_some() || m.current_leader.is_some() {
                    metrics.leader_changes.inc();
                }
                leader = m.current_leader;
            }
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}
