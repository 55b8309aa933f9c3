//! Presence, typing notices and notifications for offline users.

use cellmesh_proto::ids::{TenantId, UserId};
use cellmesh_proto::reason::Reason;
use std::sync::Arc;
use std::time::Duration;

use cellmesh_cell::clock::SystemClock;
use cellmesh_proto::v1::*;
use cellmesh_tests::sync::*;
use cellmesh_tests::*;

const T: u64 = 41;

#[tokio::test]
async fn presence_and_typing_reach_only_online_members() {
    let cell = TestCell::start().await;
    let mut c = cell.client().await;
    let mut s = connect_sync(&cell.endpoint).await;
    let conv = create_group(&mut c, T, 1, &[2, 3]).await;

    let hb = s
        .heartbeat(HeartbeatRequest {
            caller: device(T, 1, "laptop"),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(hb.interval_ms > 0);
    let mut two = subscribe(&mut s, T, 2, "phone", 0).await;
    // The processor writes user 2's Joined event asynchronously; wait for it
    // so the queue below is complete before typing is signalled.
    loop {
        let push = next_push(&mut two, Duration::from_secs(10))
            .await
            .expect("the joined event");
        if let Some(sync_push::Push::Event(e)) = push.push
            && e.kind == SyncEventKind::Joined as i32
        {
            break;
        }
    }
    let presence = s
        .get_presence(GetPresenceRequest {
            caller: caller(T, 1),
            user_ids: vec![1, 2, 3],
        })
        .await
        .unwrap()
        .into_inner();
    let online: Vec<bool> = presence.users.iter().map(|u| u.online).collect();
    assert_eq!(online, vec![true, true, false]);

    s.typing(TypingRequest {
        caller: caller(T, 1),
        conversation_id: conv,
    })
    .await
    .unwrap();
    let typing = loop {
        let push = next_push(&mut two, Duration::from_secs(10))
            .await
            .expect("a push");
        if let Some(sync_push::Push::Typing(t)) = push.push {
            break t;
        }
    };
    assert_eq!((typing.conversation_id, typing.user_id), (conv, 1));
    // Typing is never stored: it is not in anyone's sync queue.
    let store = cell.cell.service.store();
    let kinds: Vec<i32> = store
        .sync_after(cellmesh_cell::UserKey::new(TenantId(T), UserId(2)), 0, 100)
        .unwrap()
        .iter()
        .map(|(_, r)| r.kind)
        .collect();
    assert_eq!(kinds, vec![SyncEventKind::Joined as i32]);
    // Only members may signal typing.
    assert!(
        s.typing(TypingRequest {
            caller: caller(T, 9),
            conversation_id: conv
        })
        .await
        .is_err()
    );
    cell.stop().await;
}

#[tokio::test]
async fn offline_members_are_notified_through_the_webhook_with_retries() {
    let (url, mut bodies) = cellmesh_tests::http::webhook(1).await;
    let cell = TestCell::start_with(
        |c| c.notifications.webhook_url = Some(url),
        Arc::new(SystemClock),
    )
    .await;
    let mut c = cell.client().await;
    let mut s = connect_sync(&cell.endpoint).await;
    let conv = create_group(&mut c, T, 1, &[2, 3]).await;
    // User 2 is online; user 3 is not; user 1 sends.
    let mut two = subscribe(&mut s, T, 2, "phone", 0).await;
    // The processor writes user 2's Joined event asynchronously; wait for it
    // so the queue below is complete before typing is signalled.
    loop {
        let push = next_push(&mut two, Duration::from_secs(10))
            .await
            .expect("the joined event");
        if let Some(sync_push::Push::Event(e)) = push.push
            && e.kind == SyncEventKind::Joined as i32
        {
            break;
        }
    }
    c.send(text(T, 1, conv, "n1", "ping")).await.unwrap();
    messages(&mut two, 1, Duration::from_secs(10)).await;

    let mut seen = Vec::new();
    while seen.len() < 2 {
        let body = tokio::time::timeout(Duration::from_secs(20), bodies.recv())
            .await
            .expect("webhook called")
            .unwrap();
        seen.push(serde_json::from_str::<serde_json::Value>(&body).unwrap());
    }
    assert_eq!(seen[0], seen[1], "the failed delivery is retried");
    assert_eq!(seen[0]["user_id"], 3, "only the offline member");
    assert_eq!(seen[0]["conversation_id"], conv);
    assert_eq!(seen[0]["sender_id"], 1);
    let store = cell.cell.service.store().clone();
    assert!(
        eventually(Duration::from_secs(10), || {
            let store = store.clone();
            async move { store.notifications(0, 10).unwrap().is_empty() }
        })
        .await
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(500), bodies.recv())
            .await
            .is_err(),
        "delivered once accepted"
    );
    cell.stop().await;
}

/// A device streams once: a new stream of it ends the older with
/// `STREAM_SUPERSEDED` (the device does not reconnect from a dead
/// connection's place). A user streams from at most
/// `sync.max_streams_per_user` devices: another is `RATE_LIMITED` /
/// `TOO_MANY_STREAMS` until one of them goes.
#[tokio::test]
async fn a_device_streams_once_and_a_user_from_so_many_devices() {
    use cellmesh_proto::status::{error_code, error_detail};
    let cell =
        TestCell::start_with(|c| c.sync.max_streams_per_user = 2, Arc::new(SystemClock)).await;
    let mut s = connect_sync(&cell.endpoint).await;
    let mut phone = subscribe(&mut s, T, 1, "phone", 0).await;
    let laptop = subscribe(&mut s, T, 1, "laptop", 0).await;
    let tablet = || SubscribeRequest {
        caller: device(T, 1, "tablet"),
        from_pts: 0,
        queue_id: 0,
    };
    let e = s.subscribe(tablet()).await.unwrap_err();
    assert_eq!(
        (error_code(&e), error_detail(&e).reason.as_str()),
        (ErrorCode::RateLimited, Reason::TooManyStreams.as_str())
    );
    // Another user has their own streams.
    let _other = subscribe(&mut s, T, 2, "tablet", 0).await;
    // The phone again: its older stream ends.
    let _phone = subscribe(&mut s, T, 1, "phone", 0).await;
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match phone.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return None,
                Err(status) => return Some(status),
            }
        }
    })
    .await
    .expect("the older stream ends")
    .expect("with a status");
    assert_eq!(
        error_detail(&ended).reason,
        Reason::StreamSuperseded.as_str(),
        "{ended:?}"
    );
    // A device that goes frees its place.
    drop(laptop);
    assert!(
        eventually(Duration::from_secs(10), || {
            let mut s = s.clone();
            async move { s.subscribe(tablet()).await.is_ok() }
        })
        .await,
        "the tablet streams once the laptop went"
    );
}
