//! gRPC handlers of a router replica: the client/admin Routing API and the
//! separate RaftPeer service, plus the protobuf conversions they share with
//! the route client.

pub mod convert;
pub mod raft;
pub mod read_index;
pub mod routing;
