use super::*;

fn fresh() -> TenantResume {
    TenantResume {
        epoch: 5,
        began: true,
        frozen: false,
        announce_catch_up: true,
    }
}

/// Feeds `seen` and checks each next action; returns every `Next`.
fn drive(engine: &mut TenantEngine, script: &[(Observation, Action)]) -> Vec<Next> {
    let mut out = Vec::new();
    for (at, (seen, expected)) in script.iter().enumerate() {
        let next = engine.step(*seen);
        assert_eq!(next.action, *expected, "step {at} after {seen:?}");
        out.push(next);
    }
    out
}

/// From the start through the first catch-up, the entry announced at 6.
fn to_verify() -> Vec<(Observation, Action)> {
    use Observation::*;
    vec![
        (Done, Action::Reached(StopPoint::Planned)),
        (Done, Action::MoveOverrides),
        (Done, Action::HoldIfPaused { epoch: 5 }),
        (
            Held {
                epoch: 5,
                copying: true,
            },
            Action::CatchUp(Rounds::One),
        ),
        (Done, Action::HoldIfPaused { epoch: 0 }),
        (
            Held {
                epoch: 5,
                copying: true,
            },
            Action::SetCatchUp { epoch: 5 },
        ),
        (Epoch(6), Action::Reached(StopPoint::Copied)),
        (Done, Action::CatchUp(Rounds::UntilClose)),
        (Done, Action::Verify),
    ]
}

/// From an agreeing verification through the freeze at 7 and the seal.
fn to_delta() -> Vec<(Observation, Action)> {
    use Observation::*;
    vec![
        (Disagree(0), Action::CatchUp(Rounds::One)),
        (Done, Action::HoldIfPaused { epoch: 6 }),
        (
            Held {
                epoch: 6,
                copying: false,
            },
            Action::Freeze { epoch: 6 },
        ),
        (Epoch(7), Action::Reached(StopPoint::Frozen)),
        (Done, Action::Follow { epoch: 7 }),
        (Done, Action::Seal { epoch: 7 }),
        (Done, Action::DeltaRound),
    ]
}

#[test]
fn a_fresh_move_goes_through_every_phase_in_order_with_one_freeze_and_one_switch() {
    use Observation::*;
    let mut engine = TenantEngine::new(fresh());
    let mut script = to_verify();
    script.extend(to_delta());
    script.extend([
        (Lag(0), Action::Reached(StopPoint::Sealed)),
        (Done, Action::VerifyAndFlush),
        (Verified(None), Action::Switch { epoch: 7 }),
        (Epoch(8), Action::Finished { switch_epoch: 8 }),
    ]);
    let steps = drive(&mut engine, &script);
    let phases: Vec<_> = steps.iter().filter_map(|n| n.phase).collect();
    assert_eq!(
        phases,
        [
            TenantPhase::Overrides,
            TenantPhase::Copy,
            TenantPhase::CatchUp,
            TenantPhase::Verify,
            TenantPhase::Freeze,
            TenantPhase::Switched
        ]
    );
    let freeze_steps: Vec<_> = steps.iter().filter_map(|n| n.step_done).collect();
    assert_eq!(
        freeze_steps,
        [
            "follow the freeze",
            "seal the source",
            "copy the final delta",
            "verify and flush marks",
            "switch"
        ]
    );
    let writes = script
        .iter()
        .filter(|(_, a)| {
            matches!(
                a,
                Action::SetCatchUp { .. } | Action::Freeze { .. } | Action::Switch { .. }
            )
        })
        .count();
    assert_eq!(writes, 3, "catch-up, freeze and switch: one write each");
}

