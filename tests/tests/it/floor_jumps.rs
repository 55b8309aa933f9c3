//! Floor jumps are recorded by the owner that makes them and reported by
//! `Pull`: after chained failovers of one conversation under load
//! (eu-west/c1 → eu-west/c2 → eu-west/c1), each jump is reported, kept
//! through the backfills, and the history checker explains every gap from
//! what `Pull` says alone — no floor reconstructed from the route table.

use std::time::Duration;

use cellmesh_chaos::history::History;
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::{CellStatus, SkipReason};
use cellmesh_route_client::commands::set_cell_status;
use cellmesh_tests::deploy::*;
use cellmesh_tests::router::SECRET;
use cellmesh_tests::{TestCell, eventually};

const MARGIN: u64 = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chained_failovers_report_every_floor_jump_through_pull() {
    let mut d = deploy(None).await;
    let routes = d.cluster.client().await;
    let routers = d.cluster.endpoints();
    let b = TestCell::start_routed("eu-west/c2", routers.clone()).await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    let senders = Senders::start(&d.edge, conv, &[10, 11]);
    senders.until_acked(30, Duration::from_secs(10)).await;
    wait_for_checkpoint(&routes, conv, 20, Duration::from_secs(10)).await;

    // A failed cell restarts on its data, is marked Up, and what it holds
    // of the conversation is backfilled into the owner.
    let returns = |cell: &'static str, dir| {
        let (routes, routers) = (routes.clone(), routers.clone());
        async move {
            let returned = TestCell::start_routed_in(cell, routers, dir).await;
            routes
                .apply(set_cell_status(cell, CellStatus::Up))
                .await
                .unwrap();
            let secret = ClusterSecret::new(SECRET);
            let backfill = cellmesh_control_plane::failover::backfill::backfill;
            assert_eq!(
                backfill(&routes, &Default::default(), &secret, cell)
                    .await
                    .0,
                1,
                "{cell} backfilled"
            );
            returned
        }
    };
    // A → B.
    let a = d.cells.remove(0);
    let a_dir = a.stop().await;
    assert_eq!(fail_over(&routes, "eu-west/c1", MARGIN).await, "eu-west/c2");
    let acked = senders.acked();
    senders
        .until_acked(acked + 30, Duration::from_secs(15))
        .await;
    // A returns; its history is backfilled into B.
    let a = returns("eu-west/c1", a_dir).await;
    // A holds B's marks (B lists it once it pushed them all there).
    let holds = eventually(Duration::from_secs(15), || {
        let listed = routes.read(|t| {
            (t.cell("eu-west/c2")).is_some_and(|c| c.mark_holders.iter().any(|h| h == "eu-west/c1"))
        });
        async move { listed }
    })
    .await;
    assert!(holds, "eu-west/c1 holds eu-west/c2's marks");
    let on_b = senders.latest_acked_seq();
    wait_for_checkpoint(&routes, conv, on_b, Duration::from_secs(10)).await;
    // B → A.
    let b_dir = b.stop().await;
    assert_eq!(fail_over(&routes, "eu-west/c2", MARGIN).await, "eu-west/c1");
    let acked = senders.acked();
    senders
        .until_acked(acked + 30, Duration::from_secs(15))
        .await;
    let _b = returns("eu-west/c2", b_dir).await;
    let ops = senders.finish(Duration::from_millis(500)).await;

    // Both jumps are reported, by the owner that made each.
    let mut history = History {
        sends: ops,
        ..History::default()
    };
    read_back_via_edge(&mut m, &alice, conv, &mut history).await;
    assert_eq!(history.skipped.len(), 2, "{:?}", history.skipped);
    let first_page = pull_via_edge(&mut m, &alice, conv).await;
    assert!(
        (first_page.skipped.iter()).all(|s| s.reason == SkipReason::Failover as i32),
        "{:?}",
        first_page.skipped
    );
    let stored = &history.conversations[&conv];
    for s in &history.skipped {
        assert!(s.last - s.first + 1 >= MARGIN, "{s:?}");
        // Nothing this owner assigned lies in its range; the message after
        // it is the first above the floor.
        assert!(stored.iter().any(|m| m.seq == s.last + 1), "{s:?}");
    }
    // The conversation's meta lists the same jumps.
    let view = m
        .get_conversation(authed(
            cellmesh_proto::v1::GetConversationRequest {
                conversation_id: conv,
                ..Default::default()
            },
            &alice,
        ))
        .await
        .unwrap()
        .into_inner()
        .conversation
        .unwrap();
    assert_eq!(view.skipped.len(), 2, "{:?}", view.skipped);
    // Every gap is explained by what Pull reported: no floors are given.
    assert!(history.floors.is_empty());
    assert_every_invariant(&history);
    drop(a);
}
