//! Files for `bench tenant-move --files N`: one random file of
//! `--file-mb`, uploaded N times through the edge into the tenant's
//! conversations (each upload its own object in the region's store), each
//! sent in a message, before the move, so a move to another region copies
//! N objects.

use std::time::{Duration, Instant};

use cellmesh_chaos::target::DevTarget;
use cellmesh_client::connect::{attachments_as, connect_as};
use cellmesh_client::files::Files;

/// Uploads `count` copies of a `mb`-MiB file, copy `k` into `uploads[k %
/// len]` (a conversation and one of its members), and sends each in a
/// message; the bytes uploaded and the time it took.
pub async fn upload(
    dev: &DevTarget,
    tenant: u64,
    uploads: &[(u64, u64)],
    (count, mb): (u64, u64),
) -> anyhow::Result<(u64, Duration)> {
    if count == 0 || uploads.is_empty() {
        return Ok((0, Duration::ZERO));
    }
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("bench.bin");
    crate::attachments::write_random(&path, mb << 20)?;
    let started = Instant::now();
    let mut bytes = 0;
    for k in 0..count {
        let (conversation, user) = uploads[(k % uploads.len() as u64) as usize];
        let token = dev.token(tenant, user, "bench");
        let client = attachments_as(&dev.edge, Some(&token)).await?;
        let file = Files::new(client, None)
            .upload(
                conversation,
                &path,
                "application/octet-stream",
                None,
                &mut |_, _| {},
            )
            .await?;
        let send = cellmesh_proto::v1::SendRequest {
            conversation_id: conversation,
            client_req_id: format!("bench-file-{tenant}-{k}"),
            r#type: cellmesh_proto::v1::MessageType::Text as i32,
            body: b"a file".to_vec(),
            attachment_ids: vec![file.attachment_id],
            ..Default::default()
        };
        let (mut messaging, _) = connect_as(&dev.edge, Some(&token)).await?;
        messaging.send(send).await?;
        bytes += file.size;
    }
    Ok((bytes, started.elapsed()))
}
