//! Route writes whose answer is lost: the attempt commits, its answer is
//! held past the attempt's deadline, and the route client's retry on
//! another replica finds the entry moved on by that very write. The write
//! is recognised by the entry it left; someone else's write is not.

use cellmesh_chaos::proxy::FaultProxy;
use cellmesh_proto::ids::TenantId;
use cellmesh_proto::reason::Reason;
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::status::error_detail;
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::commands::{assign_tenant, register_cell};
use cellmesh_route_client::table::Key;
use cellmesh_tests::router::{RouterCluster, SECRET};

/// A route client whose first endpoint is `link` (tried first) and whose
/// second reaches the replica directly.
async fn through(link: &FaultProxy, cluster: &RouterCluster) -> RouteClient {
    let endpoints = vec![format!("http://{}", link.addr()), cluster.endpoint(0)];
    RouteClient::connect(endpoints, ClusterSecret::new(SECRET))
        .await
        .expect("route client connects")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placement_whose_answer_was_lost_is_recognised_and_another_is_not() {
    let cluster = RouterCluster::start(1, |_| {}).await;
    let direct = cluster.client().await;
    for cell in ["eu-west/c1", "eu-west/c2"] {
        direct
            .apply(register_cell(
                cell,
                "eu-west",
                &format!("http://{cell}.invalid"),
            ))
            .await
            .expect("register cell");
    }
    let upstream = cluster.replicas[0].config.api_listen;
    let link = FaultProxy::start("127.0.0.1:0".parse().unwrap(), upstream)
        .await
        .unwrap();

    // A plain write: the retry is refused although the first attempt
    // placed the tenant where it was asked to.
    let plain = through(&link, &cluster).await;
    link.partition(false, true);
    let refused = plain
        .apply(assign_tenant(TenantId(1), "eu-west/c1", 0))
        .await
        .expect_err("the retry finds the tenant placed");
    assert_eq!(
        error_detail(&refused).known_reason(),
        Some(Reason::StaleEpoch),
        "{refused:?}"
    );
    let first = direct.current_entry(&Key::tenant(TenantId(1))).await;
    let first = first.unwrap().expect("placed");
    assert_eq!(first.cell, "eu-west/c1");
    let first_epoch = first.epoch;
    link.heal();

    // The same write through `place_tenant` is recognised by its entry.
    let recognising = through(&link, &cluster).await;
    link.partition(false, true);
    let epoch = recognising
        .place_tenant(TenantId(2), "eu-west/c1")
        .await
        .expect("a placement whose answer was lost is done");
    let entry = direct.current_entry(&Key::tenant(TenantId(2))).await;
    let entry = entry.unwrap().expect("placed");
    assert_eq!((entry.cell.as_str(), entry.epoch), ("eu-west/c1", epoch));
    link.heal();

    // A tenant placed on another cell is not taken as placed; one placed
    // on the asked cell is (placing is idempotent).
    let refused = direct
        .place_tenant(TenantId(1), "eu-west/c2")
        .await
        .expect_err("placed elsewhere");
    assert_eq!(
        error_detail(&refused).known_reason(),
        Some(Reason::StaleEpoch)
    );
    let again = direct.place_tenant(TenantId(1), "eu-west/c1").await;
    assert_eq!(again.ok(), Some(first_epoch));
}
