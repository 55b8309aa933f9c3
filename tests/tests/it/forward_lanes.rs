//! A cell ships two kinds of traffic to other cells after the ack: its
//! users' events to their home cells, and copies (conversation meta, send
//! answers) to its standbys. A standby that is slow to answer — another
//! region, a busy disk — must not hold up the pushes of members homed
//! elsewhere: each kind has its own queue and forwarder.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::time::{Duration, Instant};

use cellmesh_proto::v1::sync_client::SyncClient;
use cellmesh_proto::v1::{SubscribeRequest, sync_push};
use cellmesh_tests::TestCell;
use cellmesh_tests::deploy::*;
use cellmesh_tests::sync::next_push;

/// A conversation of user 10 with member 11 that lives on us-east/c1 while
/// their homes stay on eu-west/c1, so every push crosses to the home cell
/// by the forwarder; and a device of member 11 streaming through `edge`.
async fn far_conversation(
    routes: &cellmesh_route_client::client::RouteClient,
    edge: &cellmesh_edge::RunningEdge,
    m: &mut cellmesh_proto::v1::messaging_client::MessagingClient<tonic::transport::Channel>,
    alice: &str,
) -> (u64, tonic::Streaming<cellmesh_proto::v1::SyncPush>) {
    let conv = create_via_edge(m, alice, vec![11]).await;
    migrator(routes)
        .migrate_conversation(TenantId(1), ConversationId(conv), "us-east/c1", |_| {})
        .await
        .expect("the move finishes");
    let channel = tonic::transport::Channel::from_shared(edge.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let device = SyncClient::new(channel)
        .subscribe(authed(SubscribeRequest::default(), &token(1, 11)))
        .await
        .expect("subscribe through the edge")
        .into_inner();
    (conv, device)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_standby_does_not_delay_pushes_to_members_homed_elsewhere() {
    let d = deploy(None).await;
    let routes = d.cluster.client().await;
    // us-east/c1's standby in its region; eu-west/c1 is its other one.
    let standby = TestCell::start_routed("us-east/c2", d.cluster.endpoints()).await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let (conv, mut device) = far_conversation(&routes, &d.edge, &mut m, &alice).await;
    // Every write of the standby now takes a second.
    std::fs::write(
        standby.dir.path().join("failpoints"),
        "storage.slow_write=delay(1000ms)",
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut slowest = Duration::ZERO;
    for i in 0..8 {
        let tag = format!("lane-{i}");
        let sent = Instant::now();
        m.send(authed(text(conv, &tag), &alice)).await.unwrap();
        loop {
            let push = next_push(&mut device, Duration::from_secs(10))
                .await
                .expect("the member's push arrives");
            if let Some(sync_push::Push::Event(e)) = push.push
                && e.message.as_ref().is_some_and(|m| m.body == tag.as_bytes())
            {
                break;
            }
        }
        slowest = slowest.max(sent.elapsed());
    }
    // A forwarder waiting on the standby would take over a second.
    assert!(
        slowest < Duration::from_millis(700),
        "slowest send -> push {slowest:?}"
    );
    std::fs::write(standby.dir.path().join("failpoints"), "").unwrap();
}

/// A far home cell: each user event crosses a link with this one-way delay.
const ONE_WAY: Duration = Duration::from_millis(250);

/// Users' events ride an ordered stream to their home cell: an event queued
/// while the one before it is on its way goes out at once instead of
/// waiting for that one's answer, a full round trip later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_for_a_far_home_go_out_without_waiting_for_each_others_answers() {
    let cluster = cellmesh_tests::router::RouterCluster::start(1, |_| {}).await;
    let routers = cluster.endpoints();
    let home = TestCell::start_routed("eu-west/c1", routers.clone()).await;
    let far =
        cellmesh_chaos::proxy::FaultProxy::start("127.0.0.1:0".parse().unwrap(), home.cell.addr)
            .await
            .unwrap();
    far.set_latency(ONE_WAY, Duration::ZERO);
    let link = format!("http://{}", far.addr());
    let home_endpoint = home.endpoint.clone();
    let _owner = TestCell::start_routed_with(
        "us-east/c1",
        routers.clone(),
        tempfile::tempdir().unwrap(),
        |c| {
            c.routing.links.insert(home_endpoint, link);
        },
    )
    .await;
    let routes = cluster.client().await;
    routes
        .apply(cellmesh_route_client::commands::assign_tenant(
            TenantId(1),
            "eu-west/c1",
            0,
        ))
        .await
        .unwrap();
    let edge = start_edge(routers).await;
    let alice = token(1, 10);
    let mut m = messaging(&edge).await;
    let (conv, mut device) = far_conversation(&routes, &edge, &mut m, &alice).await;

    // Six sends back to back (each acked by the owner, near the sender).
    let mut sent = std::collections::HashMap::new();
    for i in 0..6 {
        let tag = format!("far-{i}");
        sent.insert(tag.clone(), Instant::now());
        m.send(authed(text(conv, &tag), &alice)).await.unwrap();
    }
    let (mut slowest, mut order) = (Duration::ZERO, Vec::new());
    while order.len() < 6 {
        let push = next_push(&mut device, Duration::from_secs(10))
            .await
            .expect("the member's push arrives");
        if let Some(sync_push::Push::Event(e)) = push.push
            && let Some(at) = e
                .message
                .as_ref()
                .and_then(|m| sent.get(std::str::from_utf8(&m.body).unwrap_or_default()))
        {
            slowest = slowest.max(at.elapsed());
            order.push(String::from_utf8_lossy(&e.message.unwrap().body).to_string());
        }
    }
    let expected: Vec<String> = (0..6).map(|i| format!("far-{i}")).collect();
    assert_eq!(order, expected, "pushed once each, in order");
    // Waiting for the answer before the next delivery would take one way
    // there, one back, and one way again: three times ONE_WAY at least.
    assert!(
        slowest < ONE_WAY * 9 / 5,
        "slowest send -> push {slowest:?} (one way {ONE_WAY:?})"
    );
}
