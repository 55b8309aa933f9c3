//! A tenant's quota holds over every cell: with one conversation on each of
//! two cells, each cell measures a reservation against its own bytes of the
//! tenant plus what the other last reported.

use cellmesh_proto::ids::{ConversationId, TenantId};
use cellmesh_proto::reason::Reason;
use cellmesh_proto::v1::{CreateUploadRequest, ErrorCode};
use cellmesh_tests::deploy::{
    assert_reason, create_via_edge, deploy_with, messaging, migrator, token,
};

use crate::attachments::{edge_files, no_progress, write_file};

const QUOTA: u64 = 100_000;

fn reserve(conversation: u64, size: u64) -> CreateUploadRequest {
    CreateUploadRequest {
        conversation_id: conversation,
        name: "f.bin".into(),
        content_type: "application/octet-stream".into(),
        size,
        sha256: "0".repeat(64),
        ..Default::default()
    }
}

/// Reserving `size` bytes in `conversation` is refused: over the quota.
async fn over_quota(files: &mut cellmesh_client::files::Files, conversation: u64, size: u64) {
    let err = (files.client)
        .create_upload(reserve(conversation, size))
        .await
        .unwrap_err();
    assert_reason(
        &err,
        ErrorCode::PermissionDenied,
        Reason::AttachmentQuotaExceeded.as_str(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_quota_counts_its_files_on_every_cell() {
    let d = deploy_with(None, |c| {
        let tenant = cellmesh_cell::attachments::TenantAttachments {
            quota_bytes: QUOTA,
            ..Default::default()
        };
        c.attachments.tenants.insert("1".into(), tenant);
        // The test asks for each round itself.
        c.attachments.quota_sync_secs = 0;
    })
    .await;
    let routes = d.cluster.client().await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let endpoint = d.edge.endpoint();
    // 70 kB in a conversation on eu-west/c1; another conversation moves to
    // us-east/c1.
    let here = create_via_edge(&mut m, &alice, vec![11]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "big.bin", 70_000, 1);
    edge_files(&endpoint, &alice)
        .await
        .upload(
            here,
            &path,
            "application/octet-stream",
            None,
            &mut no_progress(),
        )
        .await
        .unwrap();
    let there = create_via_edge(&mut m, &alice, vec![11]).await;
    migrator(&routes)
        .migrate_conversation(TenantId(1), ConversationId(there), "us-east/c1", |_| {})
        .await
        .unwrap();
    let (eu_west, us_east) = (&d.cells[0].cell.service, &d.cells[1].cell.service);
    assert_eq!(us_east.sync_quotas().await, 1, "eu-west/c1 answered");

    let mut files = edge_files(&endpoint, &alice).await;
    // us-east holds nothing of the tenant yet, but 70 kB + 40 kB is over.
    over_quota(&mut files, there, 40_000).await;
    files
        .client
        .create_upload(reserve(there, 20_000))
        .await
        .expect("70 kB + 20 kB fits");
    // eu-west learns of us-east's 20 kB: 70 + 20 + 20 is over.
    assert_eq!(eu_west.sync_quotas().await, 1, "us-east/c1 answered");
    over_quota(&mut files, here, 20_000).await;
    files
        .client
        .create_upload(reserve(here, 10_000))
        .await
        .expect("70 + 20 + 10 kB is the quota exactly");
}
