//! Data residency beyond routes: a cell whose backups go to a region
//! outside the regions of a tenant bound to its own region refuses to back
//! up (`RESIDENCY_VIOLATION`), while a cell that may hold nothing of that
//! tenant backs up as before, and unbinding lifts the refusal.

use cellmesh_proto::ids::TenantId;
use cellmesh_proto::reason::Reason;

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1::backups_client::BackupsClient;
use cellmesh_proto::v1::{CreateBackupRequest, ErrorCode};
use cellmesh_tests::deploy::*;
use cellmesh_tests::router::SECRET;

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
