//! Operations: moves, drains and failbacks that the control plane runs
//! on an operator's behalf. Each one is a durable record in the
//! coordination store (`cellmesh_operations`); the active replica runs
//! every unfinished one it owns ([`runner`]), and when it dies the next
//! active replica takes them up — every step of a move is in the route
//! table, so running it again resumes it. [`api`] serves the records over
//! gRPC on every replica.

pub mod api;
pub mod backup;
pub mod retention;
pub mod runner;

pub use cellmesh_operations::*;
