//! Moving a whole tenant from cell A to cell B as one workflow (DESIGN.md
//! §5), its phases recorded on the tenant's entry only:
//!
//! 1. **copy** — the entry goes `Migrating{B, Copy}`; B pulls every
//!    conversation's history and every member's home (sync queue,
//!    conversation list, mute flags, cursors) from A, many at a time, in
//!    checksummed chunks; new conversations are created on B meanwhile;
//! 2. **catch-up** — the entry goes `CatchUp`; rounds copy only what A's
//!    marks (`CellPeer.TenantMarks`: each item's latest position) show
//!    ahead, until the whole tenant is at most `tenant_catch_up_lag` behind;
//! 3. **verify** — whole digests of both cells are compared while writes
//!    still flow; an item that differs is copied again;
//! 4. **freeze** — one write: the entry goes `Frozen{B}` and A refuses the
//!    tenant's writes (the edge retries them); A seals the whole tenant at
//!    once and answers its final marks; B copies what changed since the
//!    last round, and only that is verified;
//! 5. **switch** — one write: the entry points at B. Conversations carry
//!    their seq with them, so no per-conversation floor or route is
//!    written. A drops its copy after the grace period;
//! 6. **files** — across regions, the move waits until B has copied the
//!    tenant's files into its region's store (`files.rs`).
//!
//! Keys of the tenant with a route of their own on A (what a failover or an
//! earlier move left) move first, one by one, through the single-key
//! protocol; overrides that agree with the tenant afterwards are dropped.
//! Every phase is in the route table and copying is idempotent: running
//! the move again resumes it. The order of the phases, their retries and
//! where a resumed move starts are decided by a pure state machine
//! (`engine.rs`); `migrate_tenant` carries out its actions.

mod engine;
mod files;
mod items;

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cellmesh_proto::v1::MigrationPhase;
use cellmesh_proto::v1::update_route::Transition;
use cellmesh_route_client::table::{Key, Phase, RouteState, Scope};
use futures::StreamExt;

use super::{MigrationError, Migrator};
use engine::{Action, Mismatch, Observation, Rounds, TenantEngine, TenantResume};
pub use files::FilesCopied;
use items::{Item, Items};

/// Where a tenant move stands (for progress bars).
#[derive(Debug, Clone, Default)]
pub struct TenantProgress {
    pub phase: &'static str,
    /// Conversations that move with the tenant, found so far.
    pub conversations: u64,
    /// Conversations and homes the target holds up to the source's last
    /// answer.
    pub moved: u64,
    /// Messages and sync events copied so far.
    pub messages: u64,
    /// Their encoded size, as the target stored it.
    pub bytes: u64,
    /// User homes that move with the tenant.
    pub users_moved: u64,
    /// How far the target is behind (messages and events).
    pub lag: u64,
    /// Copy and catch-up rounds so far.
    pub rounds: u32,
    /// How long the tenant has been frozen (zero before the freeze).
    pub max_freeze: Duration,
    /// When this run of the move began copying.
    pub copy_started: Option<Instant>,
    /// Files the target copied into its region, of how many (tenant moves
    /// across regions, after the switch).
    pub files_copied: u64,
    pub files_total: u64,
    pub file_bytes_copied: u64,
    pub file_bytes_total: u64,
}

impl TenantProgress {
    /// Rows a second copied since this run began copying.
    pub fn rate(&self) -> f64 {
        let secs = self.copy_started.map_or(0.0, |t| t.elapsed().as_secs_f64());
        if secs > 0.0 {
            self.messages as f64 / secs
        } else {
            0.0
        }
    }

    /// The time the target needs to catch up at that rate (`None` while
    /// nothing has been copied yet).
    pub fn eta(&self) -> Option<Duration> {
        let rate = self.rate();
        (rate > 0.0).then(|| Duration::from_secs_f64(self.lag as f64 / rate))
    }
}

#[derive(Debug, Clone)]
pub struct TenantMoveReport {
    pub tenant: TenantId,
    pub from: String,
    pub to: String,
    pub conversations_moved: u64,
    pub messages_moved: u64,
    pub bytes_moved: u64,
    pub users_moved: u64,
    /// How long the tenant's writes were refused: from the freeze's commit
    /// to the switch's.
    pub max_freeze: Duration,
    /// Where the freeze went, step by step (seal, final copy, verify, ...).
    pub freeze_steps: Vec<(&'static str, Duration)>,
    /// Overrides dropped once the tenant pointed at the target.
    pub overrides_removed: u64,
    /// Route-table writes the move made (the overrides moved one by one
    /// and dropped included).
    pub route_writes: u64,
    pub total: Duration,
    /// The route epoch of the tenant entry's switch.
    pub switch_epoch: u64,
    /// The tenant's files copied into the target's region.
    pub files: FilesCopied,
}

/// Durations of consecutive steps from a start.
struct Steps {
    last: Instant,
    steps: Vec<(&'static str, Duration)>,
}

impl Steps {
    fn new(from: Instant) -> Self {
        Self {
            last: from,
            steps: Vec::new(),
        }
    }

