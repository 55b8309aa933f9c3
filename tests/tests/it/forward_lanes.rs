//! A cell ships two kinds of traffic to other cells after the ack: its
//! users' events to their home cells, and copies (conversation meta, send
//! answers) to its standbys. A standby that is slow to answer — another
//! region, a busy disk — must not hold up the pushes of members homed
//! elsewhere: each kind has its own queue and forwarder.

use std::time::{Duration, Instant};

use cellmesh_proto::v1::sync_client::SyncClient;
use cellmesh_proto::v1::{SubscribeRequest, sync_push};
use cellmesh_tests::TestCell;
use cellmesh_tests::deploy::*;
use cellmesh_tests::sync::next_push;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_standby_does_not_delay_pushes_to_members_homed_elsewhere() {
    let d = deploy(None).await;
    let routes = d.cluster.client().await;
    // us-east/c1's standby in its region; eu-west/c1 is its other one.
    let standby = TestCell::start_routed("us-east/c2", d.cluster.endpoints()).await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    // The conversation lives in us-east while its members' homes stay on
    // eu-west/c1: every push crosses to the home cell by the forwarder.
    migrator(&routes)
        .migrate_conversation(1, conv, "us-east/c1", |_| {})
        .await
        .expect("the move finishes");
    let channel = tonic::transport::Channel::from_shared(d.edge.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut device = SyncClient::new(channel)
        .subscribe(authed(SubscribeRequest::default(), &token(1, 11)))
        .await
        .expect("subscribe through the edge")
        .into_inner();
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
