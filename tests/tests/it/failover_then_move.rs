//! A conversation failed over, then moved on before the failed cell
//! returned. The backfill of what the failed cell acknowledged goes to the
//! owner the failover made; a move before it would leave that history
//! behind for good. So the move is refused (nothing frozen, the route
//! untouched) until the backfill has come, and then carries it all.

use cellmesh_control_plane::migration::MigrationError;
use cellmesh_proto::ids::{ConversationId, TenantId};
use cellmesh_route_client::table::{Key, RouteState};
use cellmesh_tests::TestCell;
use cellmesh_tests::deploy::{history_via_edge, migrator, wait_for_backfill, wait_for_checkpoint};
use std::time::Duration;

use crate::exactly_once::{FALLBACK, fail_first_cell, failover_deployment_with, send_before};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_over_conversation_moves_on_only_once_it_is_backfilled() {
    let (mut d, routes, cp, alice, mut m, conversation) = failover_deployment_with(|_| {}).await;
    let acked = send_before(&mut m, &alice, conversation, 12).await;
    let last = acked.last().unwrap().seq;
    wait_for_checkpoint(&routes, conversation, last, Duration::from_secs(10)).await;
    let data = fail_first_cell(&mut d, conversation).await;
    let _target = TestCell::start_routed("eu-west/c2", d.cluster.endpoints()).await;
    let mover = migrator(&routes);
    let moving = || {
        mover.migrate_conversation(
            TenantId(1),
            ConversationId(conversation),
            "eu-west/c2",
            |_| {},
        )
    };

    let refused = moving().await.unwrap_err();
    assert!(
        matches!(&refused, MigrationError::Refused(why) if why.contains("backfill")),
        "{refused}"
    );
    let key = Key::conversation(TenantId(1), ConversationId(conversation));
    let (owner, state) = routes
        .read(|t| t.resolve(&key).map(|r| (r.entry.cell, r.entry.state)))
        .unwrap();
    assert_eq!((owner.as_str(), state), (FALLBACK, RouteState::Active));

    // The failed cell returns and is backfilled: the move goes through.
    let _back = TestCell::start_routed_in("eu-west/c1", d.cluster.endpoints(), data).await;
    wait_for_backfill(&cp, "eu-west/c1", Duration::from_secs(30)).await;
    let report = moving().await.unwrap();
    assert_eq!(report.from, FALLBACK);
    let history = history_via_edge(&mut m, &alice, conversation).await;
    for a in &acked {
        assert!(
            history.iter().any(|h| h.seq == a.seq),
            "acknowledged seq {} is missing after the move: {history:?}",
            a.seq
        );
    }
    cp.stop();
}
