//! Chaos tooling (DESIGN.md §7): the TCP fault proxy, process and storage
//! faults, drills, and the history checker that asserts the invariants.
//!
//! Nothing is implemented here yet.
