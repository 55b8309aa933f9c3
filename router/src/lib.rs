//! RoutingService (DESIGN.md §3): the Raft-replicated route table that maps
//! tenants, conversations and user homes to cells, the route client with its
//! watch-fed cache, and the edge access layer.
//!
//! Nothing is implemented here yet: cells currently own every conversation
//! (`cellmesh_cell::ownership::OwnAll`).