    fn done(&mut self, step: &'static str) {
        let now = Instant::now();
        self.steps.push((step, now - self.last));
        self.last = now;
    }
}

/// One run of a tenant move: what its actions share.
struct TenantRun<'k, 'm> {
    key: Key,
    from: String,
    to: &'k str,
    items: Items<'m>,
    state: TenantProgress,
    /// Route-table writes so far.
    writes: u64,
    frozen_at: Instant,
    /// The freeze's steps, timed from the freeze.
    steps: Steps,
}

impl Migrator {
    /// Moves every conversation and user home of `tenant` to cell `to`,
    /// `parallel` copies at a time; resumes an interrupted move.
    pub async fn migrate_tenant(
        &self,
        tenant: TenantId,
        to: &str,
        parallel: usize,
        mut progress: impl FnMut(&TenantProgress),
    ) -> Result<TenantMoveReport, MigrationError> {
        let started = Instant::now();
        let key = Key::tenant(tenant);
        let entry = self.current_entry(&key).await?;
        let from = entry.cell.clone();
        let start = self.begin_or_resume(&key, &entry, to).await?;
        let mut engine = TenantEngine::new(TenantResume {
            epoch: start.epoch,
            began: start.began,
            frozen: start.frozen,
            announce_catch_up: matches!(
                entry.state,
                RouteState::Active
                    | RouteState::Migrating {
                        phase: Phase::Copy,
                        ..
                    }
            ),
        });
        let mut run = TenantRun {
            key,
            items: self.items(tenant, &from, to, parallel).await?,
            from: from.clone(),
            to,
            state: TenantProgress::default(),
            writes: u64::from(start.began),
            frozen_at: Instant::now(),
            steps: Steps::new(Instant::now()),
        };
        let mut seen = Observation::Done;
        let (switch_epoch, switched) = loop {
            let next = engine.step(seen);
            if let Some(step) = next.step_done {
                run.steps.done(step);
            }
            if let Action::Finished { switch_epoch } = next.action {
                break (switch_epoch, next.phase);
            }
            if let Some(phase) = next.phase {
                run.state.phase = phase.as_str();
                progress(&run.state);
            }
            seen = self
                .execute(&mut run, next.action, parallel, &mut progress)
                .await?;
        };
        let TenantRun {
            items,
            mut state,
            writes,
            frozen_at,
            steps,
            ..
        } = run;
        state.max_freeze = frozen_at.elapsed();
        self.follow(switch_epoch).await;
        state.phase = switched.map_or(state.phase, |p| p.as_str());
        self.count(&items, &mut state);
        progress(&state);
        let overrides_removed = self.drop_agreeing_overrides(tenant, to).await;
        let files = (self.await_file_copies(tenant, to, &mut state, &mut progress)).await?;
        Ok(TenantMoveReport {
            tenant,
            from,
            to: to.to_string(),
            conversations_moved: state.conversations,
            messages_moved: state.messages,
            bytes_moved: state.bytes,
            users_moved: state.users_moved,
            max_freeze: state.max_freeze,
            freeze_steps: steps.steps,
            overrides_removed,
            route_writes: writes + overrides_removed,
            total: started.elapsed(),
            switch_epoch,
            files,
        })
    }

