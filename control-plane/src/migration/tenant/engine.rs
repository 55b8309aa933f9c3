//! The tenant move's protocol as a pure state machine, as
//! [`super::super::engine`] is for one key: given what the last action
//! observed, it decides the next — move the overrides, copy rounds, hold
//! while paused, announce catch-up, verify (and copy again what differs),
//! freeze, seal, copy the final delta, verify under the freeze, cancel or
//! switch — and names the phase each action belongs to and the freeze step
//! each one ends. It does no IO and reads no clock; `migrate_tenant`
//! executes its actions, and the tests here drive it through every
//! transition.

use super::super::StopPoint;

/// How many times the copied items are verified (and what differs copied
/// again) before the freeze; what still differs is verified under the
/// freeze, item by item.
pub(super) const VERIFY_ATTEMPTS: u32 = 3;

/// Copy rounds of the final delta at most (a batch may be answered only in
/// part); the final verification finds what is still missing.
pub(super) const DELTA_ROUNDS: u32 = 10;

/// A tenant move's phase, as progress reports name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TenantPhase {
    Overrides,
    Copy,
    CatchUp,
    Verify,
    Freeze,
    Switched,
}

impl TenantPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            TenantPhase::Overrides => "overrides",
            TenantPhase::Copy => "copy",
            TenantPhase::CatchUp => "catch-up",
            TenantPhase::Verify => "verify",
            TenantPhase::Freeze => "freeze",
            TenantPhase::Switched => "switched",
        }
    }
}

/// How many copy rounds a [`Action::CatchUp`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rounds {
    /// One round (or none more once the tenant is close enough).
    One,
    /// Rounds until the tenant is close enough, at most the options' cap.
    UntilClose,
}

/// Where the move was when this run took it up.
#[derive(Debug, Clone, Copy)]
pub(super) struct TenantResume {
    /// The tenant entry's epoch to go on from.
    pub epoch: u64,
    /// This run began the move (its first route write).
    pub began: bool,
    /// Frozen already: straight to the seal.
    pub frozen: bool,
    /// The entry said Active or Migrating/Copy: once the first round is
    /// copied, the entry is moved to CatchUp.
    pub announce_catch_up: bool,
}

/// Source and target disagree under the freeze (counts and checksums of
/// the first item that differs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Mismatch {
    pub source_count: u64,
    pub source_sum: u64,
    pub target_count: u64,
    pub target_sum: u64,
}

/// What the executor does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    /// A drill's stop point was passed; observe [`Observation::Done`].
    Reached(StopPoint),
    /// Move the tenant's keys with a route of their own, one by one.
    MoveOverrides,
    /// Wait while an operator holds the move (`epoch` 0: the entry's
    /// current one); observe [`Observation::Held`].
    HoldIfPaused { epoch: u64 },
    /// Copy rounds; observe [`Observation::Done`].
    CatchUp(Rounds),
    /// Record the CatchUp phase at `epoch`; observe [`Observation::Epoch`].
    SetCatchUp { epoch: u64 },
    /// Compare the digests of every copied item; observe
    /// [`Observation::Disagree`].
    Verify,
    /// Copy again what differs; observe [`Observation::Done`].
    CopyAgain,
    /// Freeze the tenant's entry at `epoch`; observe [`Observation::Epoch`].
    Freeze { epoch: u64 },
    /// Resumed under the freeze: learn what the target holds; observe
    /// [`Observation::Done`].
    Reload,
    /// Wait until the route cache has applied `epoch`; observe
    /// [`Observation::Done`].
    Follow { epoch: u64 },
    /// Seal the source's tenant at `epoch`; observe [`Observation::Done`].
    Seal { epoch: u64 },
    /// One copy round of what changed before the seal; observe
    /// [`Observation::Lag`].
    DeltaRound,
    /// Verify the items copied under the freeze and flush the target's
    /// marks to its standbys; observe [`Observation::Verified`].
    VerifyAndFlush,
    /// Cancel the move at `epoch`, then fail with the mismatch.
    Cancel { epoch: u64, mismatch: Mismatch },
    /// Point the tenant's entry at the target; observe
    /// [`Observation::Epoch`].
    Switch { epoch: u64 },
    /// The move is switched at `switch_epoch`.
    Finished { switch_epoch: u64 },
}

