//! User homes that moved away and came back: a home moved off its cell and
//! failed back onto the copy it left there, and what a device resuming
//! the queue it followed is answered first.

use cellmesh_proto::ids::UserId;
use std::time::Duration;

use cellmesh_proto::v1::{CellStatus, SubscribeRequest, sync_push};
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::commands::set_cell_status;

use crate::deploy::{Deployment, authed, create_via_edge, fail_over, messaging, text, token};
use crate::sync::{connect_sync, next_push};

/// The first push of `user`'s (tenant 1) subscription through `edge`
/// resuming `queue_id` at `from_pts`: (queue id, pts) of an event, or
/// (queue id, latest pts) of a rebase, and whether it was a rebase.
pub async fn first_push(
    edge: &str,
    user: UserId,
    from_pts: u64,
    queue_id: u64,
) -> (u64, u64, bool) {
    let mut sync = connect_sync(edge).await;
    let request = SubscribeRequest {
        caller: None,
        from_pts,
        queue_id,
    };
    let mut stream = sync
        .subscribe(authed(request, &token(1, user.get())))
        .await
        .unwrap()
        .into_inner();
    let push = next_push(&mut stream, Duration::from_secs(10))
        .await
        .expect("a push within 10 s");
    match push.push {
        Some(sync_push::Push::Event(e)) => (e.queue_id, e.pts, false),
        Some(sync_push::Push::Rebase(r)) => (r.queue_id, r.latest_pts, true),
        other => panic!("unexpected push {other:?}"),
    }
}

/// A home [`moved_then_failed_back`] left: the conversation its events
/// came from, the queue id a device followed and the latest pts it saw.
pub struct FailedBack {
    pub conversation: u64,
    pub queue: u64,
    pub last_pts: u64,
}

/// `user`'s home (tenant 1) on cell `from` with three events from a new
/// conversation with user 10, moved to `to` by `move_away`, where ten
/// more arrive, then failed back onto `from` (its new home hung), where
/// the copy the move left behind lacks those ten.
pub async fn moved_then_failed_back(
    d: &Deployment,
    user: UserId,
    (from, to): (&str, &str),
    move_away: impl AsyncFnOnce(&RouteClient),
) -> FailedBack {
    let (alice, edge) = (token(1, 10), d.edge.endpoint());
    let mut m = messaging(&d.edge).await;
    let conversation = create_via_edge(&mut m, &alice, vec![user.get()]).await;
    let send = |n: usize| authed(text(conversation, &format!("m-{n}")), &alice);
    for n in 0..3 {
        m.send(send(n)).await.unwrap();
    }
    // Asked beyond anything there, a home answers its queue and latest pts.
    let latest = |queue| first_push(&edge, user, 1 << 40, queue);
    let (queue, left_at, _) = latest(0).await;
    let routes = d.cluster.client().await;
    move_away(&routes).await;
    for n in 3..13 {
        m.send(send(n)).await.unwrap();
    }
    let followed = crate::eventually(Duration::from_secs(10), || async {
        latest(queue).await.1 >= left_at + 10
    })
    .await;
    assert!(followed, "the new home appends to the moved queue");
    let (moved_queue, last_pts, _) = latest(queue).await;
    assert_eq!(moved_queue, queue, "a move keeps the queue");
    assert_eq!(fail_over(&routes, to, 1_000).await, from);
    FailedBack {
        conversation,
        queue,
        last_pts,
    }
}

/// Marks `cell` Up again (after a failover marked it Down) and waits until
/// `routes` has applied it.
pub async fn mark_up(routes: &RouteClient, cell: &str) {
    let up = routes
        .apply(set_cell_status(cell, CellStatus::Up))
        .await
        .unwrap();
    routes.wait_applied(up.index, Duration::from_secs(5)).await;
}
