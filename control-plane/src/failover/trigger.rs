//! When a failed cell is fenced and when it is failed over: the rule the
//! control plane's probe loop applies to each cell on every tick, as a pure
//! function beside the planner.
//!
//! A cell that owns something is fenced at its first failed probe: marked
//! Degraded in the route table, after which it renews no owner lease, so
//! one lease later it writes nothing more even if the table still answers
//! it. Its routes move once the detector calls it failed and that lease
//! has run out, and their new owner may write them at once. A cell that
//! passes a probe again before it is called failed gets its status back
//! (Up, or Draining) at once: the lease it holds outlasts a short fence,
//! so one slow probe costs two route writes and no refused send. A cell
//! under a failover hold (a planned restart, see [`super::holds`]) is
//! neither fenced nor failed over until the hold ends, unless a failover
//! of it was already written.

use std::time::Duration;

/// What the loop knows of one cell now.
#[derive(Debug, Clone, Copy)]
pub struct CellNow {
    /// Its last probe failed.
    pub failing: bool,
    /// The detector calls it failed.
    pub failed: bool,
    /// A route still places something on it.
    pub owns: bool,
    /// The route table marks it Degraded or Down.
    pub fenced: bool,
    /// The route table marks it Down (a failover was written before).
    pub marked_down: bool,
    /// How long this control plane has known it fenced.
    pub fenced_for: Option<Duration>,
    /// An operator holds its failover (a planned restart).
    pub held: bool,
}

/// What to do about one cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Wait,
    /// Mark it Degraded.
    Fence,
    /// Move what it owns (and mark it Down).
    FailOver,
}

/// The owner lease a cell announced (`announced_ms`; 0 for releases that
/// announced none, which get `assumed_ms`), plus a tenth for clock drift:
/// how long after its fence a failed cell may still write.
pub fn owner_lease(announced_ms: u64, assumed_ms: u64) -> Duration {
    let lease = if announced_ms > 0 {
        announced_ms
    } else {
        assumed_ms
    };
    Duration::from_millis(lease * 11 / 10)
}

/// What to do about `cell` now. A failing cell that owns something, or a
/// failed one, is fenced first; a failed one is failed over once its owner
/// lease has run out since the fence (counted from when this control plane
/// wrote or first saw it: a replica that takes the lead over a fenced cell
/// waits one lease more). A cell marked Down that owns nothing any more is
/// left alone.
pub fn step(cell: CellNow, owner_lease: Duration) -> Step {
    if held(cell) {
        return Step::Wait;
    }
    if !cell.fenced {
        let fence = cell.failed || (cell.failing && cell.owns);
        return if fence { Step::Fence } else { Step::Wait };
    }
    if !cell.failed {
        return Step::Wait;
    }
    if !cell.owns && cell.marked_down {
        return Step::Wait;
    }
    match due_in(cell, owner_lease) {
        Some(left) if left.is_zero() => Step::FailOver,
        _ => Step::Wait,
    }
}

/// How long until a fenced, failed cell is due for its failover (`None`:
/// it is not waiting for one).
pub fn due_in(cell: CellNow, owner_lease: Duration) -> Option<Duration> {
    if held(cell) || !cell.failed || !cell.fenced || (!cell.owns && cell.marked_down) {
        return None;
    }
    cell.fenced_for.map(|d| owner_lease.saturating_sub(d))
}

