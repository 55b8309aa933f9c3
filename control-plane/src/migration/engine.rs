//! The move protocol as a pure state machine: given what the last action
//! observed, it decides the next action — copy, report a phase, hold while
//! paused, digest, freeze, seal, cancel, switch — and keeps the move's
//! position (epoch, copied through, the source's final position, the
//! verification carried across the freeze). It does no IO and reads no
//! clock; `protocol` executes its actions against the route table and the
//! cells, and the tests here drive it through every phase.

use cellmesh_proto::v1::{CopyResponse, DigestResponse};

use super::{MigrationError, Progress, StopPoint};

/// The knobs the engine decides with.
#[derive(Debug, Clone, Copy)]
pub(super) struct EngineOptions {
    /// Catch-up ends once the source is at most this far ahead.
    pub catch_up_lag: u64,
    /// Unthrottled catch-up rounds before freezing anyway.
    pub max_catch_up_rounds: u32,
    /// A round that copied this many messages was throttled (0: none is).
    pub round_messages: u32,
    /// The target's latest position must equal the source's at the end.
    pub exact_latest: bool,
}

/// Where the move was when this run took it up.
#[derive(Debug, Clone, Copy)]
pub(super) struct Resume {
    /// The key's epoch to go on from.
    pub epoch: u64,
    /// Frozen already: straight to the seal.
    pub frozen: bool,
    /// The route still says Active or Migrating/Copy: the first round moves
    /// it to CatchUp.
    pub announce_catch_up: bool,
}

/// What the executor does next.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Action {
    /// Wait while an operator holds the move; observe [`Observation::Held`].
    HoldIfPaused { epoch: u64, copied: u64 },
    /// Have the target copy what the source holds after `after`.
    Copy { after: u64 },
    /// Record the CatchUp phase at `epoch`; observe [`Observation::Epoch`].
    SetCatchUp { epoch: u64 },
    /// Sleep the round pause; observe [`Observation::Done`].
    Pause,
    /// Digest `(after, through]` on both ends.
    Digests { after: u64, through: u64 },
    /// Freeze the route at `epoch`; observe [`Observation::Epoch`].
    Freeze { epoch: u64 },
    /// Seal the source at `epoch` with the target holding `copied`.
    Seal { epoch: u64, copied: u64 },
    /// A drill's stop point was passed; observe [`Observation::Done`].
    Reached(StopPoint),
    /// Cancel the move at `epoch`, then fail with `error`.
    Abort { epoch: u64, error: MismatchError },
    /// Switch the route at `epoch` to the target (the floor from the source's
    /// `final_position`); observe [`Observation::Epoch`].
    Switch { epoch: u64, final_position: u64 },
    /// The move is done.
    Finished(Outcome),
}

/// Source and target disagree after the seal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MismatchError {
    pub source_count: u64,
    pub source_sum: u64,
    pub target_count: u64,
    pub target_sum: u64,
}

impl From<MismatchError> for MigrationError {
    fn from(e: MismatchError) -> Self {
        MigrationError::Mismatch {
            source_count: e.source_count,
            source_sum: e.source_sum,
            target_count: e.target_count,
            target_sum: e.target_sum,
        }
    }
}

/// A finished move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Outcome {
    pub final_position: u64,
    pub verified: u64,
    pub switch_epoch: u64,
}

/// What the last action found.
#[derive(Debug, Clone)]
pub(super) enum Observation {
    /// Where copying starts: what the target holds already.
    Start {
        copied: u64,
    },
    /// The move is not (or no longer) paused; the key's epoch now.
    Held {
        epoch: u64,
    },
    Copied(CopyResponse),
    /// The route write committed at this epoch.
    Epoch(u64),
    Digests(DigestResponse, DigestResponse),
    /// The source's final position, and how far the target holds it.
    Sealed {
        final_position: u64,
        copied: u64,
    },
    /// The action completed with nothing to report.
    Done,
}

#[derive(Debug, Clone, Copy)]
enum Stage {
    Starting,
    /// Copy rounds before the freeze.
    Round,
    AnnouncingCatchUp {
        last: RoundFacts,
    },
    Pausing,
    PreDigest,
    HoldingBeforeFreeze,
    Freezing,
    Sealing,
    FinalDelta,
    AtSealed,
    DeltaDigest {
        before: DigestResponse,
    },
    FullDigest,
    Switching {
        verified: u64,
    },
    Finished,
}