/// What the last action found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Observation {
    /// The action completed with nothing to report.
    Done,
    /// Not (or no longer) paused: the entry's epoch, and whether it is
    /// still in the Copy phase.
    Held { epoch: u64, copying: bool },
    /// The route write committed at this epoch.
    Epoch(u64),
    /// Copied items whose digests differ.
    Disagree(u64),
    /// What the target is still behind after a round.
    Lag(u64),
    /// The final verification: the first item that differs, if any.
    Verified(Option<Mismatch>),
}

/// The next action, the phase it begins (when it begins one) and the
/// freeze step the last action ended (when it ended one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Next {
    pub action: Action,
    pub phase: Option<TenantPhase>,
    pub step_done: Option<&'static str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Start,
    Planned,
    Overrides,
    FirstHold,
    FirstRound,
    SecondHold,
    Announcing,
    Copied,
    CatchingUp,
    Verifying { attempt: u32 },
    CopyingAgain { attempt: u32 },
    LastRound,
    FreezeHold,
    Freezing,
    Frozen,
    Reloading,
    Following,
    Sealing,
    Delta { rounds: u32 },
    Sealed,
    FinalVerify,
    Cancelling,
    Switching,
    Finished,
}

/// One tenant move, step by step.
pub(super) struct TenantEngine {
    resume: TenantResume,
    stage: Stage,
    epoch: u64,
}

impl TenantEngine {
    pub fn new(resume: TenantResume) -> Self {
        Self {
            resume,
            stage: Stage::Start,
            epoch: resume.epoch,
        }
    }

    /// The next action after `seen` (the first call observes
    /// [`Observation::Done`]). An observation the current stage does not
    /// expect is a bug in the executor.
    pub fn step(&mut self, seen: Observation) -> Next {
        let (stage, action, phase, step_done) = match self.stage {
            Stage::Start
            | Stage::Planned
            | Stage::Overrides
            | Stage::FirstHold
            | Stage::FirstRound
            | Stage::SecondHold
            | Stage::Announcing
            | Stage::Copied
            | Stage::CatchingUp => self.before_verify(seen),
            Stage::Verifying { .. }
            | Stage::CopyingAgain { .. }
            | Stage::LastRound
            | Stage::FreezeHold
            | Stage::Freezing
            | Stage::Frozen
            | Stage::Reloading => self.up_to_the_freeze(seen),
            _ => self.under_the_freeze(seen),
        };
        self.stage = stage;
        Next {
            action,
            phase,
            step_done,
        }
    }

    /// Start, the overrides, the first round and catch-up.
    fn before_verify(&mut self, seen: Observation) -> Transition {
        match (self.stage, seen) {
            (Stage::Start, Observation::Done) if self.resume.began => (
                Stage::Planned,
                Action::Reached(StopPoint::Planned),
                None,
                None,
            ),
            (Stage::Start | Stage::Planned, Observation::Done) => overrides(),
            (Stage::Overrides, Observation::Done) if self.resume.frozen => {
                (Stage::Reloading, Action::Reload, None, None)
            }
            (Stage::Overrides, Observation::Done) => {
                let hold = Action::HoldIfPaused { epoch: self.epoch };
                (Stage::FirstHold, hold, None, None)
            }
            (Stage::FirstHold, Observation::Held { .. }) => {
                let copy = Action::CatchUp(Rounds::One);
                (Stage::FirstRound, copy, Some(TenantPhase::Copy), None)
            }
            (Stage::FirstRound, Observation::Done) => {
                // A pause and resume meanwhile moved the entry on.
                let hold = Action::HoldIfPaused { epoch: 0 };
                (Stage::SecondHold, hold, None, None)
            }
            (Stage::SecondHold, Observation::Held { epoch, copying }) => {
                self.epoch = epoch;
                if self.resume.announce_catch_up && copying {
                    (Stage::Announcing, Action::SetCatchUp { epoch }, None, None)
                } else {
                    copied()
                }
            }
            (Stage::Announcing, Observation::Epoch(epoch)) => {
                self.epoch = epoch;
                copied()
            }
            (Stage::Copied, Observation::Done) => {
                let rounds = Action::CatchUp(Rounds::UntilClose);
                (Stage::CatchingUp, rounds, Some(TenantPhase::CatchUp), None)
            }
            (Stage::CatchingUp, Observation::Done) => {
                let verify = Stage::Verifying { attempt: 0 };
                (verify, Action::Verify, Some(TenantPhase::Verify), None)
            }
            (stage, seen) => unexpected(stage, seen),
        }
    }

