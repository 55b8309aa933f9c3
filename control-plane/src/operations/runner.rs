//! Runs the recorded operations on the active replica: every operation not
//! finished and not running here is started (a Running one was left by a
//! replica that lost its leadership, and is resumed), its progress is
//! written back twice a second, a cancel asked for through the API stops it
//! (a move's route is cancelled in the table), and a pause or resume is
//! carried to the move's route (`Migrating/Paused`, where the move holds
//! before its next copy round or its freeze). Every write to a record is a
//! compare-and-put of the runner's own fields, so an operator's request is
//! never overwritten. Dropping the runner's future — leadership lost — stops
//! every operation it runs.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::Instrument;

use cellmesh_proto::v1::MigrationPhase;
use cellmesh_proto::v1::update_route::Transition;
use cellmesh_route_client::commands::update_route;
use cellmesh_route_client::table::{Phase, RouteState};
use tokio::task::JoinSet;

use super::{FileProgress, Operation, OperationStore, Spec, State, now_ms};
use crate::migration::bulk::BulkEvent;
use crate::migration::{MigrationOptions, Migrator};

/// How often the runner looks for new operations and cancels.
const SCAN: Duration = Duration::from_millis(250);
/// How often a running operation's progress is recorded.
const REPORT: Duration = Duration::from_millis(500);

/// Progress as the running task sees it.
#[derive(Default, Clone)]
struct Live {
    phase: String,
    done: u64,
    total: u64,
    /// Rows (messages and events) copied, rows behind, and the freeze so
    /// far, where the operation knows them (tenant moves).
    rows: u64,
    lag: u64,
    frozen_ms: u64,
    bytes: u64,
    eta_ms: u64,
    files: FileProgress,
}

impl Live {
    fn record(&self, op: &mut Operation) {
        (op.phase, op.done, op.total) = (self.phase.clone(), self.done, self.total);
        (op.rows, op.lag, op.frozen_ms) = (self.rows, self.lag, self.frozen_ms);
        (op.bytes, op.eta_ms, op.files) = (self.bytes, self.eta_ms, self.files);
    }
}

