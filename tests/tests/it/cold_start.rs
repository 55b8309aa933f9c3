//! A control plane that comes up while cells are still starting (a whole
//! deployment started or restarted at once) gives each cell it has not
//! seen serving a startup grace: a cell that opens its storage within it
//! is neither fenced nor failed over, and one that never comes up is
//! failed over once the grace is over.

use std::time::{Duration, Instant};

use cellmesh_control_plane::server::{Event, RunningControlPlane};
use cellmesh_proto::v1::*;
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::table::CellStatus;
use cellmesh_tests::deploy::*;
use cellmesh_tests::eventually;

const OWNER: &str = "eu-west/c1";

/// A control plane over `d`'s routers with a startup grace of `grace`.
async fn control_plane(d: &Deployment, grace: Duration) -> RunningControlPlane {
    let mut config = fast_config(d.cluster.endpoints(), fast_failover());
    config.startup_grace_ms = grace.as_millis() as u64;
    cellmesh_control_plane::server::start(config)
        .await
        .expect("control plane starts")
}

fn failovers(cp: &RunningControlPlane) -> Vec<Event> {
    (cp.events().into_iter())
        .filter(|e| matches!(e, Event::FailedOver { .. }))
        .collect()
}

fn owner_status(routes: &RouteClient) -> Option<CellStatus> {
    routes.read(|t| t.cell(OWNER).map(|c| c.status))
}

/// Sends "after" to `conv` as user 10 until a cell takes it (at most 40 s
/// after `started`).
async fn send_again(
    m: &mut messaging_client::MessagingClient<tonic::transport::Channel>,
    conv: u64,
    started: Instant,
) -> SendResponse {
    loop {
        match m.send(authed(text(conv, "after"), &token(1, 10))).await {
            Ok(r) => return r.into_inner(),
            Err(e) => assert!(
                started.elapsed() < Duration::from_secs(40),
                "no cell took the send: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_still_starting_when_the_control_plane_comes_up_keeps_its_routes() {
    let mut d = deploy(None).await;
    let routes = d.cluster.client().await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    let first = m.send(authed(text(conv, "before"), &alice)).await.unwrap();
    assert_eq!(first.into_inner().seq, 1);
    // The standby holds the owner's mark: a failover could be planned.
    wait_for_checkpoint(&routes, conv, 1, Duration::from_secs(10)).await;
    // The owner is down when the control plane starts, for longer than
    // its probes and owner lease take to fail a cell over (2.5 s here).
    let dir = d.cells.remove(0).stop().await;
    let started = Instant::now();
    let cp = control_plane(&d, Duration::from_secs(6)).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let early = failovers(&cp);
    assert!(early.is_empty(), "failed over while starting: {early:?}");
    assert_eq!(
        owner_status(&routes),
        Some(CellStatus::Up),
        "fenced while starting"
    );

    // It comes up within the grace: it keeps its routes and seqs go on.
    let back = cellmesh_tests::TestCell::start_routed_in(OWNER, d.cluster.endpoints(), dir).await;
    let after = send_again(&mut m, conv, started).await;
    assert_eq!(after.seq, 2, "no floor jumped: the route never moved");
    // Past the grace, with the cell serving, nothing is failed over late.
    tokio::time::sleep(Duration::from_secs(8).saturating_sub(started.elapsed())).await;
    let page = pull_via_edge(&mut m, &alice, conv).await;
    assert_eq!((page.unavailable_through, page.messages.len()), (0, 2));
    let late = failovers(&cp);
    assert!(late.is_empty(), "failed over after the grace: {late:?}");
    assert_eq!(owner_status(&routes), Some(CellStatus::Up));
    drop(back);
    cp.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_that_never_starts_is_failed_over_once_the_grace_is_over() {
    let mut d = deploy(None).await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    m.send(authed(text(conv, "before"), &alice)).await.unwrap();
    // The standby holds the owner's mark: a failover can be planned.
    let routes = d.cluster.client().await;
    wait_for_checkpoint(&routes, conv, 1, Duration::from_secs(10)).await;
    let _dir = d.cells.remove(0).stop().await;
    let grace = Duration::from_secs(4);
    let started = Instant::now();
    let cp = control_plane(&d, grace).await;
    let failed_over = eventually(Duration::from_secs(30), || {
        let done = !failovers(&cp).is_empty();
        async move { done }
    })
    .await;
    let at = started.elapsed();
    assert!(failed_over, "never failed over: {:?}", cp.events());
    assert!(
        at >= grace,
        "failed over {at:?} after the start, within the grace"
    );
    assert!(
        matches!(&failovers(&cp)[0], Event::FailedOver { cell, fallback, .. }
            if cell == OWNER && fallback == "us-east/c1"),
        "{:?}",
        cp.events()
    );
    // Sends go on above the floor on the fallback.
    let after = send_again(&mut m, conv, started).await;
    assert_eq!(after.seq, floor_of(&routes, conv).await + 1);
    let page: PullResponse = pull_via_edge(&mut m, &alice, conv).await;
    assert!(page.unavailable_through > 0, "{page:?}");
    cp.stop();
}