/// Whether a hold keeps `cell` as it is: one marked Down is failed over
/// whatever holds it (its routes may already be half moved).
fn held(cell: CellNow) -> bool {
    cell.held && !cell.marked_down
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(2);

    fn fenced(fenced_for: u64) -> CellNow {
        CellNow {
            failing: true,
            failed: true,
            owns: true,
            fenced: true,
            marked_down: false,
            fenced_for: Some(Duration::from_millis(fenced_for)),
            held: false,
        }
    }

    #[test]
    fn a_failing_cell_is_fenced_first_and_failed_over_a_lease_after_the_fence() {
        let unfenced = CellNow {
            failed: false,
            fenced: false,
            fenced_for: None,
            ..fenced(0)
        };
        assert_eq!(
            step(unfenced, LEASE),
            Step::Fence,
            "at its first failed probe"
        );
        let idle = CellNow {
            owns: false,
            ..unfenced
        };
        assert_eq!(step(idle, LEASE), Step::Wait, "nothing to fence yet");
        let idle_failed = CellNow {
            failed: true,
            ..idle
        };
        assert_eq!(step(idle_failed, LEASE), Step::Fence, "to be marked down");
        let passing = CellNow {
            failing: false,
            ..unfenced
        };
        assert_eq!(step(passing, LEASE), Step::Wait);
        let not_yet_failed = CellNow {
            failed: false,
            ..fenced(5_000)
        };
        assert_eq!(
            step(not_yet_failed, LEASE),
            Step::Wait,
            "fenced, not failed"
        );
        assert_eq!(step(fenced(1_999), LEASE), Step::Wait);
        assert_eq!(
            due_in(fenced(1_500), LEASE),
            Some(Duration::from_millis(500))
        );
        assert_eq!(step(fenced(2_000), LEASE), Step::FailOver);
    }

    #[test]
    fn the_wait_is_the_lease_the_cell_announced_else_the_assumed_one() {
        assert_eq!(owner_lease(1_500, 2_000), Duration::from_millis(1_650));
        assert_eq!(owner_lease(5_000, 2_000), Duration::from_millis(5_500));
        assert_eq!(owner_lease(0, 2_000), Duration::from_millis(2_200));
    }

    #[test]
    fn a_cell_the_detector_does_not_call_failed_is_left_alone() {
        let c = CellNow {
            failed: false,
            ..fenced(60_000)
        };
        assert_eq!(step(c, LEASE), Step::Wait);
        assert_eq!(due_in(c, LEASE), None);
    }

    #[test]
    fn a_marked_cell_is_failed_over_again_while_it_owns_something() {
        let marked = CellNow {
            marked_down: true,
            ..fenced(5_000)
        };
        assert_eq!(step(marked, LEASE), Step::FailOver);
        let empty = CellNow {
            owns: false,
            ..marked
        };
        assert_eq!(step(empty, LEASE), Step::Wait, "nothing left to move");
        let degraded_empty = CellNow {
            owns: false,
            ..fenced(5_000)
        };
        assert_eq!(
            step(degraded_empty, LEASE),
            Step::FailOver,
            "it is still to be marked down"
        );
    }

    #[test]
    fn a_held_cell_is_neither_fenced_nor_failed_over_unless_already_marked_down() {
        let held = |c: CellNow| CellNow { held: true, ..c };
        let unfenced = CellNow {
            fenced: false,
            fenced_for: None,
            ..fenced(0)
        };
        assert_eq!(step(unfenced, LEASE), Step::Fence);
        assert_eq!(step(held(unfenced), LEASE), Step::Wait);
        assert_eq!(step(fenced(60_000), LEASE), Step::FailOver);
        assert_eq!(step(held(fenced(60_000)), LEASE), Step::Wait);
        assert_eq!(
            due_in(held(fenced(1_000)), LEASE),
            None,
            "nothing falls due"
        );
        let marked = CellNow {
            marked_down: true,
            ..fenced(60_000)
        };
        assert_eq!(step(held(marked), LEASE), Step::FailOver);
    }

    #[test]
    fn what_a_cell_owns_matters_only_once_it_fails() {
        // The loop scans the routes for a cell only when it fails.
        for (fenced, marked_down) in [(false, false), (true, false), (true, true)] {
            for fenced_for in [None, Some(0), Some(60_000)] {
                let healthy = CellNow {
                    failing: false,
                    failed: false,
                    owns: true,
                    fenced,
                    marked_down,
                    fenced_for: fenced_for.map(Duration::from_millis),
                    held: false,
                };
                let empty = CellNow {
                    owns: false,
                    ..healthy
                };
                assert_eq!(step(healthy, LEASE), step(empty, LEASE), "{healthy:?}");
                assert_eq!(due_in(healthy, LEASE), due_in(empty, LEASE));
            }
        }
    }
}
