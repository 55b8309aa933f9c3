//! Turns a stream of health observations per cell into verdicts, with
//! hysteresis: a cell is declared failed only after `down_after`
//! consecutive failed probes, and recovered after `up_after` good ones, so
//! one slow probe never moves traffic.

use std::collections::HashMap;

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
}

pub struct Detector {
    down_after: u32,
    up_after: u32,
    cells: HashMap<String, Health>,
}

impl Detector {
    pub fn new(down_after: u32, up_after: u32) -> Self {
        Self {
            down_after: down_after.max(1),
            up_after: up_after.max(1),
            cells: HashMap::new(),
        }
    }

    /// Records one probe of `cell`; a verdict when its state changes.
    pub fn observe(&mut self, cell: &str, healthy: bool) -> Option<Verdict> {
        let h = self.cells.entry(cell.to_string()).or_default();
        if healthy {
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
}
