//! Turns a stream of health observations per cell into verdicts, with
//! hysteresis: a cell is declared failed only after `down_after`
//! consecutive failed probes, and recovered after `up_after` good ones, so
//! one slow probe never moves traffic.
//!
//! A detector is made when a replica takes the lead, and it gives every
//! cell it has not yet seen healthy a startup grace before that cell's
//! failed probes count: when a whole deployment starts (or restarts) at
//! once, cells still opening their storage are not fenced and failed over
//! by a control plane that came up first. A cell the table already marks
//! Down is no cell starting up; the caller does not excuse it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Failed,
    Recovered,
}

#[derive(Debug, Default, Clone, Copy)]
struct Health {
    failures: u32,
    successes: u32,
    failed: bool,
    /// Seen healthy at least once by this detector.
    seen: bool,
}

pub struct Detector {
    down_after: u32,
    up_after: u32,
    cells: HashMap<String, Health>,
    started: Instant,
    grace: Duration,
}

impl Detector {
    pub fn new(down_after: u32, up_after: u32) -> Self {
        Self {
            down_after: down_after.max(1),
            up_after: up_after.max(1),
            cells: HashMap::new(),
            started: Instant::now(),
            grace: Duration::ZERO,
        }
    }

    /// This detector with a startup grace of `grace` from now.
    pub fn with_startup_grace(mut self, grace: Duration) -> Self {
        self.started = Instant::now();
        self.grace = grace;
        self
    }

    /// Whether `cell` may still be starting: this detector has not seen it
    /// healthy yet and its startup grace has not run out. Its failed
    /// probes are then not observed.
    pub fn starting(&self, cell: &str) -> bool {
        self.started.elapsed() < self.grace && !self.cells.get(cell).is_some_and(|h| h.seen)
    }

    /// Records one probe of `cell`; a verdict when its state changes.
    pub fn observe(&mut self, cell: &str, healthy: bool) -> Option<Verdict> {
        let h = self.cells.entry(cell.to_string()).or_default();
        if healthy {
            h.seen = true;
            h.failures = 0;
            h.successes += 1;
            if h.failed && h.successes >= self.up_after {
                h.failed = false;
                return Some(Verdict::Recovered);
            }
        } else {
            h.successes = 0;
            h.failures += 1;
            if !h.failed && h.failures >= self.down_after {
                h.failed = true;
                return Some(Verdict::Failed);
            }
        }
        None
    }

    /// Marks a cell failed without probes (manual drill, or known Down).
    pub fn mark_failed(&mut self, cell: &str) {
        let h = self.cells.entry(cell.to_string()).or_default();
        h.failed = true;
        h.successes = 0;
    }

    pub fn is_failed(&self, cell: &str) -> bool {
        self.cells.get(cell).is_some_and(|h| h.failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_need_consecutive_observations() {
        let mut d = Detector::new(3, 2);
        assert_eq!(d.observe("a", false), None);
        assert_eq!(d.observe("a", false), None);
        // A good probe in between resets the count: no flapping.
        assert_eq!(d.observe("a", true), None);
        assert_eq!(d.observe("a", false), None);
        assert_eq!(d.observe("a", false), None);
        assert_eq!(d.observe("a", false), Some(Verdict::Failed));
        assert_eq!(d.observe("a", false), None);
        assert!(d.is_failed("a"));
        assert_eq!(d.observe("a", true), None);
        assert_eq!(d.observe("a", true), Some(Verdict::Recovered));
        assert_eq!(d.observe("b", true), None);
    }

    #[test]
    fn a_cell_not_seen_healthy_is_starting_until_the_grace_runs_out() {
        let mut d = Detector::new(3, 2).with_startup_grace(Duration::from_millis(200));
        assert!(d.starting("a") && d.starting("b"));
        // Seen healthy once: its failures count from then on.
        d.observe("a", true);
        assert!(!d.starting("a"));
        d.observe("a", false);
        assert!(!d.starting("a"));
        assert!(d.starting("b"));
        std::thread::sleep(Duration::from_millis(250));
        assert!(!d.starting("b"), "the grace is over");
        // Without a grace nothing is starting.
        assert!(!Detector::new(3, 2).starting("c"));
    }
}
