//! Floor jumps are recorded by the owner that makes them and reported by
//! `Pull`: after chained failovers of one conversation under load
//! (eu-west/c1 → eu-west/c2 → eu-west/c1), each jump is reported, kept
//! through the backfills, and the history checker explains every gap from
//! what `Pull` says alone — no floor reconstructed from the route table. A
//! floor no send reached (its owner failed first) lies inside the next
//! owner's jump.

use std::time::Duration;

use cellmesh_chaos::history::History;
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::{CellStatus, SkipReason};
use cellmesh_route_client::client::RouteClient;
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

    // A → B.
    let a = d.cells.remove(0);
    let a_dir = a.stop().await;
    assert_eq!(fail_over(&routes, "eu-west/c1", MARGIN).await, "eu-west/c2");
    let acked = senders.acked();
    senders
        .until_acked(acked + 30, Duration::from_secs(15))
        .await;
    // A returns; its history is backfilled into B.
    let a = returns(&routes, &routers, "eu-west/c1", a_dir).await;
    holds_marks_of(&routes, "eu-west/c1", "eu-west/c2").await;
    let on_b = senders.latest_acked_seq();
    wait_for_checkpoint(&routes, conv, on_b, Duration::from_secs(10)).await;
    // B → A.
    let b_dir = b.stop().await;
    assert_eq!(fail_over(&routes, "eu-west/c2", MARGIN).await, "eu-west/c1");
    let acked = senders.acked();
    senders
        .until_acked(acked + 30, Duration::from_secs(15))
        .await;
    let _b = returns(&routes, &routers, "eu-west/c2", b_dir).await;
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

/// A new owner that fails before any send of its own leaves a floor that no
/// message reached, and its standby holds that floor as its mark. The next
/// owner's jump starts above the history it holds, not above that mark, so
/// the whole gap is reported: eu-west/c1 → eu-west/c2 (no send there) →
/// eu-west/c1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_no_send_reached_lies_inside_the_next_owners_jump() {
    let mut d = deploy(None).await;
    let routes = d.cluster.client().await;
    let routers = d.cluster.endpoints();
    let b = TestCell::start_routed("eu-west/c2", routers.clone()).await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11, 12, 13]).await;
    let before = Senders::start(&d.edge, conv, &[10, 11]);
    before.until_acked(30, Duration::from_secs(10)).await;
    let epoch = before.epoch;
    let mut ops = before.finish(Duration::ZERO).await;
    let on_a = (ops.iter())
        .filter_map(|o| match o.outcome {
            cellmesh_chaos::history::Outcome::Ok { seq, .. } => Some(seq),
            _ => None,
        })
        .max()
        .unwrap();
    wait_for_checkpoint(&routes, conv, on_a, Duration::from_secs(10)).await;
    // A → B, which assigns nothing: A returns and holds B's floor as its mark.
    let a = d.cells.remove(0);
    let a_dir = a.stop().await;
    assert_eq!(fail_over(&routes, "eu-west/c1", MARGIN).await, "eu-west/c2");
    let a = returns(&routes, &routers, "eu-west/c1", a_dir).await;
    holds_marks_of(&routes, "eu-west/c1", "eu-west/c2").await;
    wait_for_checkpoint(&routes, conv, on_a + MARGIN, Duration::from_secs(10)).await;
    // B → A: A assigns above B's floor plus the margin.
    let b_dir = b.stop().await;
    assert_eq!(fail_over(&routes, "eu-west/c2", MARGIN).await, "eu-west/c1");
    let after = Senders::start(&d.edge, conv, &[12, 13]);
    after.until_acked(30, Duration::from_secs(15)).await;
    let shift = after.epoch.duration_since(epoch).as_millis() as u64;
    let _b = returns(&routes, &routers, "eu-west/c2", b_dir).await;
    ops.extend(after.finish(Duration::ZERO).await.into_iter().map(|mut o| {
        o.invoked_ms += shift;
        o.completed_ms += shift;
        o
    }));

    let mut history = History {
        sends: ops,
        ..History::default()
    };
    read_back_via_edge(&mut m, &alice, conv, &mut history).await;
    let stored = &history.conversations[&conv];
    let resumed = stored.iter().find(|s| s.seq > on_a).unwrap().seq;
    assert!(resumed > on_a + 2 * MARGIN, "A resumed at {resumed}");
    // One range reported covers everything between A's history and its
    // first send above the floor.
    assert!(
        (history.skipped.iter()).any(|s| s.first <= on_a + 1 && s.last + 1 == resumed),
        "{:?}",
        history.skipped
    );
    assert_every_invariant(&history);
    drop(a);
}

/// Restarts a failed cell on its data, marks it Up, and backfills what it
/// holds of the conversation into the owner.
async fn returns(
    routes: &RouteClient,
    routers: &[String],
    cell: &'static str,
    dir: tempfile::TempDir,
) -> TestCell {
    let returned = TestCell::start_routed_in(cell, routers.to_vec(), dir).await;
    routes
        .apply(set_cell_status(cell, CellStatus::Up))
        .await
        .unwrap();
    let secret = ClusterSecret::new(SECRET);
    let backfill = cellmesh_control_plane::failover::backfill::backfill;
    assert_eq!(
        backfill(routes, &Default::default(), &secret, cell)
            .await
            .conversations,
        1,
        "{cell} backfilled"
    );
    returned
}

/// Waits until the route table lists `holder` as holding `owner`'s marks
/// (the owner lists it once it pushed them all there).
async fn holds_marks_of(routes: &RouteClient, holder: &str, owner: &str) {
    let holds = eventually(Duration::from_secs(15), || {
        let listed = routes
            .read(|t| (t.cell(owner)).is_some_and(|c| c.mark_holders.iter().any(|h| h == holder)));
        async move { listed }
    })
    .await;
    assert!(holds, "{holder} holds {owner}'s marks");
}
