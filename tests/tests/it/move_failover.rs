//! A conversation moved moments ago, then its new owner fails over: the
//! owner's standby received the conversation's meta while it was still
//! being copied (before the route switched), so after the failover it
//! serves the conversation at once — no send or pull is answered "not
//! found" — and once the hung owner returns and is backfilled every
//! acknowledged message reads back, in both replication modes.

use cellmesh_proto::ids::{ConversationId, TenantId};
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
        .apply(assign_tenant(TenantId(1), "eu-west/c1", 0))
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
        .migrate_conversation(TenantId(1), ConversationId(conv), "us-east/c1", |_| {})
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
        .resolve(&Key::conversation(TenantId(1), ConversationId(conv)))
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
    // The standby writes once the hung cell's lease has surely run out.
    let ops = senders.finish(Duration::from_millis(4_000)).await;
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

/// A conversation moves off a cell that is its target's standby, and the
/// target fails over back to that cell before its next checkpoint: the old
/// owner took the marks the target pushed while the move was frozen, so
/// its floor lands above everything the target may have written, and the
/// target's acknowledged sends survive (backfilled below the floor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_failing_back_to_the_moves_source_loses_nothing_it_acknowledged() {
    let cluster = RouterCluster::start(1, |_| {}).await;
    let routers = cluster.endpoints();
    // us-east/c2 owns the tenant and is us-east/c1's standby.
    let _source = TestCell::start_routed("us-east/c2", routers.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = busy_cell_config(dir.path(), "us-east/c1", &routers, ReplicationMode::Async);
    // No checkpoint of what it writes after the switch reaches the source.
    config.routing.checkpoint_interval_ms = 10_000;
    let process = CellProcess::start_configured(dir.path(), &config).await;
    let routes = cluster.client().await;
    routes
        .apply(assign_tenant(TenantId(1), "us-east/c2", 0))
        .await
        .unwrap();
    let edge = start_edge(routers.clone()).await;
    // A failover margin of 50 + 50/s × 2 × 200 ms = 70 seqs.
    let cp = control_plane_with(
        routers.clone(),
        cellmesh_control_plane::server::FailoverConfig {
            conversation_per_sec: 50,
            conversation_burst: 50,
            checkpoint_interval_ms: 200,
            owner_lease_ms: 2_000,
        },
    )
    .await;
    let alice = token(1, 10);
    let mut m = messaging(&edge).await;
    // Each phase sends as users of its own: request ids stay unique.
    let conv = create_via_edge(&mut m, &alice, vec![11, 12, 13]).await;
    let before = Senders::start(&edge, conv, &[10, 11]);
    let epoch = before.epoch;
    before.until_acked(150, Duration::from_secs(30)).await;
    let mut ops = before.finish(Duration::ZERO).await;
    // Each phase's operations on the first phase's clock.
    let finished = |senders: Senders| async move {
        let shift = senders.epoch.duration_since(epoch).as_millis() as u64;
        let mut ops = senders.finish(Duration::ZERO).await;
        for op in &mut ops {
            op.invoked_ms += shift;
            op.completed_ms += shift;
        }
        ops
    };
    let moved_at = ops
        .iter()
        .filter_map(|o| match o.outcome {
            Outcome::Ok { seq, .. } => Some(seq),
            _ => None,
        })
        .max()
        .unwrap();
    assert!(moved_at > 70, "more history than the margin: {moved_at}");
    migrator(&routes)
        .migrate_conversation(TenantId(1), ConversationId(conv), "us-east/c1", |_| {})
        .await
        .expect("the move finishes");
    // A few sends on the new owner, then it hangs and fails back.
    let after = Senders::start(&edge, conv, &[12]);
    after.until_acked(5, Duration::from_secs(10)).await;
    ops.extend(finished(after).await);
    process.signal(libc::SIGSTOP);
    assert!(
        eventually(Duration::from_secs(20), || {
            let back = routes
                .resolve(&Key::conversation(TenantId(1), ConversationId(conv)))
                .is_some_and(|r| r.entry.cell == "us-east/c2");
            async move { back }
        })
        .await,
        "no failover: {:?}",
        cp.events()
    );
    let resumed = Senders::start(&edge, conv, &[13]);
    resumed.until_acked(5, Duration::from_secs(10)).await;
    ops.extend(finished(resumed).await);
    process.signal(libc::SIGCONT);
    wait_for_backfill(&cp, "us-east/c1", Duration::from_secs(30)).await;
    let mut history = History {
        sends: ops,
        ..History::default()
    };
    read_back_via_edge(&mut m, &alice, conv, &mut history).await;
    assert_every_invariant(&history);
    cp.stop();
}
