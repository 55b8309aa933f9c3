//! A conversation moved moments ago, then its new owner fails over: the
//! owner's standby received the conversation's meta while it was still
//! being copied (before the route switched), so after the failover it
//! serves the conversation at once — no send or pull is answered "not
//! found" — and once the hung owner returns and is backfilled every
//! acknowledged message reads back, in both replication modes.

use std::time::Duration;

use cellmesh_cell::config::ReplicationMode;
use cellmesh_chaos::history::{Floor, History, Outcome};
use cellmesh_control_plane::server::Event;
use cellmesh_route_client::commands::assign_tenant;
use cellmesh_route_client::table::Key;
use cellmesh_tests::deploy::*;
use cellmesh_tests::router::RouterCluster;
use cellmesh_tests::{CellProcess, TestCell, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_moved_just_before_its_new_owner_fails_over_is_served_by_the_standby() {
    move_then_fail_over(ReplicationMode::Async).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_sync_mode_a_conversation_moved_just_before_a_failover_is_served_by_the_standby() {
    move_then_fail_over(ReplicationMode::Sync).await;
}

async fn move_then_fail_over(mode: ReplicationMode) {
    let cluster = RouterCluster::start(1, |_| {}).await;
    let routers = cluster.endpoints();
    // The conversation starts on eu-west/c1 and moves to us-east/c1, a
    // process that hangs; us-east/c2 is its standby.
    let source = TestCell::start_routed_with(
        "eu-west/c1",
        routers.clone(),
        tempfile::tempdir().unwrap(),
        |c| c.replication.mode = mode,
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = busy_cell_config(dir.path(), "us-east/c1", &routers, mode);
    let process = CellProcess::start_configured(dir.path(), &config).await;
    let _standby = TestCell::start_routed_with(
        "us-east/c2",
        routers.clone(),
        tempfile::tempdir().unwrap(),
        |c| c.replication.mode = mode,
    )
    .await;
    let routes = cluster.client().await;
    routes
        .apply(assign_tenant(1, "eu-west/c1", 0))
        .await
        .unwrap();
    let edge = start_edge(routers.clone()).await;
    let cp = busy_control_plane(routers.clone()).await;

    let alice = token(1, 10);
    let mut m = messaging(&edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    let senders = Senders::start(&edge, conv, &[10, 11]);
    senders.until_acked(20, Duration::from_secs(10)).await;
    // Within a second of its creation the conversation moves.
    let report = migrator(&routes)
        .migrate_conversation(1, conv, "us-east/c1", |_| {})
        .await
        .expect("the move finishes");
    assert_eq!(report.to, "us-east/c1");
    let moved_at = senders.latest_acked_seq();
    // Sends flow on the new owner and reach its standby's checkpoint.
    wait_for_checkpoint(&routes, conv, moved_at + 20, Duration::from_secs(15)).await;

    let stopped_ms = senders.now_ms();
    process.signal(libc::SIGSTOP);
    assert!(
        eventually(Duration::from_secs(20), || {
            let moved = cp
                .events()
                .iter()
                .any(|e| matches!(e, Event::FailedOver { cell, .. } if cell == "us-east/c1"));
            async move { moved }
        })
        .await,
        "no failover: {:?}",
        cp.events()
    );
    let owner = routes
        .resolve(&Key::conversation(1, conv))
        .map(|r| r.entry.cell);
    assert_eq!(owner.as_deref(), Some("us-east/c2"));
    // The standby serves the conversation before the hung cell returns.
    // Async: the history waits for the backfill above a failover floor;
    // sync: the standby holds it already.
    let page = pull_via_edge(&mut m, &alice, conv).await;
    assert!(
        page.seq_floor > moved_at || page.latest_seq > moved_at,
        "the standby knows the conversation: {page:?}"
    );
    let ops = senders.finish(Duration::from_millis(1500)).await;
    let after_failover = ops
        .iter()
        .filter(|o| o.invoked_ms > stopped_ms && matches!(o.outcome, Outcome::Ok { .. }))
        .count();
    assert!(after_failover > 0, "sends continue on the standby");

    // The hung cell resumes; what it holds is backfilled.
    process.signal(libc::SIGCONT);
    wait_for_backfill(&cp, "us-east/c1", Duration::from_secs(30)).await;
    let complete = eventually(Duration::from_secs(15), || {
        let mut m = m.clone();
        let alice = alice.clone();
        async move {
            pull_via_edge(&mut m, &alice, conv)
                .await
                .unavailable_through
                == 0
        }
    })
    .await;
    assert!(complete, "history is complete after the backfill");
    let floor = floor_of(&routes, conv).await;
    let mut history = History {
        sends: ops,
        ..History::default()
    };
    history
        .conversations
        .insert(conv, history_via_edge(&mut m, &alice, conv).await);
    history.floors.push(Floor {
        conversation: conv,
        floor,
    });
    // Every acknowledged send reads back; none was answered "not found".
    assert_every_invariant(&history);
    drop(source);
    cp.stop();
}
