//! Moving a whole tenant from cell A to cell B (DESIGN.md §5). The tenant's
//! entry goes `Migrating{B}` first: from then on new conversations are
//! created on B (each placed with its own route there), while the existing
//! ones move one by one, several at a time, each through the conversation
//! protocol of [`super`]. Then the tenant entry freezes, A is asked for its
//! conversations once more — after it has seen the freeze and no creation
//! it checked before is in flight — the stragglers move, and only then does
//! the tenant entry switch to B. The homes of the tenant's users (the
//! members of its conversations) move the same way, each through the
//! user-home protocol, after the conversations and again for members who
//! joined meanwhile. Overrides that now agree with the tenant are dropped. Every step is in the route table: running the
//! move again resumes it.

use std::time::{Duration, Instant};

use cellmesh_proto::v1::TenantConversationsRequest;
use cellmesh_route_client::table::{Key, RouteState, Scope};
use futures::StreamExt;

use super::{MigrationError, Migrator, call};
use cellmesh_proto::v1::update_route::Transition;

/// Where a tenant move stands (for progress bars).
#[derive(Debug, Clone, Default)]
pub struct TenantProgress {
    pub phase: &'static str,
    /// Conversations found on the source so far.
    pub conversations: u64,
    pub moved: u64,
    pub messages: u64,
    /// User homes moved so far.
    pub users_moved: u64,
    /// The longest freeze of one conversation so far.
    pub max_freeze: Duration,
}

/// What a tenant move is about.
#[derive(Clone, Copy)]
struct Plan<'a> {
    tenant: u64,
    from: &'a str,
    to: &'a str,
    parallel: usize,
}

#[derive(Debug, Clone)]
pub struct TenantMoveReport {
    pub tenant: u64,
    pub from: String,
    pub to: String,
    pub conversations_moved: u64,
    pub messages_moved: u64,
    pub users_moved: u64,
    /// The longest freeze of one conversation or user home.
    pub max_freeze: Duration,
    /// Overrides dropped once the tenant pointed at the target.
    pub overrides_removed: u64,
    pub total: Duration,
    /// The route epoch of the tenant entry's switch: after every
    /// conversation's.
    pub switch_epoch: u64,
}

impl Migrator {
    /// Moves every conversation of `tenant` and then the tenant itself to
    /// cell `to`, at most `parallel` conversations at a time; resumes an
    /// interrupted move.
    pub async fn migrate_tenant(
        &self,
        tenant: u64,
        to: &str,
        parallel: usize,
        mut progress: impl FnMut(&TenantProgress),
    ) -> Result<TenantMoveReport, MigrationError> {
        let started = Instant::now();
        let key = Key::tenant(tenant);
        let entry = self.current_entry(&key).await?;
        let from = entry.cell.clone();
        let start = self.begin_or_resume(&key, &entry, to).await?;
        let (mut epoch, frozen) = (start.epoch, start.frozen);
        let mut state = TenantProgress {
            phase: "conversations",
            ..Default::default()
        };
        let plan = Plan {
            tenant,
            from: &from,
            to,
            parallel,
        };
        if !frozen {
            epoch = self
                .hold_while_paused(&key, to, epoch, 0, &mut |_| {})
                .await?;
            self.move_conversations(&plan, 0, &mut state, &mut progress)
                .await?;
            state.phase = "user homes";
            self.move_users(&plan, &[&from], &mut state, &mut progress)
                .await?;
            epoch = self
                .hold_while_paused(&key, to, epoch, 0, &mut |_| {})
                .await?;
            epoch = self
                .transition(&key, epoch, Transition::Freeze(true))
                .await?;
        }
        // Conversations A created before it saw the tenant move.
        state.phase = "stragglers";
        self.move_conversations(&plan, epoch, &mut state, &mut progress)
            .await?;
        // Members who joined during the move, on either cell.
        self.move_users(&plan, &[&from, to], &mut state, &mut progress)
            .await?;
        let switch_epoch = self
            .transition(&key, epoch, Transition::SwitchFloor(0))
            .await?;
        state.phase = "switched";
        progress(&state);
        let overrides_removed = self.drop_agreeing_overrides(tenant, to).await;
        Ok(TenantMoveReport {
            tenant,
            from,
            to: to.to_string(),
            conversations_moved: state.moved,
            messages_moved: state.messages,
            users_moved: state.users_moved,
            max_freeze: state.max_freeze,
            overrides_removed,
            total: started.elapsed(),
            switch_epoch,
        })
    }

    /// Moves every conversation of the tenant that its source holds and
    /// still owns; `epoch` as in `TenantConversations`.
    async fn move_conversations(
        &self,
        plan: &Plan<'_>,
        epoch: u64,
        state: &mut TenantProgress,
        progress: &mut impl FnMut(&TenantProgress),
    ) -> Result<(), MigrationError> {
        let Plan {
            tenant,
            from,
            to,
            parallel,
        } = *plan;
        let (source, _) = self.peer(from).await?;
        let ids = all_pages(|after| {
            let mut source = source.clone();
            let list = self.request(TenantConversationsRequest {
                tenant_id: tenant,
                after_id: after,
                limit: 5_000,
                epoch,
            });
            async move {
                let page = source
                    .tenant_conversations(list)
                    .await
                    .map_err(call("list the source's conversations"))?
                    .into_inner();
                Ok((page.conversation_ids, page.has_more))
            }
        })
        .await?;
        // Only those the source still owns (not moved yet, not replicas).
        let ids = self.still_on(from, ids, |c| Key::conversation(tenant, c));
        state.conversations += ids.len() as u64;
        progress(state);
        let moves = ids.into_iter().map(|c| async move {
            self.hold_tenant(tenant, to).await?;
            self.migrate_conversation(tenant, c, to, |_| {}).await
        });
        all_of(moves, parallel, "a conversation", |report| {
            state.moved += 1;
            state.messages += report.messages_verified;
            state.max_freeze = state.max_freeze.max(report.frozen_for);
            progress(state);
        })
        .await
    }

