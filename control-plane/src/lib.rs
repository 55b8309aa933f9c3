//! Control plane (DESIGN.md §5, §6): migration orchestration today; cell
//! health, failover planning and execution and the admin API are not built
//! yet.
//!
//! A migration keeps all of its state in the route table (the entry's
//! `Migrating{to, phase}` / `Frozen{to}` state and epoch), so a migrator that
//! dies is resumed by running it again for the same key, and an operator's
//! cancel is a route transition the running migrator observes as a lost
//! compare-and-set.

pub mod coord;
pub mod failover;
pub mod migration;
pub mod server;
