//! gRPC handlers of a router replica: the client/admin Routing API and the
//! separate RaftPeer service. Protobuf conversions of the table are the
//! route client's (`cellmesh_route_client::convert`).

pub(crate) use cellmesh_route_client::convert;
pub mod authorize;
mod coalesce;
pub mod processes;
pub mod propose;
pub mod raft;
pub mod read_index;
pub mod routing;