    /// Moves the homes of the tenant's users that still live on the source
    /// by the tenant's entry or their own: the members of the tenant's
    /// conversations on `cells`.
    async fn move_users(
        &self,
        plan: &Plan<'_>,
        cells: &[&str],
        state: &mut TenantProgress,
        progress: &mut impl FnMut(&TenantProgress),
    ) -> Result<(), MigrationError> {
        let Plan {
            tenant,
            from,
            to,
            parallel,
        } = *plan;
        let mut users = std::collections::BTreeSet::new();
        for cell in cells {
            let (peer, _) = self.peer(cell).await?;
            users.extend(
                all_pages(|after| {
                    let mut peer = peer.clone();
                    let list = self.request(TenantConversationsRequest {
                        tenant_id: tenant,
                        after_id: after,
                        limit: 100_000,
                        epoch: 0,
                    });
                    async move {
                        let page = peer
                            .tenant_users(list)
                            .await
                            .map_err(call("list the tenant's users"))?
                            .into_inner();
                        Ok((page.user_ids, page.has_more))
                    }
                })
                .await?,
            );
        }
        let users = self.still_on(from, users, |u| Key::user(tenant, u));
        let moves = users.into_iter().map(|u| async move {
            self.hold_tenant(tenant, to).await?;
            self.migrate_user(tenant, u, to, |_| {}).await
        });
        all_of(moves, parallel, "a user home", |report| {
            state.users_moved += 1;
            state.max_freeze = state.max_freeze.max(report.frozen_for);
            progress(state);
        })
        .await
    }

    /// Waits while an operator holds the tenant's move (its entry
    /// `Migrating/Paused`) before the next conversation or home starts
    /// moving; once the tenant is frozen nothing holds it.
    async fn hold_tenant(&self, tenant: u64, to: &str) -> Result<(), MigrationError> {
        let key = Key::tenant(tenant);
        let migrating = self.routes.read(|t| {
            t.entry(&key)
                .is_some_and(|e| matches!(&e.state, RouteState::Migrating { to: t, .. } if t == to))
        });
        if migrating {
            self.hold_while_paused(&key, to, 0, 0, &mut |_| {}).await?;
        }
        Ok(())
    }

    /// The `ids` whose key (by `key`) the route table still places on
    /// `from`.
    fn still_on(
        &self,
        from: &str,
        ids: impl IntoIterator<Item = u64>,
        key: impl Fn(u64) -> Key,
    ) -> Vec<u64> {
        self.routes.read(|t| {
            ids.into_iter()
                .filter(|&id| t.effective(&key(id)).is_some_and(|e| e.cell == from))
                .collect()
        })
    }

    /// Removes the conversation and user-home overrides of `tenant` that
    /// agree with its route on `to` and carry no failover floor; how many.
    async fn drop_agreeing_overrides(&self, tenant: u64, to: &str) -> u64 {
        let agreeing: Vec<(Key, u64)> = self.routes.read(|t| {
            t.routes
                .range(Key::conversation(tenant, 0)..=Key::user(tenant, u64::MAX))
                .filter(|(k, e)| {
                    k.scope != Scope::Tenant
                        && e.cell == to
                        && e.state == RouteState::Active
                        && e.floor_margin == 0
                })
                .map(|(k, e)| (*k, e.epoch))
                .collect()
        });
        futures::stream::iter(agreeing)
            .map(|(key, epoch)| async move {
                self.transition(&key, epoch, Transition::Remove(true)).await
            })
            .buffer_unordered(16)
            .filter(|r| std::future::ready(r.is_ok()))
            .count()
            .await as u64
    }
}

/// Runs `moves`, `parallel` at a time, telling `done` of each that
/// finishes; the first failure, once all have run. The tenant stays where it
/// is in its move; running it again resumes with what is left.
async fn all_of<T>(
    moves: impl Iterator<Item = impl std::future::Future<Output = Result<T, MigrationError>>>,
    parallel: usize,
    what: &str,
    mut done: impl FnMut(T),
) -> Result<(), MigrationError> {
    let mut moves = futures::stream::iter(moves).buffer_unordered(parallel.max(1));
    let mut first_error = None;
    while let Some(result) = moves.next().await {
        match result {
            Ok(report) => done(report),
            Err(e) => {
                tracing::warn!(error = %e, "{what} of the tenant did not move");
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Every id of a paged listing; `fetch(after)` answers one page (the ids
/// above `after`, and whether more follow).
async fn all_pages<F, Fut>(mut fetch: F) -> Result<Vec<u64>, MigrationError>
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<u64>, bool), MigrationError>>,
{
    let (mut ids, mut after) = (Vec::new(), 0);
    loop {
        let (page, more) = fetch(after).await?;
        after = page.last().copied().unwrap_or(after);
        ids.extend(page);
        if !more {
            return Ok(ids);
        }
    }
}
