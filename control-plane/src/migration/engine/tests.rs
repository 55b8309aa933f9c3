use super::*;

const OPTIONS: EngineOptions = EngineOptions {
    catch_up_lag: 10,
    max_catch_up_rounds: 3,
    round_messages: 0,
    exact_latest: false,
};

fn fresh() -> Resume {
    Resume {
        epoch: 5,
        frozen: false,
        announce_catch_up: true,
    }
}

fn copied(through: u64, source_latest: u64) -> Observation {
    Observation::Copied(CopyResponse {
        copied_through: through,
        source_latest_seq: source_latest,
        messages: through,
        ..CopyResponse::default()
    })
}

fn digest(count: u64, checksum: u64, latest: u64) -> DigestResponse {
    DigestResponse {
        count,
        checksum,
        latest_seq: latest,
        ..Default::default()
    }
}

/// Steps `engine` with `seen`, asserting the action, and returns the report.
fn expect(engine: &mut MoveEngine, seen: Observation, action: Action) -> Option<Progress> {
    let (report, got) = engine.step(seen);
    assert_eq!(got, action);
    report
}

/// Drives a fresh move to its freeze with one copy round that gets close.
fn to_freeze(engine: &mut MoveEngine) {
    expect(
        engine,
        Observation::Start { copied: 0 },
        Action::HoldIfPaused {
            epoch: 5,
            copied: 0,
        },
    );
    expect(
        engine,
        Observation::Held { epoch: 5 },
        Action::Copy { after: 0 },
    );
    let report = expect(engine, copied(95, 100), Action::SetCatchUp { epoch: 5 });
    assert_eq!(report.unwrap().phase, "copy");
    expect(
        engine,
        Observation::Epoch(6),
        Action::Reached(StopPoint::Copied),
    );
    expect(
        engine,
        Observation::Done,
        Action::Digests {
            after: 0,
            through: 95,
        },
    );
    expect(
        engine,
        Observation::Digests(digest(95, 7, 95), digest(95, 7, 95)),
        Action::HoldIfPaused {
            epoch: 6,
            copied: 95,
        },
    );
    expect(
        engine,
        Observation::Held { epoch: 6 },
        Action::Freeze { epoch: 6 },
    );
    expect(
        engine,
        Observation::Epoch(7),
        Action::Reached(StopPoint::Frozen),
    );
    expect(
        engine,
        Observation::Done,
        Action::Seal {
            epoch: 7,
            copied: 95,
        },
    );
}

#[test]
fn a_fresh_move_copies_catches_up_verifies_freezes_seals_and_switches() {
    let mut engine = MoveEngine::new(OPTIONS, fresh());
    to_freeze(&mut engine);
    // The seal brings the source's final position; the delta is copied.
    expect(
        &mut engine,
        Observation::Sealed {
            final_position: 103,
            copied: 100,
        },
        Action::Copy { after: 100 },
    );
    expect(
        &mut engine,
        copied(103, 103),
        Action::Reached(StopPoint::Sealed),
    );
    let report = expect(
        &mut engine,
        Observation::Done,
        Action::Digests {
            after: 95,
            through: 103,
        },
    );
    assert_eq!(report.unwrap().phase, "verify");
    // Only the delta is compared, added to the sums taken before the freeze.
    expect(
        &mut engine,
        Observation::Digests(digest(8, 3, 103), digest(8, 3, 103)),
        Action::Switch {
            epoch: 7,
            final_position: 103,
        },
    );
    let report = expect(
        &mut engine,
        Observation::Epoch(9),
        Action::Finished(Outcome {
            final_position: 103,
            verified: 103,
            switch_epoch: 9,
        }),
    );
    assert_eq!(report.unwrap().phase, "switched");
}

#[test]
fn a_move_resumed_under_the_freeze_goes_straight_to_the_seal() {
    let resume = Resume {
        epoch: 12,
        frozen: true,
        announce_catch_up: false,
    };
    let mut engine = MoveEngine::new(OPTIONS, resume);
    expect(
        &mut engine,
        Observation::Start { copied: 40 },
        Action::Seal {
            epoch: 12,
            copied: 40,
        },
    );
    expect(
        &mut engine,
        Observation::Sealed {
            final_position: 40,
            copied: 40,
        },
        Action::Reached(StopPoint::Sealed),
    );
    // Nothing was verified before the freeze: the whole history is.
    expect(
        &mut engine,
        Observation::Done,
        Action::Digests {
            after: 0,
            through: 40,
        },
    );
    expect(
        &mut engine,
        Observation::Digests(digest(40, 1, 40), digest(40, 1, 40)),
        Action::Switch {
            epoch: 12,
            final_position: 40,
        },
    );
}

#[test]
fn a_move_resumed_in_catch_up_does_not_announce_it_again() {
    let resume = Resume {
        announce_catch_up: false,
        ..fresh()
    };
    let mut engine = MoveEngine::new(OPTIONS, resume);
    expect(
        &mut engine,
        Observation::Start { copied: 10 },
        Action::HoldIfPaused {
            epoch: 5,
            copied: 10,
        },
    );
    expect(
        &mut engine,
        Observation::Held { epoch: 5 },
        Action::Copy { after: 10 },
    );
    expect(
        &mut engine,
        copied(50, 55),
        Action::Digests {
            after: 0,
            through: 50,
        },
    );
}

