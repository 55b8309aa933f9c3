//! Tenants sharing a cell, with the same user ids (1..5 in both), through
//! the edge with real tokens: each tenant's users see only their own
//! tenant — sync streams, cursors, lists, mute flags, presence, typing,
//! notifications, read state — another tenant's conversation is answered
//! as one that does not exist, and moving one tenant's user home (and
//! cleaning up after it) leaves the other tenant's user of the same id
//! untouched.

use cellmesh_proto::ids::{TenantId, UserId};
use cellmesh_proto::reason::Reason;
use std::collections::HashSet;
use std::time::Duration;

use cellmesh_cell::UserKey;
use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::sync_client::SyncClient;
use cellmesh_proto::v1::*;
use cellmesh_route_client::commands::assign_tenant;
use cellmesh_tests::deploy::*;
use cellmesh_tests::sync::next_push;
use tonic::Streaming;
use tonic::transport::Channel;

const CELL: &str = "eu-west/c1";
const OTHER_CELL: &str = "us-east/c1";
const WAIT: Duration = Duration::from_secs(10);

struct Clients {
    m: MessagingClient<Channel>,
    s: SyncClient<Channel>,
}

async fn clients(d: &Deployment) -> Clients {
    Clients {
        m: messaging(&d.edge).await,
        s: SyncClient::connect(d.edge.endpoint()).await.unwrap(),
    }
}

/// Tenants 1 and 2 on the same cell, each with a group of its users 1..5
/// created by its user 1; the two conversation ids.
async fn two_tenants(d: &Deployment, c: &mut Clients) -> (u64, u64) {
    let routes = d.cluster.client().await;
    routes
        .apply(assign_tenant(TenantId(2), CELL, 0))
        .await
        .unwrap();
    let one = create_via_edge(&mut c.m, &token(1, 1), vec![2, 3, 4, 5]).await;
    let two = create_via_edge(&mut c.m, &token(2, 1), vec![2, 3, 4, 5]).await;
    (one, two)
}

/// `n` messages tagged `t{tenant}-{i}` from user 1 of each tenant into its
/// conversation.
async fn send_in_each(c: &mut Clients, conversations: [(u64, u64); 2], n: usize) {
    for (tenant, conversation) in conversations {
        for i in 0..n {
            let tag = format!("t{tenant}-{i}");
            c.m.send(authed(text(conversation, &tag), &token(tenant, 1)))
                .await
                .unwrap();
        }
    }
}

async fn subscribe(c: &mut Clients, tenant: u64, user: u64) -> Streaming<SyncPush> {
    let request = SubscribeRequest::default();
    c.s.subscribe(authed(request, &token(tenant, user)))
        .await
        .expect("subscribe through the edge")
        .into_inner()
}

/// Pushes until the message tagged `last` arrives; everything pushed.
async fn pushes_until(stream: &mut Streaming<SyncPush>, last: &str) -> Vec<SyncPush> {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let push = next_push(stream, left)
            .await
            .unwrap_or_else(|| panic!("{last} never arrived; got {seen:?}"));
        let done = matches!(&push.push, Some(sync_push::Push::Event(e))
            if e.message.as_ref().is_some_and(|m| m.body == last.as_bytes()));
        seen.push(push);
        if done {
            return seen;
        }
    }
}

/// The conversations events and typing notices in `pushes` are about.
fn conversations(pushes: &[SyncPush]) -> HashSet<u64> {
    pushes
        .iter()
        .filter_map(|p| match &p.push {
            Some(sync_push::Push::Event(e)) => Some(e.conversation_id),
            Some(sync_push::Push::Typing(t)) => Some(t.conversation_id),
            Some(sync_push::Push::Hint(h)) => Some(h.conversation_id),
            _ => None,
        })
        .collect()
}

