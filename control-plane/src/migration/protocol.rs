//! The phases every move goes through, whatever moves (DESIGN.md §5): copy
//! rounds until the target is close, verification of what is copied while
//! writes still flow, freeze, seal of the source, the final delta, its
//! verification, switch. The decisions are the pure [`MoveEngine`]'s; this
//! module executes its actions against the route table and, through a
//! [`Subject`], the cell calls for one kind of key — a conversation's
//! history, a user's sync queue.

use std::time::Instant;

use cellmesh_proto::v1::update_route::Transition;
use cellmesh_proto::v1::{CopyResponse, DigestResponse, MigrationPhase};
use cellmesh_route_client::table::{Key, Phase, RouteState};

use super::engine::{Action, EngineOptions, MoveEngine, Observation, Resume};
use super::{MigrationError, Migrator, Progress, Start};

/// The cell calls that move one key.
pub(super) trait Subject {
    /// The target's latest position must equal the source's at the end
    /// (a target may hold leftovers from an earlier home of the key).
    const EXACT_LATEST: bool;

    /// Where copying goes on from: what the target holds already.
    async fn resume_point(&mut self, start: &Start) -> Result<u64, MigrationError>;
    /// Has the target copy everything after `after` the source holds.
    async fn copy(&mut self, after: u64) -> Result<CopyResponse, MigrationError>;
    /// Source and target digests of `(after, through]`.
    async fn digests(
        &mut self,
        after: u64,
        through: u64,
    ) -> Result<(DigestResponse, DigestResponse), MigrationError>;
    /// Seals the source at the freeze `epoch`, where the target holds
    /// everything through `copied`; the source's final position and how
    /// far the target holds it now (a seal may bring the final delta along).
    async fn seal(&mut self, epoch: u64, copied: u64) -> Result<(u64, u64), MigrationError>;
    /// The route's `seq_floor` at the switch.
    fn switch_floor(&self, final_position: u64) -> u64;
}

/// What a finished move reports.
pub(super) struct Moved {
    pub final_position: u64,
    pub verified: u64,
    pub frozen_for: std::time::Duration,
    pub switch_epoch: u64,
}

impl Migrator {
    /// Runs `key`'s move to `to` from `start` (the entry as it was read is
    /// `state`) through the switch: executes the [`MoveEngine`]'s actions.
    pub(super) async fn run_move<S: Subject>(
        &self,
        key: &Key,
        state: &RouteState,
        start: Start,
        subject: &mut S,
        to: &str,
        progress: &mut impl FnMut(&Progress),
    ) -> Result<Moved, MigrationError> {
        let options = EngineOptions {
            catch_up_lag: self.options.catch_up_lag,
            max_catch_up_rounds: self.options.max_catch_up_rounds,
            round_messages: self.options.round_messages,
            exact_latest: S::EXACT_LATEST,
        };
        let resume = Resume {
            epoch: start.epoch,
            frozen: start.frozen,
            announce_catch_up: matches!(
                state,
                RouteState::Active
                    | RouteState::Migrating {
                        phase: Phase::Copy,
                        ..
                    }
            ),
        };
        let mut engine = MoveEngine::new(options, resume);
        let mut frozen_at = Instant::now();
        let mut seen = Observation::Start {
            copied: subject.resume_point(&start).await?,
        };
        loop {
            let (report, action) = engine.step(seen);
            if let Some(report) = report {
                progress(&report);
            }
            seen = match action {
                Action::HoldIfPaused { epoch, copied } => Observation::Held {
                    epoch: self
                        .hold_while_paused(key, to, epoch, copied, progress)
                        .await?,
                },
                Action::Copy { after } => Observation::Copied(subject.copy(after).await?),
                Action::SetCatchUp { epoch } => Observation::Epoch(
                    self.transition(
                        key,
                        epoch,
                        Transition::SetPhase(MigrationPhase::CatchUp as i32),
                    )
                    .await?,
                ),
                Action::Pause => {
                    tokio::time::sleep(self.options.pause).await;
                    Observation::Done
                }
                Action::Digests { after, through } => {
                    let (a, b) = subject.digests(after, through).await?;
                    Observation::Digests(a, b)
                }
                Action::Freeze { epoch } => {
                    // The source's seal waits until it has seen the freeze.
                    let epoch = self.commit(key, epoch, Transition::Freeze(true)).await?;
                    frozen_at = Instant::now();
                    Observation::Epoch(epoch)
                }
                Action::Seal { epoch, copied } => {
                    let (final_position, copied) = subject.seal(epoch, copied).await?;
                    Observation::Sealed {
                        final_position,
                        copied,
                    }
                }
                Action::Reached(point) => {
                    self.stop_at(point)?;
                    Observation::Done
                }
                Action::Abort { epoch, error } => {
                    self.transition(key, epoch, Transition::Cancel(true))
                        .await
                        .ok();
                    return Err(error.into());
                }
                Action::Switch {
                    epoch,
                    final_position,
                } => {
                    let floor = subject.switch_floor(final_position);
                    self.flush_marks(to).await?;
                    let switch_epoch = self.commit_switch(key, epoch, floor, to).await?;
                    self.follow(switch_epoch).await;
                    Observation::Epoch(switch_epoch)
                }
                Action::Finished(outcome) => {
                    return Ok(Moved {
                        final_position: outcome.final_position,
                        verified: outcome.verified,
                        frozen_for: frozen_at.elapsed(),
                        switch_epoch: outcome.switch_epoch,
                    });
                }
            };
        }
    }
}
