//! Data residency beyond routes: a cell whose backups go to a region
//! outside the regions of a tenant bound to its own region refuses to back
//! up (`RESIDENCY_VIOLATION`), while a cell that may hold nothing of that
//! tenant backs up as before, and unbinding lifts the refusal. Likewise a
//! cell whose file store or cold tier lies outside a bound tenant's regions
//! takes no upload of it and leaves its history hot.

use cellmesh_proto::ids::TenantId;
use cellmesh_proto::reason::Reason;

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1::backups_client::BackupsClient;
use cellmesh_proto::v1::{AuditRequest, CreateBackupRequest, ErrorCode};
use cellmesh_tests::deploy::*;
use cellmesh_tests::router::SECRET;

use crate::attachments::{edge_files, no_progress, write_file};

async fn back_up(endpoint: &str) -> Result<(), tonic::Status> {
    let mut client = BackupsClient::connect(endpoint.to_string()).await.unwrap();
    let mut request = tonic::Request::new(CreateBackupRequest { keep: 0 });
    ClusterSecret::new(SECRET).attach(&mut request);
    client.create(request).await.map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_does_not_back_up_a_bound_tenant_into_another_region() {
    let d = deploy_with(None, |c| {
        if c.cell_id == "eu-west/c1" {
            c.backup.region = "us-east".into();
        }
    })
    .await;
    let routes = d.cluster.client().await;
    bind_regions(&routes, TenantId(1), &["eu-west"]).await;
    let (eu, us) = (&d.cells[0].endpoint, &d.cells[1].endpoint);
    let refused = back_up(eu).await.unwrap_err();
    let detail = error_detail(&refused);
    assert_eq!(detail.reason, Reason::ResidencyViolation, "{refused:?}");
    assert_eq!(detail.code, ErrorCode::PermissionDenied as i32);
    // us-east/c1 may hold nothing of tenant 1: its backups go on.
    back_up(us).await.unwrap();
    bind_regions(&routes, TenantId(1), &[]).await;
    back_up(eu).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_tenants_files_and_cold_history_stay_out_of_other_regions_stores() {
    let d = deploy_with(None, |c| {
        if c.cell_id == "eu-west/c1" {
            c.attachments.enabled = true;
            c.attachments.region = "us-east".into();
            c.tiering.enabled = true;
            c.tiering.region = "us-east".into();
            c.tiering.hot_messages_per_conversation = 2;
        }
    })
    .await;
    let routes = d.cluster.client().await;
    bind_regions(&routes, TenantId(1), &["eu-west"]).await;
    let (mut m, alice) = (messaging(&d.edge).await, token(1, 10));
    let conversation = create_seeded(&mut m, &alice, 1, 6).await[0];
    let dir = tempfile::tempdir().unwrap();
    let file = write_file(dir.path(), "report.bin", 10_000, 3);
    let endpoint = d.edge.endpoint();
    let upload = || async {
        edge_files(&endpoint, &alice)
            .await
            .upload(
                conversation,
                &file,
                "application/octet-stream",
                None,
                &mut no_progress(),
            )
            .await
    };
    let refused = upload().await.unwrap_err();
    assert!(
        format!("{refused:#}").contains("RESIDENCY_VIOLATION"),
        "{refused:#}"
    );
    let service = &d.cells[0].cell.service;
    let held = service.tier_once().await.unwrap();
    assert_eq!(
        (held.held_for_residency, held.messages_tiered),
        (1, 0),
        "{held:?}"
    );
    // Unbound, the same tenant's files and history may go there.
    bind_regions(&routes, TenantId(1), &[]).await;
    upload().await.unwrap();
    let tiered = service.tier_once().await.unwrap();
    assert_eq!(tiered.held_for_residency, 0, "{tiered:?}");
    assert!(tiered.messages_tiered >= 4, "{tiered:?}");
}

async fn audit(endpoint: &str, needle: &[u8]) -> Result<Vec<(String, u64)>, tonic::Status> {
    let mut client = BackupsClient::connect(endpoint.to_string()).await.unwrap();
    let mut request = tonic::Request::new(AuditRequest {
        tenant_id: 1,
        needles: vec![needle.to_vec()],
    });
    ClusterSecret::new(SECRET).attach(&mut request);
    let answer = client.audit(request).await?.into_inner();
    Ok(answer
        .rows
        .into_iter()
        .map(|r| (r.column_family, r.rows))
        .collect())
}

/// The audit a residency drill asks of every cell: the owner finds a
/// message's body in its store and the other region's cell does not; that
/// cell, a standby, finds the request id of an unbound tenant's send (its
/// answer is copied there) and not that of a send made once the tenant is
/// bound to the owner's region. A needle too short to mean anything is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_audit_finds_a_tenants_bytes_only_where_they_are() {
    let d = deploy(None).await;
    let (mut m, alice) = (messaging(&d.edge).await, token(1, 10));
    let conversation = create_via_edge(&mut m, &alice, vec![11]).await;
    let send = |request_id: &str| {
        let mut send = text(conversation, "audit-body-7f3e");
        send.client_req_id = request_id.into();
        authed(send, &alice)
    };
    m.send(send("audit-request-1")).await.unwrap();
    let (eu, us) = (&d.cells[0].endpoint, &d.cells[1].endpoint);
    let found = audit(eu, b"audit-body-7f3e").await.unwrap();
    assert!(
        found.iter().any(|(cf, n)| cf == "messages" && *n == 1),
        "{found:?}"
    );
    assert_eq!(audit(us, b"audit-body-7f3e").await.unwrap(), vec![]);
    assert_eq!(audit(eu, b"never-written-9c").await.unwrap(), vec![]);
    let standby = || async {
        let mut found = Vec::new();
        for _ in 0..50 {
            found = audit(us, b"audit-request-").await.unwrap();
            if !found.is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        found
    };
    assert_eq!(standby().await, vec![("idempotency".to_string(), 1)]);
    let routes = d.cluster.client().await;
    bind_regions(&routes, TenantId(1), &["eu-west"]).await;
    m.send(send("audit-request-2")).await.unwrap();
    m.send(send("audit-request-3")).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    assert_eq!(standby().await, vec![("idempotency".to_string(), 1)]);
    let refused = audit(eu, b"short").await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
}