#[test]
fn a_resumed_move_passes_no_planned_stop_and_announces_catch_up_only_from_copy() {
    use Observation::*;
    let mut engine = TenantEngine::new(TenantResume {
        began: false,
        announce_catch_up: false,
        ..fresh()
    });
    drive(
        &mut engine,
        &[
            (Done, Action::MoveOverrides),
            (Done, Action::HoldIfPaused { epoch: 5 }),
            (
                Held {
                    epoch: 5,
                    copying: false,
                },
                Action::CatchUp(Rounds::One),
            ),
            (Done, Action::HoldIfPaused { epoch: 0 }),
            // Resumed past the announcement: no second write.
            (
                Held {
                    epoch: 9,
                    copying: true,
                },
                Action::Reached(StopPoint::Copied),
            ),
            (Done, Action::CatchUp(Rounds::UntilClose)),
            (Done, Action::Verify),
            (Disagree(0), Action::CatchUp(Rounds::One)),
            (Done, Action::HoldIfPaused { epoch: 9 }),
        ],
    );
}

#[test]
fn an_entry_paused_back_to_copy_is_not_announced_again() {
    use Observation::*;
    let mut engine = TenantEngine::new(fresh());
    let mut script = to_verify();
    // The second hold finds the entry no longer in Copy.
    script[5] = (
        Held {
            epoch: 5,
            copying: false,
        },
        Action::Reached(StopPoint::Copied),
    );
    script.remove(6);
    drive(&mut engine, &script);
}

#[test]
fn a_move_resumed_under_the_freeze_reloads_and_goes_to_the_seal() {
    use Observation::*;
    let mut engine = TenantEngine::new(TenantResume {
        epoch: 12,
        began: false,
        frozen: true,
        announce_catch_up: false,
    });
    let steps = drive(
        &mut engine,
        &[
            (Done, Action::MoveOverrides),
            (Done, Action::Reload),
            (Done, Action::Follow { epoch: 12 }),
            (Done, Action::Seal { epoch: 12 }),
        ],
    );
    assert_eq!(steps[2].phase, Some(TenantPhase::Freeze));
}

#[test]
fn items_that_differ_are_copied_again_at_most_twice_then_the_freeze_verifies_them() {
    use Observation::*;
    let mut engine = TenantEngine::new(fresh());
    drive(&mut engine, &to_verify());
    let mut script = Vec::new();
    for _ in 1..VERIFY_ATTEMPTS {
        script.push((Disagree(3), Action::CopyAgain));
        script.push((Done, Action::Verify));
    }
    // Still differing after the last attempt: on to the freeze.
    script.push((Disagree(1), Action::CatchUp(Rounds::One)));
    drive(&mut engine, &script);
}

#[test]
fn the_final_delta_is_copied_until_nothing_is_behind_or_the_rounds_run_out() {
    use Observation::*;
    let mut engine = TenantEngine::new(fresh());
    drive(&mut engine, &to_verify());
    drive(&mut engine, &to_delta());
    drive(
        &mut engine,
        &[
            (Lag(5), Action::DeltaRound),
            (Lag(0), Action::Reached(StopPoint::Sealed)),
        ],
    );
    let mut engine = TenantEngine::new(fresh());
    drive(&mut engine, &to_verify());
    drive(&mut engine, &to_delta());
    let mut script: Vec<_> = (2..DELTA_ROUNDS)
        .map(|_| (Lag(1), Action::DeltaRound))
        .collect();
    script.push((Lag(1), Action::DeltaRound));
    script.push((Lag(1), Action::Reached(StopPoint::Sealed)));
    drive(&mut engine, &script);
}

#[test]
fn a_copy_that_differs_under_the_freeze_cancels_the_move_at_the_freezes_epoch() {
    use Observation::*;
    let mut engine = TenantEngine::new(fresh());
    drive(&mut engine, &to_verify());
    drive(&mut engine, &to_delta());
    let mismatch = Mismatch {
        source_count: 10,
        source_sum: 1,
        target_count: 9,
        target_sum: 2,
    };
    drive(
        &mut engine,
        &[
            (Lag(0), Action::Reached(StopPoint::Sealed)),
            (Done, Action::VerifyAndFlush),
            (
                Verified(Some(mismatch)),
                Action::Cancel { epoch: 7, mismatch },
            ),
        ],
    );
}

#[test]
#[should_panic(expected = "cannot take")]
fn an_observation_out_of_turn_is_a_bug_in_the_executor() {
    let mut engine = TenantEngine::new(fresh());
    engine.step(Observation::Done);
    engine.step(Observation::Lag(3));
}
