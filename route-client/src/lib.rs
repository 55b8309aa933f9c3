//! The route client side of RoutingService (DESIGN.md §3): the route table
//! model and its commands (`table`: keys, entries, states, the pure
//! `Command::plan → Vec<Change>`), builders of the wire commands
//! (`commands`), protobuf conversions (`convert`), and the [`client`] that
//! keeps a watch-fed copy of the table and writes through the leader (a
//! write whose answer was lost is recognised by the entry it left:
//! `recognised`), and how any process dials a cell it names ([`peers`]). It
//! holds no Raft and no storage: cells, edges and the control plane depend
//! on this crate, only the router replicas on openraft and RocksDB.

pub mod client;
pub mod commands;
pub mod convert;
mod metrics;
pub mod peers;
mod recognised;
pub mod table;
