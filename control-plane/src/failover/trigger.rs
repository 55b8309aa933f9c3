//! When a failed cell is failed over: the rule the control plane's probe
//! loop applies to each cell on every tick, as a pure function beside the
//! planner.

use std::time::Duration;

/// What the loop knows of one cell now.
#[derive(Debug, Clone, Copy)]
pub struct CellNow {
    /// The detector calls it failed.
    pub failed: bool,
    /// A route still places something on it.
    pub owns: bool,
    /// The route table marks it down (a failover was written before).
    pub marked_down: bool,
    /// How long it has failed its probes (`None`: it passes them).
    pub failing_for: Option<Duration>,
}

/// How long to wait, from a cell's first failed probe, before failing it
/// over: the owner lease it announced (`announced_ms`; 0 for releases that
/// announced none, which get `assumed_ms`), plus a tenth for clock drift.
pub fn owner_lease(announced_ms: u64, assumed_ms: u64) -> Duration {
    let lease = if announced_ms > 0 {
        announced_ms
    } else {
        assumed_ms
    };
    Duration::from_millis(lease * 11 / 10)
}

/// Whether to fail the cell over now. A failed cell is failed over once
/// its owner lease has run out (after that it writes nothing more), at
/// once when the table already marks it down (a failover that lost a
/// compare-and-set), and not at all once it owns nothing and is marked.
pub fn due(cell: CellNow, owner_lease: Duration) -> bool {
    if !cell.failed || (!cell.owns && cell.marked_down) {
        return false;
    }
    cell.marked_down || cell.failing_for.is_some_and(|d| d >= owner_lease)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(2);

    fn cell(failing_for: Option<u64>) -> CellNow {
        CellNow {
            failed: true,
            owns: true,
            marked_down: false,
            failing_for: failing_for.map(Duration::from_millis),
        }
    }

    #[test]
    fn a_failed_owner_waits_for_its_lease_to_run_out() {
        assert!(!due(cell(Some(1_999)), LEASE));
        assert!(due(cell(Some(2_000)), LEASE));
        assert!(!due(cell(None), LEASE), "no failure recorded yet");
    }

    #[test]
    fn the_wait_is_the_lease_the_cell_announced_else_the_assumed_one() {
        assert_eq!(owner_lease(1_500, 2_000), Duration::from_millis(1_650));
        assert_eq!(owner_lease(5_000, 2_000), Duration::from_millis(5_500));
        assert_eq!(owner_lease(0, 2_000), Duration::from_millis(2_200));
    }

    #[test]
    fn a_cell_the_detector_does_not_call_failed_stays() {
        let c = CellNow {
            failed: false,
            ..cell(Some(60_000))
        };
        assert!(!due(c, LEASE));
    }

    #[test]
    fn a_marked_cell_is_failed_over_again_at_once_while_it_owns_something() {
        let marked = CellNow {
            marked_down: true,
            ..cell(None)
        };
        assert!(due(marked, LEASE));
        let empty = CellNow {
            owns: false,
            ..marked
        };
        assert!(!due(empty, LEASE), "nothing left to move");
        let unmarked_empty = CellNow {
            owns: false,
            ..cell(Some(5_000))
        };
        assert!(due(unmarked_empty, LEASE), "it is still to be marked down");
    }
}
