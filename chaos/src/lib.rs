//! Chaos tooling (DESIGN.md §7): the drills (`cellmesh chaos run`,
//! [`drill`]) that load a running deployment ([`target`]), inject faults
//! (processes, storage, queue, links through the TCP fault [`proxy`]) and
//! record what every client saw ([`history`]); and the checker, one
//! function per invariant of DESIGN.md §7 over that record
//! ([`invariants`]), returning counterexamples; the failover floors
//! that explain gaps, as the owners see them ([`floors`]); moving a
//! running `cellmesh dev`'s components to another binary ([`upgrade`]);
//! and losing and rebuilding one of its regions ([`region`]).

pub mod drill;
pub mod floors;
pub mod history;
pub mod invariants;
pub mod proxy;
pub mod region;
pub mod target;
pub mod upgrade;

pub use history::History;
pub use invariants::{Verdict, Violation, check_all};
