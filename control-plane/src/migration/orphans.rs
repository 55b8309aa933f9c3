//! Moves nobody drives any more. Every phase of a move is in the route
//! table, so the leading control plane finishes a move whose migrator went
//! away (an operator's `ctl` killed, a replica that died mid-move): a key
//! that stays Migrating without a route change for `resume_after`, or
//! Frozen — refusing writes — for `resume_frozen_after`, is resumed from
//! where the table says it is, by the leading replica only (its resumes
//! stop when it loses the lead). A paused move is left to its operator. For a
//! tenant, any route change of the tenant's keys counts as progress.

use cellmesh_proto::ids::{ConversationId, UserId};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellmesh_route_client::table::{Entry, Key, Phase, RouteState, Scope};
use serde::{Deserialize, Serialize};

use super::{MigrationError, Migrator};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OrphanConfig {
    /// A move not frozen, without a route change this long, is resumed.
    pub resume_after_ms: u64,
    /// A frozen key (writes refused) is resumed after this long.
    pub resume_frozen_after_ms: u64,
    /// Conversations at a time when a tenant move is resumed.
    pub tenant_parallel: usize,
}

impl Default for OrphanConfig {
    fn default() -> Self {
        Self {
            resume_after_ms: 120_000,
            resume_frozen_after_ms: 10_000,
            tenant_parallel: 8,
        }
    }
}

/// Watches the route table and resumes orphaned moves, until dropped;
/// moves an unfinished operation in `operations` drives are left to it.
pub async fn resume_orphans(
    migrator: Migrator,
    config: OrphanConfig,
    operations: Option<crate::operations::OperationStore>,
) {
    let migrator = Arc::new(migrator);
    // Key → (the progress mark last seen, since when).
    let mut seen: HashMap<Key, (u64, Instant)> = HashMap::new();
    let running: Arc<Mutex<HashSet<Key>>> = Arc::default();
    // Owned here: when leadership is lost and this future is dropped, the
    // moves it resumed stop with it.
    let mut resumed = tokio::task::JoinSet::new();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        while resumed.try_join_next().is_some() {}
        let moving: Vec<(Entry, u64)> = migrator.routes.read(|t| {
            t.routes
                .values()
                .filter(|e| e.state != RouteState::Active)
                .map(|e| {
                    let progress = match e.key.scope {
                        Scope::Tenant => t
                            .routes
                            .range(
                                Key::tenant(e.key.tenant)
                                    ..=Key::user(e.key.tenant, UserId(u64::MAX)),
                            )
                            .map(|(_, e)| e.epoch)
                            .max()
                            .unwrap_or(e.epoch),
                        _ => e.epoch,
                    };
                    (e.clone(), progress)
                })
                .collect()
        });
        seen.retain(|k, _| moving.iter().any(|(e, _)| e.key == *k));
        let driven: Vec<crate::operations::Operation> = match &operations {
            Some(store) if !moving.is_empty() => match store.list().await {
                Ok(ops) => ops.into_values().collect(),
                // Unknown: leave every move alone this round.
                Err(_) => continue,
            },
            _ => Vec::new(),
        };
        for (entry, progress) in moving {
            if crate::operations::drives(&driven, &entry.key) {
                seen.remove(&entry.key);
                continue;
            }
            let now = Instant::now();
            let since = seen.entry(entry.key).or_insert((progress, now));
            if since.0 != progress {
                *since = (progress, now);
            }
            let (to, limit) = match &entry.state {
                RouteState::Migrating {
                    phase: Phase::Paused,
                    ..
                } => {
                    since.1 = now;
                    continue;
                }
                RouteState::Migrating { to, .. } => (to.clone(), config.resume_after_ms),
                RouteState::Frozen { to } => (to.clone(), config.resume_frozen_after_ms),
                RouteState::Active => continue,
            };
            if since.1.elapsed() < Duration::from_millis(limit)
                || !running.lock().expect("running").insert(entry.key)
            {
                continue;
            }
            since.1 = now;
            let (migrator, running, parallel) =
                (migrator.clone(), running.clone(), config.tenant_parallel);
            resumed.spawn(async move {
                let key = entry.key;
                tracing::warn!(%key, %to, "resuming a move nobody drives");
                match resume(&migrator, key, &to, parallel).await {
                    Ok(()) => tracing::info!(%key, %to, "resumed move finished"),
                    Err(e) => tracing::warn!(%key, error = %e, "resumed move failed"),
                }
                running.lock().expect("running").remove(&key);
            });
        }
    }
}

async fn resume(
    migrator: &Migrator,
    key: Key,
    to: &str,
    parallel: usize,
) -> Result<(), MigrationError> {
    match key.scope {
        Scope::Conversation(c) => migrator
            .migrate_conversation(key.tenant, ConversationId(c), to, |_| {})
            .await
            .map(|_| ()),
        Scope::User(u) => migrator
            .migrate_user(key.tenant, UserId(u), to, |_| {})
            .await
            .map(|_| ()),
        Scope::Tenant => migrator
            .migrate_tenant(key.tenant, to, parallel, |_| {})
            .await
            .map(|_| ()),
    }
}
