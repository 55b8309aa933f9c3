//! When a failed cell is fenced and when it is failed over: the rule the
//! control plane's probe loop applies to each cell on every tick, as a pure
//! function beside the planner.
//!
//! A cell the detector calls failed is first fenced: marked Degraded in the
//! route table, after which it renews no owner lease, so one lease later it
//! writes nothing more even if the table still answers it. Its routes move
//! only then, and their new owner may write them at once. A cell that
//! passes its probes again before that is simply marked Up.

use std::time::Duration;

/// What the loop knows of one cell now.
#[derive(Debug, Clone, Copy)]
pub struct CellNow {
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

/// What to do about `cell` now. A failed cell is fenced first, and failed
/// over once its owner lease has run out since the fence (counted from
/// when this control plane wrote or first saw it: a replica that takes
/// the lead over a fenced cell waits one lease more). A cell marked Down
/// that owns nothing any more is left alone.
pub fn step(cell: CellNow, owner_lease: Duration) -> Step {
    if !cell.failed {
        return Step::Wait;
    }
    if !cell.fenced {
        return Step::Fence;
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
    if !cell.failed || !cell.fenced || (!cell.owns && cell.marked_down) {
        return None;
    }
    cell.fenced_for.map(|d| owner_lease.saturating_sub(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(2);

    fn fenced(fenced_for: u64) -> CellNow {
        CellNow {
            failed: true,
            owns: true,
            fenced: true,
            marked_down: false,
            fenced_for: Some(Duration::from_millis(fenced_for)),
        }
    }

    #[test]
    fn a_failed_cell_is_fenced_first_and_failed_over_a_lease_after_the_fence() {
        let unfenced = CellNow {
            fenced: false,
            fenced_for: None,
            ..fenced(0)
        };
        assert_eq!(step(unfenced, LEASE), Step::Fence);
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
}
