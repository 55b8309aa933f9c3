//! Control plane (DESIGN.md §5, §6): cell registry and health, failover
//! planning and execution, migration orchestration and the admin API.
//!
//! Nothing is implemented here yet.
