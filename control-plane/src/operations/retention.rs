//! Operation records do not pile up: while leading, the control plane
//! deletes finished operations older than `[operations]
//! retain_finished_secs` (each cell's newest backup stays: the backup
//! schedule counts from it). Unfinished operations are never pruned.

use std::time::Duration;

use super::{OperationStore, now_ms};

/// `[operations]`: how long finished operation records are kept.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OperationsConfig {
    /// A finished operation last changed this long ago is deleted (0: keep
    /// every record).
    pub retain_finished_secs: u64,
}

impl Default for OperationsConfig {
    fn default() -> Self {
        Self {
            retain_finished_secs: 7 * 24 * 3600,
        }
    }
}

/// While leading: prunes finished operations every quarter of the
/// retention (at least every second, at most every hour).
pub async fn prune(config: OperationsConfig, store: OperationStore) {
    if config.retain_finished_secs == 0 {
        return std::future::pending().await;
    }
    let retain = Duration::from_secs(config.retain_finished_secs);
    let every = (retain / 4).clamp(Duration::from_secs(1), Duration::from_secs(3600));
    loop {
        match store.prune(now_ms(), retain.as_millis() as u64).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "finished operations pruned"),
            Err(e) => tracing::warn!(error = %e, "cannot prune finished operations"),
        }
        tokio::time::sleep(every).await;
    }
}
