//! A cell process that stalls for less than its failover takes: the
//! control plane fences it at its first failed probe (marks it Degraded:
//! it renews no owner lease), lifts the fence once it answers again, and
//! moves nothing; the cell goes on serving its routes. A cell being
//! drained gets Draining back, not Up.

use cellmesh_proto::ids::TenantId;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellmesh_cell::config::ReplicationMode;
use cellmesh_control_plane::server::Event;
use cellmesh_route_client::commands::{assign_tenant, set_cell_status};
use cellmesh_route_client::convert::cell_status_to_pb;
use cellmesh_route_client::table::{CellStatus, Key};
use cellmesh_tests::deploy::*;
use cellmesh_tests::router::RouterCluster;
use cellmesh_tests::{CellProcess, TestCell, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_that_stalls_briefly_is_fenced_then_lifted_and_keeps_its_routes() {
    stall_briefly(CellStatus::Up).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_cell_fenced_briefly_goes_back_to_draining() {
    stall_briefly(CellStatus::Draining).await;
}

/// Stalls a cell marked `status` for 400 ms under a control plane.
async fn stall_briefly(status: CellStatus) {
    let cluster = RouterCluster::start(1, |_| {}).await;
    let routers = cluster.endpoints();
    let dir = tempfile::tempdir().unwrap();
    let config = busy_cell_config(dir.path(), "eu-west/c1", &routers, ReplicationMode::Async);
    let process = CellProcess::start_configured(dir.path(), &config).await;
    let _fallback = TestCell::start_routed("eu-west/c2", routers.clone()).await;
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
    m.send(authed(text(conv, "before"), &alice)).await.unwrap();
    let mark = set_cell_status("eu-west/c1", cell_status_to_pb(status));
    routes.apply(mark).await.unwrap();
    let marked = eventually(Duration::from_secs(5), || {
        let now = routes.read(|t| t.cell("eu-west/c1").map(|c| c.status));
        async move { now == Some(status) }
    })
    .await;
    assert!(marked, "the table shows the cell {status:?}");

    // Every status the table gives the cell, as the route cache sees it.
    let seen = Arc::new(Mutex::new(Vec::<CellStatus>::new()));
    let watcher = tokio::spawn({
        let (routes, seen) = (routes.clone(), seen.clone());
        async move {
            loop {
                let status = routes.read(|t| t.cell("eu-west/c1").map(|c| c.status));
                note(&seen, status);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });
    process.signal(libc::SIGSTOP);
    tokio::time::sleep(Duration::from_millis(400)).await;
    process.signal(libc::SIGCONT);

    let lifted = eventually(Duration::from_secs(10), || {
        let seen = seen.lock().unwrap().clone();
        async move { seen.len() >= 3 && seen.last() == Some(&status) }
    })
    .await;
    watcher.abort();
    let seen = seen.lock().unwrap().clone();
    assert!(lifted, "statuses seen: {seen:?}; events {:?}", cp.events());
    assert_eq!(
        seen[..3],
        [status, CellStatus::Degraded, status],
        "fenced, then lifted"
    );
    assert!(
        !cp.events()
            .iter()
            .any(|e| matches!(e, Event::FailedOver { .. })),
        "{:?}",
        cp.events()
    );
    let owner = routes.read(|t| t.resolve(&Key::tenant(TenantId(1))).map(|r| r.entry.cell));
    assert_eq!(owner.as_deref(), Some("eu-west/c1"));
    let after = m.send(authed(text(conv, "after"), &alice)).await;
    assert!(after.is_ok(), "{after:?}");
}

fn note(seen: &Mutex<Vec<CellStatus>>, status: Option<CellStatus>) {
    let mut seen = seen.lock().unwrap();
    if let Some(s) = status
        && seen.last() != Some(&s)
    {
        seen.push(s);
    }
}
