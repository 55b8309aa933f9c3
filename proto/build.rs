//! Compiles the .proto files into prost/tonic code and a file descriptor set
//! (served by gRPC reflection).

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("cellmesh_descriptor.bin"))
        .codec_path("crate::codec::CellmeshCodec")
        .compile_protos(
            &[
                "proto/cellmesh/v1/common.proto",
                "proto/cellmesh/v1/messaging.proto",
                "proto/cellmesh/v1/attachments.proto",
                "proto/cellmesh/v1/sync.proto",
                "proto/cellmesh/v1/peer.proto",
                "proto/cellmesh/v1/routing.proto",
                "proto/cellmesh/v1/operations.proto",
                "proto/cellmesh/v1/backups.proto",
                "proto/cellmesh/raft/v1/raft.proto",
                "proto/cellmesh/storage/v1/storage.proto",
                "proto/google/rpc/status.proto",
                "proto/google/rpc/error_details.proto",
            ],
            &["proto"],
        )?;
    Ok(())
}