/// Runs operations until dropped.
pub async fn run_operations(store: OperationStore, migrator: Arc<Migrator>, name: String) {
    let mut tasks: JoinSet<()> = JoinSet::new();
    let mut running: HashMap<String, tokio::task::AbortHandle> = HashMap::new();
    loop {
        while let Some(done) = tasks.try_join_next() {
            if let Err(e) = done
                && e.is_panic()
            {
                tracing::error!(error = %e, "an operation task panicked");
            }
        }
        running.retain(|_, handle| !handle.is_finished());
        match store.list().await {
            Ok(ops) => {
                for op in ops
                    .into_values()
                    .filter(|op| !op.state.is_final() && !op.spec.runs_in_cell())
                {
                    if op.cancel_requested {
                        if let Some(handle) = running.remove(&op.id) {
                            handle.abort();
                        }
                        cancel(&store, &migrator, op).await;
                        continue;
                    }
                    if op.pause_requested != op.route_paused {
                        carry_pause(&store, &migrator, &op).await;
                    }
                    if !running.contains_key(&op.id) {
                        let id = op.id.clone();
                        let handle =
                            tasks.spawn(run_one(store.clone(), migrator.clone(), name.clone(), op));
                        running.insert(id, handle);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read operations"),
        }
        tokio::time::sleep(SCAN).await;
    }
}

/// Cancels a move's route (the key stays where it was) and records it.
async fn cancel(store: &OperationStore, migrator: &Migrator, op: Operation) {
    if let Some(key) = op.spec.key() {
        let moving = migrator.routes().read(|t| {
            t.entry(&key)
                .filter(|e| e.state != RouteState::Active)
                .map(|e| e.epoch)
        });
        if let Some(epoch) = moving
            && let Err(e) = migrator
                .routes()
                .apply(update_route(&key, epoch, Transition::Cancel(true)))
                .await
        {
            tracing::warn!(%key, error = %e.message(), "cancelling the move's route failed; retrying");
            return;
        }
    }
    let recorded = store
        .update(&op.id, |op| {
            op.state = State::Cancelled;
            op.message = "cancelled".into();
            op.updated_ms = now_ms();
        })
        .await;
    if let Err(e) = recorded {
        tracing::warn!(id = %op.id, error = %e, "cannot record a cancel");
    }
}

/// Carries an operation's pause or resume to its move's route: a move
/// under way (not frozen) is set to `Paused`, or from `Paused` back to
/// `CatchUp`; the record notes what the route holds. A move not begun yet
/// is paused once it begins; a frozen one finishes first.
async fn carry_pause(store: &OperationStore, migrator: &Migrator, op: &Operation) {
    let (Some(key), Some(to)) = (op.spec.key(), op.spec.target()) else {
        return;
    };
    let entry = migrator.routes().read(|t| t.entry(&key).cloned());
    let phase = match &entry {
        Some(e) => match &e.state {
            RouteState::Migrating { to: t, phase } if t == to => Some(*phase),
            _ => None,
        },
        None => None,
    };
    let want = if op.pause_requested {
        MigrationPhase::Paused
    } else {
        MigrationPhase::CatchUp
    };
    match (phase, entry) {
        (Some(phase), Some(entry)) if (phase == Phase::Paused) != op.pause_requested => {
            let change = update_route(&key, entry.epoch, Transition::SetPhase(want as i32));
            if let Err(e) = migrator.routes().apply(change).await {
                tracing::warn!(%key, error = %e.message(), "carrying a pause to the route failed; retrying");
                return;
            }
        }
        (Some(_), _) => {}
        // Not moving (yet, or any more): nothing holds the route.
        (None, _) if op.pause_requested => return,
        (None, _) => {}
    }
    let paused = op.pause_requested;
    if let Err(e) = store.update(&op.id, |op| op.route_paused = paused).await {
        tracing::warn!(id = %op.id, error = %e, "cannot record a pause");
    }
}

/// Runs one operation to its end, recording progress and the outcome.
async fn run_one(store: OperationStore, migrator: Arc<Migrator>, name: String, op: Operation) {
    let started = store
        .update(&op.id, |op| {
            op.state = State::Running;
            op.runner = name.clone();
            op.updated_ms = now_ms();
        })
        .await;
    if let Err(e) = started {
        tracing::warn!(id = %op.id, error = %e, "cannot record an operation start");
        return;
    }
    let live = Arc::new(Mutex::new(Live::default()));
    let reporter = async {
        loop {
            tokio::time::sleep(REPORT).await;
            let now = live.lock().expect("progress").clone();
            crate::metrics::progress(&op.id, &op.spec, &now.phase, now.done, now.total, now.rows);
            let _ = store
                .update(&op.id, |op| {
                    now.record(op);
                    op.updated_ms = now_ms();
                })
                .await;
        }
    };
    let outcome = tokio::select! {
        outcome = execute(&migrator, &op.spec, live.clone()).instrument(tracing::info_span!(
            "operation",
            op_id = %op.id,
            what = %op.spec.describe(),
            cellmesh.always_sample = true,
        )) => outcome,
        _ = reporter => unreachable!("the reporter runs until dropped"),
    };
    let (state, message) = match outcome {
        Ok(message) => (State::Succeeded, message),
        Err(message) => (State::Failed, message),
    };
    let now = live.lock().expect("progress").clone();
    crate::metrics::finished(&op.id, &op.spec, state == State::Succeeded, now.frozen_ms);
    let finished = store
        .update(&op.id, |op| {
            now.record(op);
            (op.state, op.message) = (state, message.clone());
            op.updated_ms = now_ms();
        })
        .await;
    if let Err(e) = finished {
        tracing::warn!(id = %op.id, error = %e, "cannot record an operation's outcome");
    }
}

/// Does what `spec` says; a summary, or why it failed.
async fn execute(
    migrator: &Migrator,
    spec: &Spec,
    live: Arc<Mutex<Live>>,
) -> Result<String, String> {
    let set = |phase: &str, done: u64, total: u64| {
        let mut live = live.lock().expect("progress");
        if live.phase != phase {
            // A span event on the operation's trace per phase.
            tracing::info!(phase, done, total, "phase");
        }
        *live = Live {
            phase: phase.to_string(),
            done,
            total,
            ..Live::default()
        };
    };
    match spec {
        Spec::MoveConversation {
            tenant,
            conversation,
            to,
        } => migrator
            .migrate_conversation(TenantId(*tenant), ConversationId(*conversation), to, |p| {
                set(p.phase, p.copied_through, p.source_latest)
            })
            .await
            .map(|r| {
                format!(
                    "moved through seq {} ({} verified)",
                    r.final_seq, r.messages_verified
                )
            })
            .map_err(|e| e.to_string()),
        Spec::MoveUser { tenant, user, to } => migrator
            .migrate_user(TenantId(*tenant), UserId(*user), to, |p| {
                set(p.phase, p.copied_through, p.source_latest)
            })
            .await
            .map(|r| format!("moved through pts {}", r.final_pts))
            .map_err(|e| e.to_string()),
        Spec::MoveTenant {
            tenant,
            to,
            parallel,
            rate,
            file_rate,
        } => {
            move_tenant(
                migrator,
                (*tenant, to),
                *parallel,
                (*rate, *file_rate),
                live,
            )
            .await
        }
        Spec::Drain { cell, to, parallel } => {
            let mut moved = 0;
            let report = migrator
                .drain(cell, to.as_deref(), (*parallel).max(1), |e| {
                    if let BulkEvent::Moved(_) = e {
                        moved += 1;
                        set("moving", moved, 0);
                    }
                })
                .await
                .map_err(|e| e.to_string())?;
            bulk_outcome(report)
        }
        Spec::Failback { cell, parallel } => {
            let mut moved = 0;
            let report = migrator
                .failback(cell, (*parallel).max(1), |e| {
                    if let BulkEvent::Moved(_) = e {
                        moved += 1;
                        set("moving", moved, 0);
                    }
                })
                .await
                .map_err(|e| e.to_string())?;
            bulk_outcome(report)
        }
        Spec::Backup { cell, keep } => {
            set("backing up", 0, 1);
            super::backup::take(migrator, cell, *keep).await
        }
        Spec::ExpireHistory { .. } => Err("a cell runs its deletions itself".into()),
    }
}

/// A tenant move, its progress in `live`; a summary.
async fn move_tenant(
    migrator: &Migrator,
    (tenant, to): (u64, &str),
    parallel: usize,
    (rate, file_rate): (u64, u64),
    live: Arc<Mutex<Live>>,
) -> Result<String, String> {
    let migrator = migrator.with_options(MigrationOptions {
        rate,
        file_rate,
        ..migrator.options.clone()
    });
    migrator
                .migrate_tenant(TenantId(tenant), to, parallel.max(1), |p| {
                    *live.lock().expect("progress") = Live {
                        phase: p.phase.to_string(),
                        done: p.moved,
                        total: p.conversations + p.users_moved,
                        rows: p.messages,
                        lag: p.lag,
                        frozen_ms: p.max_freeze.as_millis() as u64,
                        bytes: p.bytes,
                        eta_ms: p.eta().map_or(0, |d| d.as_millis() as u64),
                        files: FileProgress {
                            copied: p.files_copied,
                            total: p.files_total,
                            bytes_copied: p.file_bytes_copied,
                            bytes_total: p.file_bytes_total,
                        },
                    };
                })
                .await
                .map(|r| {
                    format!(
                        "{} conversations and {} user homes moved to {} ({} messages and events, {} bytes copied, frozen {} ms, {} route writes; {} files ({} bytes) copied into its region, {} still copying)",
                        r.conversations_moved,
                        r.users_moved,
                        r.to,
                        r.messages_moved,
                        r.bytes_moved,
                        r.max_freeze.as_millis(),
                        r.route_writes,
                        r.files.files,
                        r.files.bytes,
                        r.files.files_pending
                    )
                })
                .map_err(|e| e.to_string())
}

fn bulk_outcome(report: crate::migration::bulk::BulkReport) -> Result<String, String> {
    if report.failures.is_empty() {
        Ok(format!(
            "{} conversations moved to {}",
            report.conversations_moved, report.to
        ))
    } else {
        Err(format!(
            "{} routes did not move (running again resumes them): {}",
            report.failures.len(),
            report
                .failures
                .iter()
                .map(|(k, e)| format!("{k}: {e}"))
                .collect::<Vec<_>>()
                .join("; ")
        ))
    }
}
