//! Users homed in another cell: their events travel over DeliverBatch to
//! their home cell, arrive there in order with the message, are applied
//! once, and wait durably while the home cell is down.

use cellmesh_proto::ids::{TenantId, UserId};
use std::sync::Arc;
use std::time::Duration;

use cellmesh_cell::clock::SystemClock;
use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
use cellmesh_proto::v1::*;
use cellmesh_tests::sync::*;
use cellmesh_tests::*;

const T: u64 = 31;
const WAIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn remote_members_get_their_events_through_their_home_cell() {
    let home = TestCell::start().await;
    let home_endpoint = home.endpoint.clone();
    let home_addr = home.cell.addr;
    let origin = TestCell::start_with(
        |c| {
            c.homes
                .remote
                .insert(format!("{T}/3"), home_endpoint.clone());
        },
        Arc::new(SystemClock),
    )
    .await;
    let mut c = origin.client().await;
    let conv = create_group(&mut c, T, 1, &[2, 3]).await;

    let mut at_home = connect_sync(&home.endpoint).await;
    let mut remote_device = subscribe(&mut at_home, T, 3, "phone", 0).await;
    let mut at_origin = connect_sync(&origin.endpoint).await;
    let mut local_device = subscribe(&mut at_origin, T, 2, "phone", 0).await;
    for i in 1..=5 {
        c.send(text(T, 1, conv, &format!("h{i}"), &format!("hello {i}")))
            .await
            .unwrap();
    }
    let remote = messages(&mut remote_device, 5, WAIT).await;
    assert_eq!(message_seqs(&remote), vec![1, 2, 3, 4, 5]);
    let bodies: Vec<_> = remote
        .iter()
        .filter_map(|e| e.message.as_ref())
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect();
    assert_eq!(
        bodies,
        (1..=5).map(|i| format!("hello {i}")).collect::<Vec<_>>()
    );
    messages(&mut local_device, 5, WAIT).await;
    // The home cell keeps nothing for user 3 at the origin.
    assert!(
        origin
            .cell
            .service
            .store()
            .sync_after(cellmesh_cell::UserKey::new(TenantId(T), UserId(3)), 0, 10)
            .unwrap()
            .is_empty()
    );

    // The same batch delivered again by the same cell applies nothing.
    let mut peer = CellPeerClient::connect(home.endpoint.clone())
        .await
        .unwrap();
    let replay = DeliverBatchRequest {
        source_cell: cellmesh_cell::CellConfig::default().cell_id,
        events: vec![PeerEvent {
            tenant_id: T,
            user_id: 3,
            event_id: 1,
            kind: SyncEventKind::Message as i32,
            conversation_id: conv,
            seq: 1,
            ..Default::default()
        }],
        route_index: 0,
    };
    assert_eq!(
        peer.deliver_batch(replay)
            .await
            .unwrap()
            .into_inner()
            .applied,
        0
    );
    drop(remote_device);

    // The home cell goes down; the origin keeps serving its own users.
    let home_dir = home.stop().await;
    for i in 6..=8 {
        c.send(text(T, 1, conv, &format!("h{i}"), &format!("hello {i}")))
            .await
            .unwrap();
    }
    assert_eq!(
        message_seqs(&messages(&mut local_device, 3, WAIT).await),
        vec![6, 7, 8]
    );

    // Back on the same address: the queued events arrive, in order, once.
    let mut config = test_config(home_dir.path());
    config.listen = home_addr;
    let home = cellmesh_cell::start(
        config,
        Arc::new(cellmesh_cell::ownership::OwnAll),
        Arc::new(SystemClock),
    )
    .await
    .expect("home cell restarts on its address");
    let mut at_home = connect_sync(&home_endpoint).await;
    let mut remote_device = subscribe(&mut at_home, T, 3, "phone", 0).await;
    let all = messages(&mut remote_device, 8, Duration::from_secs(60)).await;
    assert_eq!(message_seqs(&all), (1..=8).collect::<Vec<_>>());
    assert!(
        next_push(&mut remote_device, Duration::from_millis(300))
            .await
            .is_none()
    );
    home.shutdown().await.unwrap();
    origin.stop().await;
}

#[tokio::test]
async fn a_dead_home_with_a_long_backlog_does_not_hold_back_other_homes() {
    let home = TestCell::start().await;
    let home_endpoint = home.endpoint.clone();
    // User 3's home never answers (nothing listens on port 1).
    let origin = TestCell::start_with(
        |c| {
            c.homes
                .remote
                .insert(format!("{T}/3"), "http://127.0.0.1:1".into());
            c.homes
                .remote
                .insert(format!("{T}/4"), home_endpoint.clone());
        },
        Arc::new(SystemClock),
    )
    .await;
    let mut c = origin.client().await;
    let to_dead = create_group(&mut c, T, 1, &[3]).await;
    // More queued records for the dead home than the forwarder reads at
    // once. Sends the processor takes in one batch share a record, so send
    // until the queue holds enough of them.
    let queued = || {
        origin
            .cell
            .service
            .store()
            .forwards(cellmesh_cell::storage::ForwardQueue::Homes, 0, 1000)
            .unwrap()
            .len()
    };
    let mut sent = 0;
    while queued() <= 256 && sent < 5_000 {
        for _ in 0..50 {
            c.send(text(T, 1, to_dead, &format!("d{sent}"), "to nowhere"))
                .await
                .unwrap();
            sent += 1;
        }
    }
    let backlog = queued();
    assert!(
        backlog > 256,
        "only {backlog} records queued after {sent} sends"
    );

    let to_live = create_group(&mut c, T, 1, &[4]).await;
    let mut at_home = connect_sync(&home.endpoint).await;
    let mut device = subscribe(&mut at_home, T, 4, "phone", 0).await;
    c.send(text(T, 1, to_live, "l1", "hello")).await.unwrap();
    let got = messages(&mut device, 1, WAIT).await;
    assert_eq!(got[0].conversation_id, to_live);
    home.stop().await;
    origin.stop().await;
}
