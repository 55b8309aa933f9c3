//! Route writes whose answer is lost: the attempt commits, its answer is
//! held past the attempt's deadline, and the route client's retry on
//! another replica finds the entry moved on by that very write. The write
//! is recognised by the entry it left; someone else's write is not.
//! Placing a tenant, placing a conversation created on a moving tenant's
//! target and a cell's record of its mark holders are all recognised.

use std::sync::Arc;

use cellmesh_cell::hwm::HighWaterMarks;
use cellmesh_cell::ownership::Ownership;
use cellmesh_cell::routed::Routed;
use cellmesh_chaos::proxy::FaultProxy;
use cellmesh_proto::ids::{ConversationId, TenantId};
use cellmesh_proto::reason::Reason;
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1::update_route::Transition;
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::commands::{
    assign_tenant, register_cell, set_mark_holders, update_route,
};
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

/// One replica with cells `eu-west/c1` and `eu-west/c2` registered: the
/// cluster, a client reaching it directly, and a link in front of it.
async fn two_cells() -> (RouterCluster, RouteClient, FaultProxy) {
    let cluster = RouterCluster::start(1, |_| {}).await;
    let direct = cluster.client().await;
    for cell in ["eu-west/c1", "eu-west/c2"] {
        let address = format!("http://{cell}.invalid");
        let registered = direct.apply(register_cell(cell, "eu-west", &address)).await;
        registered.expect("register cell");
    }
    let upstream = cluster.replicas[0].config.api_listen;
    let link = FaultProxy::start("127.0.0.1:0".parse().unwrap(), upstream)
        .await
        .unwrap();
    (cluster, direct, link)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placement_whose_answer_was_lost_is_recognised_and_another_is_not() {
    let (cluster, direct, link) = two_cells().await;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_placed_on_a_moving_tenants_target_is_placed_though_its_answer_was_lost() {
    let (cluster, direct, link) = two_cells().await;
    let tenant = Key::tenant(TenantId(1));
    let epoch = direct
        .place_tenant(TenantId(1), "eu-west/c1")
        .await
        .unwrap();
    let moving = update_route(
        &tenant,
        epoch,
        Transition::BeginMigration("eu-west/c2".into()),
    );
    let moving = direct
        .apply(moving)
        .await
        .expect("the tenant starts moving");

    // The target cell's route client reaches the replica through a link
    // that holds every answer: the placement commits, its answer does not
    // come back, and the retry goes straight to the replica.
    let client = through(&link, &cluster).await;
    assert!(
        client
            .wait_applied(moving.index, std::time::Duration::from_secs(10))
            .await
    );
    let marks = Arc::new(HighWaterMarks::default());
    let target = Routed::new(client, "eu-west/c2".into(), 0, None, marks);
    link.partition(false, true);
    target
        .place(TenantId(1), ConversationId(7))
        .await
        .expect("the placement whose answer was lost is taken as done");
    let placed = Key::conversation(TenantId(1), ConversationId(7));
    let entry = direct
        .current_entry(&placed)
        .await
        .unwrap()
        .expect("routed");
    assert_eq!((entry.key, entry.cell.as_str()), (placed, "eu-west/c2"));
    assert!(entry.epoch > moving.index, "written by the placement");
}

/// `eu-west/c1`'s epoch and mark holders as the leader has them.
async fn c1(client: &RouteClient) -> (u64, Vec<String>) {
    client
        .catch_up()
        .await
        .expect("the table read through the leader");
    let cell = client.read(|t| t.cell("eu-west/c1").cloned());
    let cell = cell.expect("registered");
    (cell.epoch, cell.mark_holders)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cells_mark_holders_whose_answer_was_lost_are_recognised_and_a_stale_write_is_not() {
    let (cluster, direct, link) = two_cells().await;
    let (registered, holders) = c1(&direct).await;
    assert!(holders.is_empty());

    // A plain write: the retry is refused although the first attempt
    // recorded the holder.
    let plain = through(&link, &cluster).await;
    link.partition(false, true);
    let holder = vec!["eu-west/c2".to_string()];
    let refused = plain
        .apply(set_mark_holders("eu-west/c1", holder.clone(), registered))
        .await
        .expect_err("the retry finds the cell moved on");
    assert_eq!(
        error_detail(&refused).known_reason(),
        Some(Reason::StaleEpoch),
        "{refused:?}"
    );
    link.heal();
    let (recorded, holders) = c1(&direct).await;
    assert!(recorded > registered);
    assert_eq!(holders, holder);

    // The cell's own write through `set_mark_holders` is recognised by
    // the entry it left, with that entry's epoch.
    let recognising = through(&link, &cluster).await;
    link.partition(false, true);
    let epoch = recognising
        .set_mark_holders("eu-west/c1", Vec::new(), recorded)
        .await
        .expect("holders whose answer was lost are recorded");
    link.heal();
    assert_eq!(c1(&direct).await, (epoch, Vec::new()));
    assert!(epoch > recorded);

    // A write expecting an epoch another write moved on from, asking for
    // holders the cell does not have, is refused.
    let stale = direct
        .set_mark_holders("eu-west/c1", holder, recorded)
        .await
        .expect_err("the cell moved on since");
    assert_eq!(
        error_detail(&stale).known_reason(),
        Some(Reason::StaleEpoch)
    );
    assert_eq!(c1(&direct).await, (epoch, Vec::new()));
}
