//! A backfill the cells cannot serve at first is tried again: a copy the
//! conversation's owner refuses, or a returned cell that does not list its
//! tenants' conversations yet. One the control plane gave up on is run
//! again by the operator (`ctl backfill`). The history the returned cell
//! brings is nowhere else.

use cellmesh_control_plane::server::{Event, RunningControlPlane};
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_tests::deploy::{pull_via_edge, stored, wait_for_backfill, wait_for_checkpoint};
use cellmesh_tests::router::SECRET;
use cellmesh_tests::{TestCell, eventually};
use std::time::Duration;

use crate::exactly_once::{
    FailoverDeployment, fail_first_cell, failover_deployment_with, send_before,
};

const FAILED: &str = "eu-west/c1";

/// A deployment whose first cell acknowledged five messages of the
/// conversation and failed over: the deployment, and the failed cell's
/// data directory.
async fn failed_over() -> (FailoverDeployment, tempfile::TempDir) {
    let (mut d, routes, cp, alice, mut m, conversation) = failover_deployment_with(|_| {}).await;
    let acked = send_before(&mut m, &alice, conversation, 5).await;
    let last = acked.last().unwrap().seq;
    wait_for_checkpoint(&routes, conversation, last, Duration::from_secs(10)).await;
    let data = fail_first_cell(&mut d, conversation).await;
    let unavailable = pull_via_edge(&mut m, &alice, conversation).await;
    assert!(unavailable.unavailable_through > 0, "{unavailable:?}");
    ((d, routes, cp, alice, m, conversation), data)
}

/// Waits until the control plane has found the failed cell back.
async fn recovered(cp: &RunningControlPlane) {
    let recovered = eventually(Duration::from_secs(30), || {
        let seen =
            (cp.events().iter()).any(|e| matches!(e, Event::Recovered { cell } if cell == FAILED));
        async move { seen }
    })
    .await;
    assert!(recovered, "{:?}", cp.events());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_the_owner_refuses_at_first_is_tried_again() {
    let ((d, _routes, cp, alice, mut m, conversation), data) = failed_over().await;
    // The owner refuses backfill copies while the failed cell returns.
    let refusing = cellmesh_cell::failpoints::parse("backfill.copy=error").unwrap();
    let owner = d.cells[0].cell.service.store().clone();
    owner.failpoints().set(refusing);
    let _back = TestCell::start_routed_in(FAILED, d.cluster.endpoints(), data).await;
    recovered(&cp).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    owner.failpoints().set(Vec::new());

    wait_for_backfill(&cp, FAILED, Duration::from_secs(30)).await;
    let whole = pull_via_edge(&mut m, &alice, conversation).await;
    assert_eq!(whole.unavailable_through, 0, "{whole:?}");
    cp.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returned_cell_that_cannot_list_its_conversations_at_first_is_asked_again() {
    let ((d, _routes, cp, alice, mut m, conversation), data) = failed_over().await;
    // The returned cell fails to list its tenants' conversations at first.
    let points = data.path().join("failpoints");
    std::fs::write(&points, "tenant.list=error\n").unwrap();
    let back = TestCell::start_routed_in(FAILED, d.cluster.endpoints(), data).await;
    recovered(&cp).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    std::fs::write(&points, "").unwrap();

    wait_for_backfill(&cp, FAILED, Duration::from_secs(30)).await;
    let whole = pull_via_edge(&mut m, &alice, conversation).await;
    assert_eq!(whole.unavailable_through, 0, "{whole:?}");
    let gave_up = cp
        .events()
        .iter()
        .any(|e| matches!(e, Event::Backfilled { done, .. } if done.abandoned() > 0));
    assert!(!gave_up, "{:?}", cp.events());
    let metrics = cellmesh_telemetry::registry::encode();
    assert!(
        metrics.contains("cellmesh_backfilled_conversations_total 1\n")
            && metrics.contains("cellmesh_backfill_abandoned_total 0\n"),
        "{metrics}"
    );
    drop(back);
    cp.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_the_control_plane_gave_up_on_is_run_again_from_ctl() {
    let ((d, routes, cp, alice, mut m, conversation), data) = failed_over().await;
    // Nothing to copy from while the cell is away.
    let secret = ClusterSecret::new(SECRET);
    let away = cellmesh_client::ctl::backfill::run(&routes, &secret, FAILED).await;
    assert!(away.unwrap_err().to_string().contains("is Down"));
    // The owner refuses every backfill copy until told otherwise.
    let refusing = cellmesh_cell::failpoints::parse("backfill.copy=error").unwrap();
    let owner = d.cells[0].cell.service.store().clone();
    owner.failpoints().set(refusing);
    let _back = TestCell::start_routed_in(FAILED, d.cluster.endpoints(), data).await;
    recovered(&cp).await;
    let gave_up = eventually(Duration::from_secs(60), || {
        let gave_up = (cp.events().iter()).any(
            |e| matches!(e, Event::Backfilled { cell, done } if cell == FAILED && done.failed == 1),
        );
        async move { gave_up }
    })
    .await;
    assert!(gave_up, "{:?}", cp.events());
    let still = pull_via_edge(&mut m, &alice, conversation).await;
    assert!(still.unavailable_through > 0, "{still:?}");

    // The cause is gone; the operator runs it again, twice.
    owner.failpoints().set(Vec::new());
    let done = cellmesh_client::ctl::backfill::run(&routes, &secret, FAILED)
        .await
        .unwrap();
    assert_eq!((done.conversations, done.abandoned()), (1, 0), "{done:?}");
    assert_eq!(done.messages, 5, "{done:?}");
    let whole = pull_via_edge(&mut m, &alice, conversation).await;
    assert_eq!(whole.unavailable_through, 0, "{whole:?}");
    let again = cellmesh_client::ctl::backfill::run(&routes, &secret, FAILED)
        .await
        .unwrap();
    assert_eq!(again.abandoned(), 0, "{again:?}");
    let after = pull_via_edge(&mut m, &alice, conversation).await;
    assert_eq!(stored(&after.messages), stored(&whole.messages));
    let tags: Vec<_> = (stored(&after.messages).into_iter())
        .map(|s| s.tag)
        .filter(|t| t.starts_with("before-"))
        .collect();
    let acked: Vec<_> = (0..5).map(|i| format!("before-{i}")).collect();
    assert_eq!(tags, acked, "the history once, in order");

    // A cell that is not registered is refused.
    let unknown = cellmesh_client::ctl::backfill::run(&routes, &secret, "nowhere/c9").await;
    assert!(unknown.unwrap_err().to_string().contains("no cell"));
    cp.stop();
}
