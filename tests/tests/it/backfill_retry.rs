//! A backfill copy the conversation's owner cannot take at first is tried
//! again: the history the returned cell brings is nowhere else.

use cellmesh_control_plane::server::Event;
use cellmesh_tests::deploy::{pull_via_edge, wait_for_backfill, wait_for_checkpoint};
use cellmesh_tests::{TestCell, eventually};
use std::time::Duration;

use crate::exactly_once::{fail_first_cell, failover_deployment_with, send_before};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_the_owner_refuses_at_first_is_tried_again() {
    let (mut d, routes, cp, alice, mut m, conversation) = failover_deployment_with(|_| {}).await;
    let acked = send_before(&mut m, &alice, conversation, 5).await;
    let last = acked.last().unwrap().seq;
    wait_for_checkpoint(&routes, conversation, last, Duration::from_secs(10)).await;
    let data = fail_first_cell(&mut d, conversation).await;
    let unavailable = pull_via_edge(&mut m, &alice, conversation).await;
    assert!(unavailable.unavailable_through > 0, "{unavailable:?}");

    // The owner refuses backfill copies while the failed cell returns.
    let refusing = cellmesh_cell::failpoints::parse("backfill.copy=error").unwrap();
    let owner = d.cells[0].cell.service.store().clone();
    owner.failpoints().set(refusing);
    let _back = TestCell::start_routed_in("eu-west/c1", d.cluster.endpoints(), data).await;
    let recovered = eventually(Duration::from_secs(30), || {
        let seen = (cp.events().iter())
            .any(|e| matches!(e, Event::Recovered { cell } if cell == "eu-west/c1"));
        async move { seen }
    })
    .await;
    assert!(recovered, "{:?}", cp.events());
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    owner.failpoints().set(Vec::new());

    wait_for_backfill(&cp, "eu-west/c1", Duration::from_secs(30)).await;
    let whole = pull_via_edge(&mut m, &alice, conversation).await;
    assert_eq!(whole.unavailable_through, 0, "{whole:?}");
    cp.stop();
}
