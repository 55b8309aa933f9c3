//! Chaos tooling (DESIGN.md §7). What exists so far is the history
//! checker: a drill records what every client saw ([`history`]), and each
//! invariant of DESIGN.md §7 is a function over that record
//! ([`invariants`]) returning counterexamples. The fault proxy, process and
//! storage faults and the drills themselves are not implemented yet.

pub mod history;
pub mod invariants;
pub mod proxy;

pub use history::History;
pub use invariants::{Verdict, Violation, check_all};
