//! RoutingService (DESIGN.md §3): the Raft-replicated route table that maps
//! tenants, conversations and user homes to cells (`table`, `storage`,
//! `node`), the route client with its watch-fed cache (`client`), and the
//! edge access layer that authenticates clients and proxies to the owning
//! cell (`edge`).

pub mod client;
pub mod commands;
pub mod config;
pub mod edge;
pub mod grpc;
pub mod network;
pub mod node;
pub mod storage;
pub mod table;
pub mod types;
