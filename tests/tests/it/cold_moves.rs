//! Cold history between cells: a tenant move and a failover backfill hand
//! a conversation's segments over by its manifest (cells that share the
//! bucket copy only the hot tail; a target with a bucket of its own copies
//! the segment objects first), and the new owner serves the cold pages
//! afterwards.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::path::Path;
use std::time::Duration;

use cellmesh_cell::CellConfig;
use cellmesh_route_client::table::Key;
use cellmesh_tests::deploy::*;
use cellmesh_tests::eventually;

const SOURCE: &str = "eu-west/c1";
const TARGET: &str = "us-east/c1";

/// Each cell tiers into a directory of its own (a bucket each): all but
/// each conversation's newest 10 messages, in segments of 25, when asked.
fn tiered(c: &mut CellConfig) {
    let t = &mut c.tiering;
    t.enabled = true;
    t.hot_messages_per_conversation = 10;
    t.segment_max_messages = 25;
    t.interval_ms = 3_600_000;
}

/// [`tiered`], both cells into one directory (the region's bucket).
fn sharing(dir: &Path) -> impl Fn(&mut CellConfig) + Clone {
    let dir = dir.to_path_buf();
    move |c: &mut CellConfig| {
        tiered(c);
        c.tiering.local_dir = dir.clone();
    }
}

/// A conversation of tenant 1 with 60 messages, 50 of them tiered on the
/// source; its history as read through the edge.
async fn tiered_conversation(d: &Deployment) -> (u64, Vec<cellmesh_chaos::history::Stored>) {
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    for i in 0..60 {
        m.send(authed(text(conv, &format!("m-{i}")), &alice))
            .await
            .unwrap();
    }
    let report = d.cells[0].cell.service.tier_once().await.unwrap();
    assert_eq!((report.segments_written, report.messages_tiered), (2, 50));
    let history = history_via_edge(&mut m, &alice, conv).await;
    assert_eq!(history.len(), 60);
    (conv, history)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_move_hands_cold_history_over_by_its_manifest() {
    let cold = tempfile::tempdir().unwrap();
    let d = deploy_with(None, sharing(cold.path())).await;
    let (conv, before) = tiered_conversation(&d).await;
    let routes = d.cluster.client().await;
    let migrator = migrator(&routes);
    migrator
        .migrate_tenant(TenantId(1), TARGET, 4, |_| {})
        .await
        .expect("tenant move succeeds");
    let target = d.cells[1].cell.service.store();
    assert_eq!(
        target.segments(ConversationId(conv)).unwrap().len(),
        2,
        "the manifest moved"
    );
    assert!(
        target.message(ConversationId(conv), 1).unwrap().is_none(),
        "cold messages are not copied into the target's hot tier"
    );
    assert!(target.message(ConversationId(conv), 60).unwrap().is_some());
    let mut m = messaging(&d.edge).await;
    assert_eq!(history_via_edge(&mut m, &token(1, 10), conv).await, before);
    // A re-send of a request whose message is cold gets its first answer.
    let again = m
        .send(authed(text(conv, "m-3"), &token(1, 10)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.seq, before[3].seq);
    assert_eq!(history_via_edge(&mut m, &token(1, 10), conv).await, before);
}

/// Cells with buckets of their own: the target copies the segments the
/// handed-over manifest names from the source, checked, before it stores
/// the manifest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_between_buckets_copies_the_segments() {
    let d = deploy_with(None, tiered).await;
    let (conv, before) = tiered_conversation(&d).await;
    let routes = d.cluster.client().await;
    let migrator = migrator(&routes);
    migrator
        .migrate_tenant(TenantId(1), TARGET, 4, |_| {})
        .await
        .expect("tenant move succeeds");
    let target_dir = d.cells[1].dir.path().join("cold");
    let copied = std::fs::read_dir(target_dir.join("segments/t1"))
        .map(|conversations| conversations.flatten().count())
        .unwrap_or(0);
    assert_eq!(
        copied, 1,
        "the conversation's segments are in the target's bucket"
    );
    let mut m = messaging(&d.edge).await;
    assert_eq!(history_via_edge(&mut m, &token(1, 10), conv).await, before);
}

/// A conversation moved alone hands its manifest over too, and requests
/// answered within the idempotency TTL keep their answers on the target
/// though their messages are cold (here the target is the source's standby
/// and holds the replicated answers; another target rebuilds them from the
/// recent segments it adopts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_move_keeps_the_answers_of_requests_whose_messages_are_cold() {
    let cold = tempfile::tempdir().unwrap();
    let d = deploy_with(None, sharing(cold.path())).await;
    let (conv, before) = tiered_conversation(&d).await;
    let routes = d.cluster.client().await;
    let migrator = migrator(&routes);
    migrator
        .migrate_conversation(TenantId(1), ConversationId(conv), TARGET, |_| {})
        .await
        .expect("conversation move succeeds");
    assert_eq!(
        d.cells[1]
            .cell
            .service
            .store()
            .segments(ConversationId(conv))
            .unwrap()
            .len(),
        2
    );
    let mut m = messaging(&d.edge).await;
    let again = m
        .send(authed(text(conv, "m-3"), &token(1, 10)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        again.seq, before[3].seq,
        "the first answer, not a new message"
    );
    assert_eq!(history_via_edge(&mut m, &token(1, 10), conv).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_backfill_adopts_the_failed_cells_cold_history() {
    let cold = tempfile::tempdir().unwrap();
    let tune = sharing(cold.path());
    let mut d = deploy_with(None, tune.clone()).await;
    let routes = d.cluster.client().await;
    let cp = fast_control_plane(d.cluster.endpoints()).await;
    let (conv, before) = tiered_conversation(&d).await;
    wait_for_checkpoint(&routes, conv, 60, Duration::from_secs(10)).await;

    let dead_dir = d.cells.remove(0).stop().await;
    let failed_over = eventually(Duration::from_secs(30), || {
        let moved = routes.read(|t| {
            t.resolve(&Key::conversation(TenantId(1), ConversationId(conv)))
                .is_some_and(|r| r.entry.cell == TARGET)
        });
        async move { moved }
    })
    .await;
    assert!(failed_over, "no failover");
    let returned =
        cellmesh_tests::TestCell::start_routed_with(SOURCE, d.cluster.endpoints(), dead_dir, tune)
            .await;
    wait_for_backfill(&cp, SOURCE, Duration::from_secs(30)).await;
    let owner = d.cells[0].cell.service.store();
    assert_eq!(
        owner.segments(ConversationId(conv)).unwrap().len(),
        2,
        "the manifest came over"
    );
    assert!(owner.message(ConversationId(conv), 1).unwrap().is_none());
    let mut m = messaging(&d.edge).await;
    let page = pull_via_edge(&mut m, &token(1, 10), conv).await;
    assert_eq!(page.unavailable_through, 0, "history is complete again");
    assert_eq!(history_via_edge(&mut m, &token(1, 10), conv).await, before);
    drop(returned);
    cp.stop();
}
