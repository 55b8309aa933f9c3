//! Failover holds: a cell restarted on purpose under a hold is neither
//! fenced nor failed over however long it is away, and comes back owning
//! what it owned, its seqs going on where they stopped; a hold released
//! while the cell is still away lets the failover happen at once; bad
//! holds are refused with stable reasons. Holds are placed, listed and
//! released with `cellmesh ctl hold`.

use std::time::Duration;

use cellmesh_control_plane::failover::holds;
use cellmesh_proto::ids::{ConversationId, TenantId};
use cellmesh_proto::reason::Reason;
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_route_client::table::{CellStatus, Key};
use cellmesh_tests::deploy::*;
use cellmesh_tests::eventually;
use cellmesh_tests::router::SECRET;

/// Longer than the fast control plane takes to fail a dead cell over
/// (three 100 ms probes, then its 2 s owner lease and a tenth).
const PAST_A_FAILOVER: Duration = Duration::from_secs(4);

fn owner(routes: &cellmesh_route_client::client::RouteClient, conv: u64) -> String {
    routes.read(|t| {
        t.resolve(&Key::conversation(TenantId(1), ConversationId(conv)))
            .map(|r| r.entry.cell.clone())
            .unwrap_or_default()
    })
}

fn status(routes: &cellmesh_route_client::client::RouteClient, cell: &str) -> Option<CellStatus> {
    routes.read(|t| t.cell(cell).map(|c| c.status))
}

/// A deployment with tenant 1 on eu-west/c1, the fast control plane and
/// its admin API, and a conversation of users 10 and 11 through the edge
/// with five messages, checkpointed at its standbys (so a failover has
/// somewhere to move it).
struct Held {
    d: Deployment,
    routes: cellmesh_route_client::client::RouteClient,
    cp: cellmesh_control_plane::server::RunningControlPlane,
    admin: Vec<String>,
    secret: ClusterSecret,
    alice: String,
    m: cellmesh_proto::v1::messaging_client::MessagingClient<tonic::transport::Channel>,
    conv: u64,
    /// The seq of its last message.
    last: u64,
}

async fn held() -> Held {
    let d = deploy(None).await;
    let routes = d.cluster.client().await;
    let cp = fast_control_plane(d.cluster.endpoints()).await;
    let admin = vec![format!("http://{}", cp.admin.expect("admin API"))];
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    let mut last = 0;
    for i in 0..5 {
        let sent = m.send(authed(text(conv, &format!("before-{i}")), &alice));
        last = sent.await.unwrap().into_inner().seq;
    }
    wait_for_checkpoint(&routes, conv, last, Duration::from_secs(10)).await;
    Held {
        d,
        routes,
        cp,
        admin,
        secret: ClusterSecret::new(SECRET),
        alice,
        m,
        conv,
        last,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_cell_restarts_without_a_failover_and_goes_on_where_it_stopped() {
    let Held {
        mut d,
        routes,
        cp,
        admin,
        secret,
        alice,
        mut m,
        conv,
        last,
    } = held().await;

    // Bad holds first: an unknown cell, and one longer than an hour.
    let refused = holds::request(&admin, &secret, "nowhere/c9", Duration::from_secs(60), "")
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert_eq!(reason_of(&refused), Some(Reason::UnknownCell));
    let hour_and_a_second = Duration::from_secs(3601);
    let refused = holds::request(&admin, &secret, "eu-west/c1", hour_and_a_second, "")
        .await
        .unwrap_err();
    assert_eq!(reason_of(&refused), Some(Reason::HoldTooLong));

    let held = ctl_hold(
        &admin,
        &["eu-west/c1", "--for", "60s", "--reason", "upgrade"],
    );
    assert!(held.starts_with("eu-west/c1: failover held for "), "{held}");
    assert!(held.trim_end().ends_with(" s more (upgrade)"), "{held}");

    let dir = d.cells.remove(0).stop().await;
    tokio::time::sleep(PAST_A_FAILOVER).await;
    assert_eq!(owner(&routes, conv), "eu-west/c1", "moved while held");
    assert_eq!(
        status(&routes, "eu-west/c1"),
        Some(CellStatus::Up),
        "fenced while held"
    );

    let back =
        cellmesh_tests::TestCell::start_routed_in("eu-west/c1", d.cluster.endpoints(), dir).await;
    let restarted = std::time::Instant::now();
    let after = loop {
        match m.send(authed(text(conv, "after"), &alice)).await {
            Ok(r) => break r.into_inner(),
            Err(e) => assert!(
                e.code() == tonic::Code::Unavailable
                    && restarted.elapsed() < Duration::from_secs(30),
                "not a retryable refusal while the cell restarts, or for too long: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        after.seq,
        last + 1,
        "no floor jump: the cell kept its route"
    );
    assert!(ctl_hold(&admin, &[]).starts_with("eu-west/c1: failover held"));
    assert_eq!(
        ctl_hold(&admin, &["eu-west/c1", "--release"]),
        "no failover holds\n"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(owner(&routes, conv), "eu-west/c1");
    assert_eq!(status(&routes, "eu-west/c1"), Some(CellStatus::Up));
    let failed_over = cp
        .events()
        .into_iter()
        .any(|e| matches!(e, cellmesh_control_plane::server::Event::FailedOver { .. }));
    assert!(!failed_over, "{:?}", cp.events());
    drop(back);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_hold_lets_a_cell_still_away_fail_over() {
    let Held {
        mut d,
        routes,
        cp: _cp,
        admin,
        secret,
        conv,
        ..
    } = held().await;
    holds::request(&admin, &secret, "eu-west/c1", Duration::from_secs(60), "")
        .await
        .unwrap();
    let _dir = d.cells.remove(0).stop().await;
    tokio::time::sleep(PAST_A_FAILOVER).await;
    assert_eq!(owner(&routes, conv), "eu-west/c1", "moved while held");

    holds::request(&admin, &secret, "eu-west/c1", Duration::ZERO, "")
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || {
            let moved = owner(&routes, conv) == "us-east/c1";
            async move { moved }
        })
        .await,
        "not failed over once released"
    );
    assert_eq!(status(&routes, "eu-west/c1"), Some(CellStatus::Down));
}

/// `cellmesh ctl hold ARGS` against the control plane at `admin`: what it
/// printed (it must succeed).
fn ctl_hold(admin: &[String], args: &[&str]) -> String {
    let admin = admin.join(",");
    let base = ["ctl", "--control-plane", &admin, "--secret", SECRET, "hold"];
    String::from_utf8(cellmesh_tests::cellmesh_ok(base.iter().chain(args))).unwrap()
}

fn reason_of(status: &tonic::Status) -> Option<Reason> {
    cellmesh_proto::status::error_detail(status).known_reason()
}
