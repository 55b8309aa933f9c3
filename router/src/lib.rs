//! RoutingService (DESIGN.md §3): the Raft-replicated route table that maps
//! tenants, conversations and user homes to cells — the Raft node
//! (`node`, `network`), its log and state machine on RocksDB (`storage`),
//! and the Routing and Raft gRPC services (`grpc`). The table model, its
//! commands and the route client live in `cellmesh_route_client`.

pub mod config;
pub mod grpc;
pub mod metrics;
pub mod network;
pub mod node;
pub mod storage;
pub mod types;
pub mod wire;

pub(crate) use cellmesh_route_client::table;
