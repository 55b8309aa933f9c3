//! Control plane (DESIGN.md §5, §6): cell health and failover (leases and
//! the active replica's election through `cellmesh_coord`), live
//! migration, and the deployment's status with its web console.
//!
//! A migration keeps all of its state in the route table (the entry's
//! `Migrating{to, phase}` / `Frozen{to}` state and epoch), so a migrator that
//! dies is resumed by running it again for the same key, and an operator's
//! cancel is a route transition the running migrator observes as a lost
//! compare-and-set.

pub mod console;
pub mod failover;
pub mod metrics;
pub mod migration;
pub mod operations;
pub mod panels;
pub mod server;
pub mod start_error;
pub mod status;