    /// Carries out one action of the tenant move's engine; what it found.
    async fn execute<'m>(
        &'m self,
        run: &mut TenantRun<'_, 'm>,
        action: Action,
        parallel: usize,
        progress: &mut impl FnMut(&TenantProgress),
    ) -> Result<Observation, MigrationError> {
        let (key, to) = (run.key, run.to);
        let tenant = key.tenant;
        Ok(match action {
            Action::Reached(point) => {
                self.stop_at(point)?;
                Observation::Done
            }
            Action::MoveOverrides => {
                let from = run.from.as_str();
                run.writes +=
                    (self.move_overrides(tenant, from, to, parallel, &mut run.state)).await?;
                Observation::Done
            }
            Action::HoldIfPaused { epoch } => {
                let epoch = self
                    .hold_while_paused(&key, to, epoch, 0, &mut |_| {})
                    .await?;
                Observation::Held {
                    epoch,
                    copying: self.copying(&key),
                }
            }
            Action::CatchUp(rounds) => {
                let items = &mut run.items;
                self.catch_up(items, &mut run.state, progress, rounds)
                    .await?;
                Observation::Done
            }
            Action::SetCatchUp { epoch } => {
                let phase = Transition::SetPhase(MigrationPhase::CatchUp as i32);
                run.writes += 1;
                Observation::Epoch(self.transition(&key, epoch, phase).await?)
            }
            Action::Verify => {
                let disagree = run.items.verify_copied().await?;
                if disagree > 0 {
                    tracing::warn!(%tenant, disagree, "copied items differ");
                }
                Observation::Disagree(disagree)
            }
            Action::CopyAgain => {
                run.items.copy_round(|_, _, _| {}).await?;
                Observation::Done
            }
            Action::Freeze { epoch } => {
                let epoch = self.commit(&key, epoch, Transition::Freeze(true)).await?;
                run.frozen_at = Instant::now();
                run.steps = Steps::new(run.frozen_at);
                run.writes += 1;
                Observation::Epoch(epoch)
            }
            Action::Reload => {
                // Resumed under the freeze: start from what the target holds.
                let items = &mut run.items;
                items.refresh_target_users().await?;
                let source = items.marks(true, None, false).await?;
                self.note_marks(items, &source);
                let target = items.marks(false, None, false).await?;
                items.note_target(&target);
                Observation::Done
            }
            Action::Follow { epoch } => {
                self.follow(epoch).await;
                Observation::Done
            }
            Action::Seal { epoch } => {
                let items = &mut run.items;
                let sealed = items.seal(epoch).await?;
                self.note_marks(items, &sealed);
                Observation::Done
            }
            Action::DeltaRound => {
                let items = &mut run.items;
                items.copy_round(|_, _, _| {}).await?;
                Observation::Lag(items.lag())
            }
            Action::VerifyAndFlush => {
                Observation::Verified(self.verify_and_flush(&mut run.items, to).await?)
            }
            Action::Cancel { epoch, mismatch } => {
                self.transition(&key, epoch, Transition::Cancel(true))
                    .await
                    .ok();
                tracing::error!(%tenant, "move cancelled");
                return Err(MigrationError::Mismatch {
                    source_count: mismatch.source_count,
                    source_sum: mismatch.source_sum,
                    target_count: mismatch.target_count,
                    target_sum: mismatch.target_sum,
                });
            }
            Action::Switch { epoch } => {
                let epoch = self.commit_switch(&key, epoch, 0, to).await?;
                run.writes += 1;
                Observation::Epoch(epoch)
            }
            Action::Finished { .. } => unreachable!("the run ends before a finished move"),
        })
    }

    /// Whether `key`'s entry is in a move's Copy phase.
    fn copying(&self, key: &Key) -> bool {
        self.routes.read(|t| {
            t.entry(key).is_some_and(|e| {
                matches!(
                    e.state,
                    RouteState::Migrating {
                        phase: Phase::Copy,
                        ..
                    }
                )
            })
        })
    }

    /// Verifies the items copied under the freeze while the target's marks
    /// reach its standbys (both are needed before the switch, neither needs
    /// the other); the first item that differs.
    async fn verify_and_flush(
        &self,
        items: &mut Items<'_>,
        to: &str,
    ) -> Result<Option<Mismatch>, MigrationError> {
        let tenant = items.tenant;
        let (verified, flushed) = tokio::join!(items.verify_final(), self.flush_marks(to));
        let Some((item, (a, b))) = verified? else {
            flushed?;
            return Ok(None);
        };
        tracing::error!(%tenant, ?item, "the tenant's copy differs under the freeze");
        Ok(Some(Mismatch {
            source_count: a.count,
            source_sum: a.checksum,
            target_count: b.count,
            target_sum: b.checksum,
        }))
    }

    /// The tenant's items, copied from `from` to `to`.
    async fn items(
        &self,
        tenant: TenantId,
        from: &str,
        to: &str,
        parallel: usize,
    ) -> Result<Items<'_>, MigrationError> {
        let (source, source_address) = self.peer(from).await?;
        let (target, _) = self.peer(to).await?;
        Ok(Items {
            migrator: self,
            tenant,
            from: from.to_string(),
            to: to.to_string(),
            source,
            source_address,
            target,
            parallel: parallel.max(1),
            items: BTreeMap::new(),
            copied_rows: 0,
            copied_bytes: 0,
            target_users: Vec::new(),
            token: 0,
            target_token: 0,
        })
    }

