//! The phases every move goes through, whatever moves (DESIGN.md §5): copy
//! rounds until the target is close, verification of what is copied while
//! writes still flow, freeze, seal of the source, the final delta, its
//! verification, switch. A [`Subject`] supplies the cell calls for one kind
//! of key — a conversation's history, a user's sync queue.

use std::time::Instant;

use cellmesh_proto::v1::update_route::Transition;
use cellmesh_proto::v1::{CopyResponse, DigestResponse, MigrationPhase};
use cellmesh_route_client::table::{Key, Phase, RouteState};

use super::{MigrationError, Migrator, Progress, Start, StopPoint};

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
    /// `state`) through the switch.
    pub(super) async fn run_move<S: Subject>(
        &self,
        key: &Key,
        state: &RouteState,
        start: Start,
        subject: &mut S,
        to: &str,
        progress: &mut impl FnMut(&Progress),
    ) -> Result<Moved, MigrationError> {
        let (mut epoch, frozen) = (start.epoch, start.frozen);
        let mut copied = subject.resume_point(&start).await?;
        let mut frozen_at = Instant::now();
        let mut pre: Option<(u64, DigestResponse, bool)> = None;
        if !frozen {
            let mut phase = "copy";
            let mut catch_up_rounds = 0;
            for round in 0.. {
                epoch = self
                    .hold_while_paused(key, to, epoch, copied, progress)
                    .await?;
                let r = subject.copy(copied).await?;
                let throttled = self.options.round_messages > 0
                    && r.messages >= u64::from(self.options.round_messages);
                copied = r.copied_through.max(copied);
                progress(&Progress {
                    phase,
                    copied_through: copied,
                    source_latest: r.source_latest_seq,
                });
                if round == 0
                    && matches!(
                        state,
                        RouteState::Active
                            | RouteState::Migrating {
                                phase: Phase::Copy,
                                ..
                            }
                    )
                {
                    epoch = self
                        .transition(
                            key,
                            epoch,
                            Transition::SetPhase(MigrationPhase::CatchUp as i32),
                        )
                        .await?;
                    phase = "catch-up";
                    self.stop_at(StopPoint::Copied)?;
                }
                if r.source_latest_seq.saturating_sub(copied) <= self.options.catch_up_lag {
                    break;
                }
                if !throttled {
                    catch_up_rounds += 1;
                    if catch_up_rounds > self.options.max_catch_up_rounds {
                        break;
                    }
                }
                tokio::time::sleep(self.options.pause).await;
            }
            // Verify what is copied while writes still flow; under the
            // freeze only the final delta is compared then, unless older
            // entries were rewritten in between.
            let (a, b) = subject.digests(0, copied).await?;
            pre = Some((copied, a, (a.count, a.checksum) == (b.count, b.checksum)));
            epoch = self
                .hold_while_paused(key, to, epoch, copied, progress)
                .await?;
            // The source's seal waits until it has seen the freeze itself.
            epoch = self.commit(key, epoch, Transition::Freeze(true)).await?;
            frozen_at = Instant::now();
            self.stop_at(StopPoint::Frozen)?;
        }
        let (final_position, sealed_copy) = subject.seal(epoch, copied).await?;
        copied = copied.max(sealed_copy);
        while copied < final_position {
            let r = subject.copy(copied).await?;
            if r.copied_through <= copied {
                break;
            }
            copied = r.copied_through;
        }
        self.stop_at(StopPoint::Sealed)?;
        progress(&Progress {
            phase: "verify",
            copied_through: copied,
            source_latest: final_position,
        });
        let mut verified = None;
        if let Some((through, before, true)) = pre {
            let (a, b) = subject.digests(through, final_position).await?;
            if a.rewrites == before.rewrites {
                let sum = |x: &DigestResponse| DigestResponse {
                    count: before.count + x.count,
                    checksum: before.checksum.wrapping_add(x.checksum),
                    ..*x
                };
                verified = Some((sum(&a), sum(&b)));
            }
        }
        let (a, b) = match verified {
            Some(v) => v,
            None => subject.digests(0, final_position).await?,
        };
        if (a.count, a.checksum) != (b.count, b.checksum)
            || (S::EXACT_LATEST && b.latest_seq != final_position)
        {
            self.transition(key, epoch, Transition::Cancel(true))
                .await
                .ok();
            return Err(MigrationError::Mismatch {
                source_count: a.count,
                source_sum: a.checksum,
                target_count: b.count,
                target_sum: b.checksum,
            });
        }
        let floor = Transition::SwitchFloor(subject.switch_floor(final_position));
        let switch_epoch = self.commit(key, epoch, floor).await?;
        let frozen_for = frozen_at.elapsed();
        self.follow(switch_epoch).await;
        progress(&Progress {
            phase: "switched",
            copied_through: copied,
            source_latest: final_position,
        });
        Ok(Moved {
            final_position,
            verified: a.count,
            frozen_for,
            switch_epoch,
        })
    }
}