#[derive(Debug, Clone, Copy)]
struct RoundFacts {
    source_latest: u64,
    throttled: bool,
}

/// One move, step by step.
pub(super) struct MoveEngine {
    options: EngineOptions,
    resume: Resume,
    stage: Stage,
    epoch: u64,
    copied: u64,
    round: u32,
    catch_up_rounds: u32,
    phase: &'static str,
    /// Copied through, the source digest there, and whether both ends agreed.
    pre: Option<(u64, DigestResponse, bool)>,
    final_position: u64,
}

impl MoveEngine {
    pub fn new(options: EngineOptions, resume: Resume) -> Self {
        Self {
            options,
            resume,
            stage: Stage::Starting,
            epoch: resume.epoch,
            copied: 0,
            round: 0,
            catch_up_rounds: 0,
            phase: "copy",
            pre: None,
            final_position: 0,
        }
    }

    /// The next action after `seen`, with a progress report when the move
    /// got further. An observation the current stage does not expect is a
    /// bug in the executor.
    pub fn step(&mut self, seen: Observation) -> (Option<Progress>, Action) {
        match self.stage {
            Stage::Starting
            | Stage::Round
            | Stage::HoldingBeforeFreeze
            | Stage::AnnouncingCatchUp { .. }
            | Stage::Pausing
            | Stage::PreDigest => self.step_copying(seen),
            _ => self.step_frozen(seen),
        }
    }

    /// Steps while writes flow: start, copy rounds, catch-up, the digest
    /// before the freeze.
    fn step_copying(&mut self, seen: Observation) -> (Option<Progress>, Action) {
        match (self.stage, seen) {
            (Stage::Starting, Observation::Start { copied }) => {
                self.copied = copied;
                if self.resume.frozen {
                    return (None, self.seal());
                }
                self.stage = Stage::Round;
                (None, self.hold())
            }
            (Stage::Round | Stage::HoldingBeforeFreeze, Observation::Held { epoch }) => {
                self.epoch = epoch;
                match self.stage {
                    Stage::Round => (None, Action::Copy { after: self.copied }),
                    _ => {
                        self.stage = Stage::Freezing;
                        (None, Action::Freeze { epoch })
                    }
                }
            }
            (Stage::Round, Observation::Copied(r)) => {
                let facts = RoundFacts {
                    source_latest: r.source_latest_seq,
                    throttled: self.options.round_messages > 0
                        && r.messages >= u64::from(self.options.round_messages),
                };
                self.copied = self.copied.max(r.copied_through);
                let progress = self.progress(self.phase, facts.source_latest);
                if self.round == 0 && self.resume.announce_catch_up {
                    self.stage = Stage::AnnouncingCatchUp { last: facts };
                    return (Some(progress), Action::SetCatchUp { epoch: self.epoch });
                }
                (Some(progress), self.after_round(facts))
            }
            (Stage::AnnouncingCatchUp { last }, Observation::Epoch(epoch)) => {
                self.epoch = epoch;
                self.phase = "catch-up";
                // The drills' stop point comes before the round's verdict.
                self.stage = Stage::AnnouncingCatchUp { last };
                (None, Action::Reached(StopPoint::Copied))
            }
            (Stage::AnnouncingCatchUp { last }, Observation::Done) => {
                self.stage = Stage::Round;
                (None, self.after_round(last))
            }
            (Stage::Pausing, Observation::Done) => {
                self.round += 1;
                self.stage = Stage::Round;
                (None, self.hold())
            }
            (Stage::PreDigest, Observation::Digests(a, b)) => {
                let agree = (a.count, a.checksum) == (b.count, b.checksum);
                self.pre = Some((self.copied, a, agree));
                self.stage = Stage::HoldingBeforeFreeze;
                (None, self.hold())
            }
            (stage, seen) => panic!("move engine: {seen:?} while {stage:?}"),
        }
    }

