//! The cell's background work beside serving: the minute's maintenance,
//! the second's check of the streaming users' homes, the tierer, the
//! upload sweeper (with foreign file copies and quota syncs), the clean-up
//! of what moved away, and the watch that reports a failed store to health
//! probes. Started together, aborted together.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::clock::Clock;
use crate::config::CellConfig;
use crate::message::MessageService;
use crate::storage::Store;
use crate::sync::{Hub, SyncService};

/// The background tasks of a running cell.
pub(super) struct Background(Vec<JoinHandle<()>>);

impl Background {
    pub fn spawn(
        config: &CellConfig,
        service: &Arc<MessageService>,
        sync: &Arc<SyncService>,
        hub: &Arc<Hub>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self(vec![
            tokio::spawn(maintain(service.clone(), hub.clone(), clock)),
            tokio::spawn(recheck_homes(Arc::downgrade(sync))),
            tokio::spawn(crate::message::run_tierer(Arc::downgrade(service))),
            tokio::spawn(sweep_uploads(
                Arc::downgrade(service),
                Duration::from_millis(config.attachments.sweep_interval_ms),
                Duration::from_secs(config.attachments.quota_sync_secs),
            )),
            tokio::spawn(clean_moved(
                service.clone(),
                sync.clone(),
                Duration::from_secs(config.routing.cleanup_grace_secs),
            )),
        ])
    }

    pub fn abort(self) {
        for task in self.0 {
            task.abort();
        }
    }
}

/// A store that failed a write refuses every later one: says so to
/// probes, so that the control plane fails this cell over.
pub(super) fn report_storage_failure(
    reporter: cellmesh_proto::server::Reporter,
    store: &Arc<Store>,
) {
    let store = Arc::downgrade(store);
    tokio::spawn(async move {
        while let Some(store) = store.upgrade() {
            if let Some(reason) = store.failed() {
                tracing::error!(%reason, "storage failed: reporting NOT_SERVING");
                cellmesh_proto::server::report_not_serving(&reporter).await;
                return;
            }
            drop(store);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
}

/// Indexes open uploads once, then copies files that came from other
/// regions every second, asks the other cells for the bytes of the tenants
/// with a quota every `quota_sync`, and sweeps expired uploads and
/// recalled files every `sweep` while the service lives.
async fn sweep_uploads(
    service: std::sync::Weak<MessageService>,
    sweep: Duration,
    quota_sync: Duration,
) {
    // A store from before the open-upload index gets it, once.
    if let Some(service) = service.upgrade() {
        match service.store().index_open_uploads().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(indexed = n, "open uploads indexed"),
            Err(e) => tracing::warn!(error = %e, "indexing open uploads failed"),
        }
    }
    let mut last_sweep = tokio::time::Instant::now();
    let mut last_quota_sync: Option<tokio::time::Instant> = None;
    loop {
        tokio::time::sleep(sweep.min(Duration::from_secs(1))).await;
        let Some(service) = service.upgrade() else {
            return;
        };
        if !quota_sync.is_zero() && last_quota_sync.is_none_or(|at| at.elapsed() >= quota_sync) {
            last_quota_sync = Some(tokio::time::Instant::now());
            service.sync_quotas().await;
        }
        match service.copy_foreign_files().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(copied = n, "files copied in from other regions"),
            Err(e) => tracing::warn!(error = %e, "copying files in failed"),
        }
        if last_sweep.elapsed() < sweep {
            continue;
        }
        last_sweep = tokio::time::Instant::now();
        match service.sweep_uploads().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(swept = n, "uploads swept"),
            Err(e) => tracing::warn!(error = %e, "upload sweep failed"),
        }
    }
}

async fn maintain(service: Arc<MessageService>, hub: Arc<Hub>, clock: Arc<dyn Clock>) {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    loop {
        tick.tick().await;
        service.maintain();
        hub.prune(clock.now_ms());
    }
}

/// Ends the streams of users whose home moved away, within a second.
async fn recheck_homes(sync: std::sync::Weak<SyncService>) {
    let mut tick = tokio::time::interval(crate::sync::stream::HOME_CHECK);
    loop {
        tick.tick().await;
        let Some(sync) = sync.upgrade() else {
            return;
        };
        sync.recheck_homes();
    }
}

/// Drops this cell's copies of what moved away, once `grace` has passed
/// (0: keep them).
async fn clean_moved(service: Arc<MessageService>, sync: Arc<SyncService>, grace: Duration) {
    // Tenants sealed whole before a restart, their keys not yet marked.
    if let Err(e) = sync.expand_sealed_tenants().await {
        tracing::warn!(error = %e, "marking sealed tenants' keys failed");
    }
    if grace.is_zero() {
        return;
    }
    let mut tick =
        tokio::time::interval((grace / 4).clamp(Duration::from_secs(1), Duration::from_secs(60)));
    loop {
        tick.tick().await;
        if let Err(e) = service.clean_moved(grace).await {
            tracing::warn!(error = %e, "cleaning up moved conversations failed");
        }
        if let Err(e) = sync.clean_moved_users(grace).await {
            tracing::warn!(error = %e, "cleaning up moved user homes failed");
        }
    }
}