    /// Copy rounds until the tenant is close enough (or, with
    /// [`Rounds::One`], after one round), at most `max_catch_up_rounds`,
    /// holding while an operator pauses the move.
    async fn catch_up(
        &self,
        items: &mut Items<'_>,
        state: &mut TenantProgress,
        progress: &mut impl FnMut(&TenantProgress),
        rounds: Rounds,
    ) -> Result<(), MigrationError> {
        state.copy_started.get_or_insert_with(Instant::now);
        for _ in 0..self.options.max_catch_up_rounds.max(1) {
            let fresh = state.rounds == 0;
            items.refresh_target_users().await?;
            let source = items.marks(true, None, false).await?;
            self.note_marks(items, &source);
            if fresh {
                let target = items.marks(false, None, false).await?;
                items.note_target(&target);
            }
            self.count(items, state);
            progress(state);
            let in_step = state.moved;
            items
                .copy_round(|done, rows, bytes| {
                    (state.moved, state.messages, state.bytes) = (in_step + done, rows, bytes);
                    progress(state);
                })
                .await?;
            state.rounds += 1;
            self.count(items, state);
            progress(state);
            if rounds == Rounds::One || state.lag <= self.options.tenant_catch_up_lag {
                return Ok(());
            }
            items.hold().await?;
            tokio::time::sleep(self.options.pause).await;
        }
        Ok(())
    }

    /// Takes in the source's marks: the items that move with the tenant
    /// are those without a route of their own (a user home new to this run
    /// is copied afresh: the target may hold an older queue of the user).
    fn note_marks(&self, items: &mut Items<'_>, marks: &cellmesh_proto::v1::TenantMarksResponse) {
        let tenant = items.tenant;
        self.routes.read(|t| {
            items.note_source(marks, |item| {
                let key = match item {
                    Item::Conversation(c) => Key::conversation(tenant, ConversationId(c)),
                    Item::User(u) => Key::user(tenant, UserId(u)),
                };
                t.entry(&key).is_none()
            })
        });
    }

    fn count(&self, items: &Items<'_>, state: &mut TenantProgress) {
        state.conversations = items
            .items
            .keys()
            .filter(|i| matches!(i, Item::Conversation(_)))
            .count() as u64;
        state.users_moved = items.items.len() as u64 - state.conversations;
        state.moved = items.in_step();
        state.lag = items.lag();
        state.messages = items.copied_rows;
        state.bytes = items.copied_bytes;
    }

    /// Moves, one by one, the tenant's keys whose own route places them on
    /// `from` (what a failover or an earlier move left); how many route
    /// writes that took.
    async fn move_overrides(
        &self,
        tenant: TenantId,
        from: &str,
        to: &str,
        parallel: usize,
        state: &mut TenantProgress,
    ) -> Result<u64, MigrationError> {
        let keys: Vec<Key> = self.routes.read(|t| {
            t.routes
                .range(
                    Key::conversation(tenant, ConversationId(0))
                        ..=Key::user(tenant, UserId(u64::MAX)),
                )
                .filter(|(k, e)| k.scope != Scope::Tenant && e.cell == from)
                .map(|(k, _)| *k)
                .collect()
        });
        let moves = keys.clone().into_iter().map(|key| async move {
            match key.scope {
                Scope::Conversation(c) => self
                    .migrate_conversation(tenant, ConversationId(c), to, |_| {})
                    .await
                    .map(|_| ()),
                Scope::User(u) => self
                    .migrate_user(tenant, UserId(u), to, |_| {})
                    .await
                    .map(|_| ()),
                Scope::Tenant => Ok(()),
            }
        });
        let mut moves = futures::stream::iter(moves).buffer_unordered(parallel.max(1));
        let mut first_error = None;
        while let Some(result) = moves.next().await {
            if let Err(e) = result {
                tracing::warn!(error = %e, "a key of the tenant with its own route did not move");
                first_error.get_or_insert(e);
            }
        }
        state.moved += keys.len() as u64;
        // Begin, catch-up, freeze and switch each.
        first_error.map_or(Ok(4 * keys.len() as u64), Err)
    }

    /// Removes the conversation and user-home overrides of `tenant` that
    /// agree with its route on `to` and carry no failover floor; how many.
    async fn drop_agreeing_overrides(&self, tenant: TenantId, to: &str) -> u64 {
        let agreeing: Vec<(Key, u64)> = self.routes.read(|t| {
            t.routes
                .range(
                    Key::conversation(tenant, ConversationId(0))
                        ..=Key::user(tenant, UserId(u64::MAX)),
                )
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