#[test]
fn catch_up_freezes_anyway_after_its_rounds_and_throttled_rounds_do_not_count() {
    let options = EngineOptions {
        round_messages: 100,
        ..OPTIONS
    };
    let resume = Resume {
        announce_catch_up: false,
        ..fresh()
    };
    let mut engine = MoveEngine::new(options, resume);
    expect(
        &mut engine,
        Observation::Start { copied: 0 },
        Action::HoldIfPaused {
            epoch: 5,
            copied: 0,
        },
    );
    let mut through = 0;
    // Throttled rounds (a full round's worth) go on without counting.
    for _ in 0..5 {
        expect(
            &mut engine,
            Observation::Held { epoch: 5 },
            Action::Copy { after: through },
        );
        through += 100;
        let (_, action) = engine.step(Observation::Copied(CopyResponse {
            copied_through: through,
            source_latest_seq: through + 1_000,
            messages: 100,
            ..CopyResponse::default()
        }));
        assert_eq!(action, Action::Pause);
        expect(
            &mut engine,
            Observation::Done,
            Action::HoldIfPaused {
                epoch: 5,
                copied: through,
            },
        );
    }
    // Unthrottled rounds that stay behind: three, then verification.
    for round in 0..4 {
        expect(
            &mut engine,
            Observation::Held { epoch: 5 },
            Action::Copy { after: through },
        );
        through += 10;
        let (_, action) = engine.step(Observation::Copied(CopyResponse {
            copied_through: through,
            source_latest_seq: through + 1_000,
            messages: 10,
            ..CopyResponse::default()
        }));
        if round < 3 {
            assert_eq!(action, Action::Pause);
            engine.step(Observation::Done);
        } else {
            assert_eq!(action, Action::Digests { after: 0, through });
        }
    }
}

#[test]
fn a_pause_moves_the_epoch_the_freeze_and_seal_use() {
    let mut engine = MoveEngine::new(OPTIONS, fresh());
    engine.step(Observation::Start { copied: 0 });
    engine.step(Observation::Held { epoch: 5 });
    engine.step(copied(100, 100));
    engine.step(Observation::Epoch(6));
    engine.step(Observation::Done);
    engine.step(Observation::Digests(
        digest(100, 1, 100),
        digest(100, 1, 100),
    ));
    // An operator paused and resumed the move meanwhile: epoch 9 now.
    expect(
        &mut engine,
        Observation::Held { epoch: 9 },
        Action::Freeze { epoch: 9 },
    );
}

#[test]
fn a_final_delta_that_stops_growing_goes_to_verification() {
    let mut engine = MoveEngine::new(OPTIONS, fresh());
    to_freeze(&mut engine);
    expect(
        &mut engine,
        Observation::Sealed {
            final_position: 120,
            copied: 95,
        },
        Action::Copy { after: 95 },
    );
    expect(&mut engine, copied(110, 120), Action::Copy { after: 110 });
    // No progress: verification will tell.
    expect(
        &mut engine,
        copied(110, 120),
        Action::Reached(StopPoint::Sealed),
    );
}

#[test]
fn a_digest_mismatch_cancels_the_move() {
    let mut engine = MoveEngine::new(OPTIONS, fresh());
    to_freeze(&mut engine);
    engine.step(Observation::Sealed {
        final_position: 95,
        copied: 95,
    });
    engine.step(Observation::Done);
    let (_, action) = engine.step(Observation::Digests(digest(0, 0, 95), digest(0, 9, 95)));
    assert_eq!(
        action,
        Action::Abort {
            epoch: 7,
            error: MismatchError {
                source_count: 95,
                source_sum: 7,
                target_count: 95,
                target_sum: 16,
            }
        }
    );
}

#[test]
fn rewrites_since_the_pre_freeze_digest_force_a_full_comparison() {
    let mut engine = MoveEngine::new(OPTIONS, fresh());
    to_freeze(&mut engine);
    engine.step(Observation::Sealed {
        final_position: 95,
        copied: 95,
    });
    engine.step(Observation::Done);
    let rewritten = DigestResponse {
        rewrites: 1,
        ..digest(0, 0, 95)
    };
    expect(
        &mut engine,
        Observation::Digests(rewritten, rewritten),
        Action::Digests {
            after: 0,
            through: 95,
        },
    );
}

#[test]
fn a_user_move_needs_the_exact_latest_position() {
    let options = EngineOptions {
        exact_latest: true,
        ..OPTIONS
    };
    let resume = Resume {
        epoch: 3,
        frozen: true,
        announce_catch_up: false,
    };
    let mut engine = MoveEngine::new(options, resume);
    engine.step(Observation::Start { copied: 20 });
    engine.step(Observation::Sealed {
        final_position: 20,
        copied: 20,
    });
    engine.step(Observation::Done);
    // Same sums, but the target's queue ends elsewhere (leftovers).
    let (_, action) = engine.step(Observation::Digests(digest(20, 4, 20), digest(20, 4, 23)));
    assert!(
        matches!(action, Action::Abort { epoch: 3, .. }),
        "{action:?}"
    );
}