    /// Steps from the freeze on: seal, final delta, verify, switch.
    fn step_frozen(&mut self, seen: Observation) -> (Option<Progress>, Action) {
        match (self.stage, seen) {
            (Stage::Freezing, Observation::Epoch(epoch)) => {
                self.epoch = epoch;
                self.stage = Stage::Sealing;
                (None, Action::Reached(StopPoint::Frozen))
            }
            (Stage::Sealing, Observation::Done) => (None, self.seal()),
            (
                Stage::Sealing,
                Observation::Sealed {
                    final_position,
                    copied,
                },
            ) => {
                self.final_position = final_position;
                self.copied = self.copied.max(copied);
                self.stage = Stage::FinalDelta;
                (None, self.next_delta())
            }
            (Stage::FinalDelta, Observation::Copied(r)) => {
                if r.copied_through <= self.copied {
                    self.stage = Stage::AtSealed;
                    return (None, Action::Reached(StopPoint::Sealed));
                }
                self.copied = r.copied_through;
                (None, self.next_delta())
            }
            (Stage::AtSealed, Observation::Done) => {
                let progress = self.progress("verify", self.final_position);
                let action = match self.pre {
                    Some((through, before, true)) => {
                        self.stage = Stage::DeltaDigest { before };
                        Action::Digests {
                            after: through,
                            through: self.final_position,
                        }
                    }
                    _ => self.full_digest(),
                };
                (Some(progress), action)
            }
            (Stage::DeltaDigest { before }, Observation::Digests(a, b)) => {
                if a.rewrites != before.rewrites {
                    // Older entries were rewritten meanwhile: compare it all.
                    return (None, self.full_digest());
                }
                let sum = |x: &DigestResponse| DigestResponse {
                    count: before.count + x.count,
                    checksum: before.checksum.wrapping_add(x.checksum),
                    ..*x
                };
                (None, self.verdict(sum(&a), sum(&b)))
            }
            (Stage::FullDigest, Observation::Digests(a, b)) => (None, self.verdict(a, b)),
            (Stage::Switching { verified }, Observation::Epoch(switch_epoch)) => {
                self.epoch = switch_epoch;
                self.stage = Stage::Finished;
                (
                    Some(self.progress("switched", self.final_position)),
                    Action::Finished(Outcome {
                        final_position: self.final_position,
                        verified,
                        switch_epoch,
                    }),
                )
            }
            (stage, seen) => panic!("move engine: {seen:?} while {stage:?}"),
        }
    }

    fn hold(&self) -> Action {
        Action::HoldIfPaused {
            epoch: self.epoch,
            copied: self.copied,
        }
    }

    fn seal(&mut self) -> Action {
        self.stage = Stage::Sealing;
        Action::Seal {
            epoch: self.epoch,
            copied: self.copied,
        }
    }

    fn progress(&self, phase: &'static str, source_latest: u64) -> Progress {
        Progress {
            phase,
            copied_through: self.copied,
            source_latest,
        }
    }

    /// After a copy round: another round, or verification and the freeze.
    fn after_round(&mut self, facts: RoundFacts) -> Action {
        let close = facts.source_latest.saturating_sub(self.copied) <= self.options.catch_up_lag;
        if !close && !facts.throttled {
            self.catch_up_rounds += 1;
        }
        if close || self.catch_up_rounds > self.options.max_catch_up_rounds {
            // Verify what is copied while writes still flow; under the
            // freeze only the final delta is compared then.
            self.stage = Stage::PreDigest;
            return Action::Digests {
                after: 0,
                through: self.copied,
            };
        }
        self.stage = Stage::Pausing;
        Action::Pause
    }

    fn next_delta(&mut self) -> Action {
        if self.copied < self.final_position {
            Action::Copy { after: self.copied }
        } else {
            self.stage = Stage::AtSealed;
            Action::Reached(StopPoint::Sealed)
        }
    }

    fn full_digest(&mut self) -> Action {
        self.stage = Stage::FullDigest;
        Action::Digests {
            after: 0,
            through: self.final_position,
        }
    }

    fn verdict(&mut self, a: DigestResponse, b: DigestResponse) -> Action {
        if (a.count, a.checksum) != (b.count, b.checksum)
            || (self.options.exact_latest && b.latest_seq != self.final_position)
        {
            self.stage = Stage::Finished;
            return Action::Abort {
                epoch: self.epoch,
                error: MismatchError {
                    source_count: a.count,
                    source_sum: a.checksum,
                    target_count: b.count,
                    target_sum: b.checksum,
                },
            };
        }
        self.stage = Stage::Switching { verified: a.count };
        Action::Switch {
            epoch: self.epoch,
            final_position: self.final_position,
        }
    }
}

#[cfg(test)]
mod tests;
