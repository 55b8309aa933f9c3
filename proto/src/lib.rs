//! The cellmesh protocol: generated prost/tonic code for the messaging API
//! (`v1`), the records cells store (`storage::v1`), the encoded descriptor set
//! served by gRPC reflection, and the mapping between the stable error codes
//! and `tonic::Status` (`status`).

pub mod codec;
pub mod config;
pub mod ids;
pub mod reason;
pub mod secret;
pub mod server;
pub mod status;
pub mod tls;
pub mod version;

/// The public API: messaging service, shared types, error details.
pub mod v1 {
    tonic::include_proto!("cellmesh.v1");
}

/// Replication between RoutingService replicas (never client-facing).
pub mod raft {
    pub mod v1 {
        tonic::include_proto!("cellmesh.raft.v1");
    }
}

/// Records persisted by cells. Not part of any wire API.
pub mod storage {
    pub mod v1 {
        tonic::include_proto!("cellmesh.storage.v1");
    }
}

/// The standard gRPC error model (`google.rpc.Status` and the details
/// cellmesh sends), as any gRPC client decodes it.
pub mod google {
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}

/// Encoded `FileDescriptorSet` of every cellmesh proto, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("cellmesh_descriptor");