    /// Verification while writes flow, the last round and the freeze (or,
    /// resumed under it, what the target holds).
    fn up_to_the_freeze(&mut self, seen: Observation) -> Transition {
        match (self.stage, seen) {
            (Stage::Verifying { attempt }, Observation::Disagree(n))
                if n > 0 && attempt + 1 < VERIFY_ATTEMPTS =>
            {
                (
                    Stage::CopyingAgain { attempt },
                    Action::CopyAgain,
                    None,
                    None,
                )
            }
            // Agreed, or verified again under the freeze item by item.
            (Stage::Verifying { .. }, Observation::Disagree(_)) => {
                // What was written while the digests were compared is
                // copied now, not under the freeze.
                (Stage::LastRound, Action::CatchUp(Rounds::One), None, None)
            }
            (Stage::CopyingAgain { attempt }, Observation::Done) => {
                let verify = Stage::Verifying {
                    attempt: attempt + 1,
                };
                (verify, Action::Verify, None, None)
            }
            (Stage::LastRound, Observation::Done) => {
                let hold = Action::HoldIfPaused { epoch: self.epoch };
                (Stage::FreezeHold, hold, None, None)
            }
            (Stage::FreezeHold, Observation::Held { epoch, .. }) => {
                self.epoch = epoch;
                (Stage::Freezing, Action::Freeze { epoch }, None, None)
            }
            (Stage::Freezing, Observation::Epoch(epoch)) => {
                self.epoch = epoch;
                let stop = Action::Reached(StopPoint::Frozen);
                (Stage::Frozen, stop, None, None)
            }
            (Stage::Frozen | Stage::Reloading, Observation::Done) => {
                let follow = Action::Follow { epoch: self.epoch };
                (Stage::Following, follow, Some(TenantPhase::Freeze), None)
            }
            (stage, seen) => unexpected(stage, seen),
        }
    }

    /// The seal, the final delta, its verification, and the switch.
    fn under_the_freeze(&mut self, seen: Observation) -> Transition {
        let epoch = self.epoch;
        match (self.stage, seen) {
            (Stage::Following, Observation::Done) => {
                // The seal waits until the source has seen the freeze.
                let seal = Action::Seal { epoch };
                (Stage::Sealing, seal, None, Some("follow the freeze"))
            }
            (Stage::Sealing, Observation::Done) => {
                let delta = Stage::Delta { rounds: 1 };
                (delta, Action::DeltaRound, None, Some("seal the source"))
            }
            (Stage::Delta { rounds }, Observation::Lag(lag))
                if lag > 0 && rounds < DELTA_ROUNDS =>
            {
                let delta = Stage::Delta { rounds: rounds + 1 };
                (delta, Action::DeltaRound, None, None)
            }
            (Stage::Delta { .. }, Observation::Lag(_)) => {
                let stop = Action::Reached(StopPoint::Sealed);
                (Stage::Sealed, stop, None, Some("copy the final delta"))
            }
            // The target's marks reach its standbys while the copy is
            // verified: both are needed before the switch.
            (Stage::Sealed, Observation::Done) => {
                (Stage::FinalVerify, Action::VerifyAndFlush, None, None)
            }
            (Stage::FinalVerify, Observation::Verified(Some(mismatch))) => {
                let cancel = Action::Cancel { epoch, mismatch };
                (Stage::Cancelling, cancel, None, None)
            }
            (Stage::FinalVerify, Observation::Verified(None)) => {
                let switch = Action::Switch { epoch };
                (
                    Stage::Switching,
                    switch,
                    None,
                    Some("verify and flush marks"),
                )
            }
            (Stage::Switching, Observation::Epoch(switch_epoch)) => {
                let done = Action::Finished { switch_epoch };
                (
                    Stage::Finished,
                    done,
                    Some(TenantPhase::Switched),
                    Some("switch"),
                )
            }
            (stage, seen) => unexpected(stage, seen),
        }
    }
}

/// The next stage, its action, the phase it begins and the step it ends.
type Transition = (Stage, Action, Option<TenantPhase>, Option<&'static str>);

fn overrides() -> Transition {
    let phase = Some(TenantPhase::Overrides);
    (Stage::Overrides, Action::MoveOverrides, phase, None)
}

fn copied() -> Transition {
    (
        Stage::Copied,
        Action::Reached(StopPoint::Copied),
        None,
        None,
    )
}

fn unexpected(stage: Stage, seen: Observation) -> Transition {
    panic!("the tenant move at {stage:?} cannot take {seen:?}")
}

#[cfg(test)]
mod tests;
