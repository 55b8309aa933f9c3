//! A cell's `links` (a proxy standing in for another cell's address) carry
//! every call it makes to that cell: a move's copy from the source goes
//! through the target's link to the source, so a cut link holds the move
//! and a healed one lets it finish.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::time::Duration;

use cellmesh_control_plane::migration::{MigrationOptions, Migrator};
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_tests::deploy::{authed, text};
use cellmesh_tests::router::SECRET;

use super::failover::tenant_on_c1;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moves_copy_goes_through_the_targets_link_to_the_source() {
    let cluster = cellmesh_tests::router::RouterCluster::start(1, |_| {}).await;
    let source = cellmesh_tests::TestCell::start_routed("eu-west/c1", cluster.endpoints()).await;
    let (link, via) = cellmesh_tests::link_to(&source.endpoint).await;
    let source_address = source.endpoint.clone();
    let _target = cellmesh_tests::TestCell::start_routed_with(
        "eu-west/c2",
        cluster.endpoints(),
        tempfile::tempdir().unwrap(),
        |c| {
            c.routing.links.insert(source_address, via);
        },
    )
    .await;
    let (routes, _edge, mut m, alice, conv) = tenant_on_c1(&cluster).await;
    for i in 0..20 {
        m.send(authed(text(conv, &format!("m-{i}")), &alice))
            .await
            .unwrap();
    }
    let migrator = Migrator::new(
        routes,
        ClusterSecret::new(SECRET),
        MigrationOptions::default(),
    );

    link.partition(true, true);
    let cut = tokio::time::timeout(
        Duration::from_secs(5),
        migrator.migrate_conversation(TenantId(1), ConversationId(conv), "eu-west/c2", |_| {}),
    )
    .await;
    assert!(
        !matches!(cut, Ok(Ok(_))),
        "the copy cannot reach the source while the target's link to it is cut"
    );

    link.heal();
    let report = migrator
        .migrate_conversation(TenantId(1), ConversationId(conv), "eu-west/c2", |_| {})
        .await
        .expect("the move finishes once the link is back");
    assert!(report.final_seq >= 20, "{report:?}");
}