fn reason<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> (ErrorCode, String) {
    let e = r.expect_err("refused");
    let d = error_detail(&e);
    (ErrorCode::try_from(d.code).unwrap(), d.reason)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_on_one_cell_with_the_same_user_ids_never_see_each_other() {
    let (url, mut notifications) = cellmesh_tests::http::webhook(0).await;
    let d = deploy_with(None, |c| {
        c.notifications.webhook_url = Some(url.clone());
    })
    .await;
    let mut c = clients(&d).await;
    let (one, two) = two_tenants(&d, &mut c).await;

    // User 2 of each tenant streams; user 3 of tenant 1 is online by
    // heartbeat, user 3 of tenant 2 is offline.
    let mut one_2 = subscribe(&mut c, 1, 2).await;
    let mut two_2 = subscribe(&mut c, 2, 2).await;
    let heartbeat = HeartbeatRequest::default();
    c.s.heartbeat(authed(heartbeat, &token(1, 3)))
        .await
        .unwrap();

    send_in_each(&mut c, [(1, one), (2, two)], 3).await;
    let seen_1 = pushes_until(&mut one_2, "t1-2").await;
    let seen_2 = pushes_until(&mut two_2, "t2-2").await;
    assert_eq!(conversations(&seen_1), HashSet::from([one]), "{seen_1:?}");
    assert_eq!(conversations(&seen_2), HashSet::from([two]), "{seen_2:?}");
    // Each queue holds its own tenant's events only: Joined and 3 messages.
    let pts = |pushes: &[SyncPush]| -> Vec<u64> {
        pushes
            .iter()
            .filter_map(|p| match &p.push {
                Some(sync_push::Push::Event(e)) => Some(e.pts),
                _ => None,
            })
            .collect()
    };
    assert_eq!(pts(&seen_1), vec![1, 2, 3, 4]);
    assert_eq!(pts(&seen_2), vec![1, 2, 3, 4]);

    // Typing in tenant 2 reaches tenant 2's user 2 only.
    let typing = TypingRequest {
        conversation_id: two,
        ..Default::default()
    };
    c.s.typing(authed(typing, &token(2, 1))).await.unwrap();
    let typed = next_push(&mut two_2, WAIT).await.expect("typing notice");
    assert!(matches!(typed.push, Some(sync_push::Push::Typing(_))));
    if let Some(push) = next_push(&mut one_2, Duration::from_millis(500)).await {
        panic!("tenant 1's user 2 was pushed {push:?}");
    }

    // An ack by tenant 2's user 2 moves only that user's cursor.
    let ack = |pts| AckRequest {
        pts,
        ..Default::default()
    };
    let acked = c.s.ack(authed(ack(4), &token(2, 2))).await.unwrap();
    assert_eq!(acked.into_inner().cursor, 4);
    let untouched = c.s.ack(authed(ack(0), &token(1, 2))).await.unwrap();
    let untouched = untouched.into_inner();
    assert_eq!((untouched.cursor, untouched.latest_pts), (0, 4));

    // Mute, read state and lists stay within the tenant.
    let mute = SetMutedRequest {
        conversation_id: two,
        muted: true,
        ..Default::default()
    };
    c.s.set_muted(authed(mute, &token(2, 2))).await.unwrap();
    let read = MarkReadRequest {
        conversation_id: two,
        read_seq: 3,
        ..Default::default()
    };
    c.m.mark_read(authed(read, &token(2, 2))).await.unwrap();
    let list = |tenant| {
        let mut s = c.s.clone();
        async move {
            s.list_conversations(authed(
                ListConversationsRequest::default(),
                &token(tenant, 2),
            ))
            .await
            .unwrap()
            .into_inner()
            .conversations
        }
    };
    let (list_1, list_2) = (list(1).await, list(2).await);
    let summary = |l: &[ConversationSummary]| -> Vec<(u64, u64, bool)> {
        l.iter()
            .map(|s| {
                (
                    s.conversation.as_ref().unwrap().conversation_id,
                    s.unread,
                    s.muted,
                )
            })
            .collect()
    };
    assert_eq!(summary(&list_1), vec![(one, 3, false)]);
    assert_eq!(summary(&list_2), vec![(two, 0, true)]);

    // Presence: tenant 1's user 3 is online; tenant 2's user 3 is not.
    let presence = |tenant| {
        let mut s = c.s.clone();
        async move {
            let request = GetPresenceRequest {
                user_ids: vec![3],
                ..Default::default()
            };
            s.get_presence(authed(request, &token(tenant, 1)))
                .await
                .unwrap()
                .into_inner()
                .users[0]
                .online
        }
    };
    assert!(presence(1).await);
    assert!(
        !presence(2).await,
        "tenant 1's heartbeat made tenant 2's user online"
    );

    // Tenant 2's offline user 3 is notified of tenant 2's messages (tenant
    // 1's online user 3 changes nothing); tenant 1's online user 3 is not.
    let mut notified = HashSet::new();
    while !notified.contains(&(2, 3)) {
        let body = tokio::time::timeout(WAIT, notifications.recv())
            .await
            .unwrap_or_else(|_| panic!("tenant 2's user 3 not notified; got {notified:?}"))
            .unwrap();
        let n: serde_json::Value = serde_json::from_str(&body).unwrap();
        let (tenant, user) = (
            n["tenant_id"].as_u64().unwrap(),
            n["user_id"].as_u64().unwrap(),
        );
        let conversation = n["conversation_id"].as_u64().unwrap();
        assert_eq!(conversation, if tenant == 1 { one } else { two }, "{n}");
        notified.insert((tenant, user));
    }
    assert!(!notified.contains(&(1, 3)), "an online user was notified");

    // Another tenant's conversation does not exist for this one.
    let pull = PullRequest {
        conversation_id: one,
        limit: 10,
        ..Default::default()
    };
    let r = c.m.pull(authed(pull, &token(2, 2))).await;
    assert_eq!(
        reason(r),
        (
            ErrorCode::NotFound,
            Reason::ConversationNotFound.as_str().into()
        )
    );
    let mute = SetMutedRequest {
        conversation_id: one,
        muted: true,
        ..Default::default()
    };
    let r = c.s.set_muted(authed(mute, &token(2, 2))).await;
    assert_eq!(reason(r).0, ErrorCode::NotFound);
    let typing = TypingRequest {
        conversation_id: one,
        ..Default::default()
    };
    let r = c.s.typing(authed(typing, &token(2, 2))).await;
    assert_eq!(reason(r).0, ErrorCode::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_and_cleaning_up_a_user_home_leaves_the_other_tenants_user_alone() {
    let d = deploy_with(None, |c| c.routing.cleanup_grace_secs = 1).await;
    let mut c = clients(&d).await;
    let (one, two) = two_tenants(&d, &mut c).await;
    send_in_each(&mut c, [(1, one), (2, two)], 5).await;
    let source = d.cells[0].cell.service.store().clone();
    let target = d.cells[1].cell.service.store().clone();
    let (one_2, two_2) = (
        UserKey::new(TenantId(1), UserId(2)),
        UserKey::new(TenantId(2), UserId(2)),
    );
    let filled = cellmesh_tests::eventually(WAIT, || {
        let source = source.clone();
        async move { source.user_pts(one_2).unwrap() == 6 && source.user_pts(two_2).unwrap() == 6 }
    })
    .await;
    assert!(filled, "each user 2 has Joined and 5 messages");

    // Tenant 1's user 2 moves to the other cell; the grace period passes.
    let routes = d.cluster.client().await;
    let migrator = migrator(&routes);
    let report = migrator
        .migrate_user(TenantId(1), UserId(2), OTHER_CELL, |_| {})
        .await
        .unwrap();
    assert_eq!(report.final_pts, 6, "only tenant 1's events moved");
    assert_eq!(target.user_pts(one_2).unwrap(), 6);
    assert_eq!(target.user_pts(two_2).unwrap(), 0);
    let cleaned = cellmesh_tests::eventually(WAIT, || {
        let source = source.clone();
        async move { source.user_pts(one_2).unwrap() == 0 }
    })
    .await;
    assert!(
        cleaned,
        "the source kept the moved home past the grace period"
    );

    // Tenant 2's user 2 still has their whole queue where it was, and
    // their device reads it from the start.
    assert_eq!(source.user_pts(two_2).unwrap(), 6);
    let mut stream = subscribe(&mut c, 2, 2).await;
    let pushes = pushes_until(&mut stream, "t2-4").await;
    assert_eq!(conversations(&pushes), HashSet::from([two]));
    // And the moved user reads theirs at the new home.
    let mut stream = subscribe(&mut c, 1, 2).await;
    let pushes = pushes_until(&mut stream, "t1-4").await;
    assert_eq!(conversations(&pushes), HashSet::from([one]));
}
