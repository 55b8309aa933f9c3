//! A user's home moving between cells while messages keep arriving for
//! them: their device, reconnecting through the edge, goes on from its
//! cursor on the new cell — every acknowledged message exactly once, in
//! order, pts without a gap, no rebase — the conversation list and cursor
//! come along, and the old home refuses the user afterwards. The home then
//! moves back, over the old copy it left behind.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::reason::Reason;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellmesh_chaos::history::Outcome;
use cellmesh_control_plane::migration::{MigrationOptions, Migrator};
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1::sync_client::SyncClient;
use cellmesh_proto::v1::*;
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::table::{Key, RouteState};
use cellmesh_tests::deploy::*;
use cellmesh_tests::eventually;
use cellmesh_tests::homes::{FailedBack, first_push, mark_up, moved_then_failed_back};
use cellmesh_tests::router::{SECRET, with_secret};

const SOURCE: &str = "eu-west/c1";
const TARGET: &str = "us-east/c1";
const BOB: u64 = 11;

/// What one device saw, across reconnects.
#[derive(Default)]
struct Seen {
    events: Vec<SyncEvent>,
    rebases: usize,
    /// Why each stream ended.
    ends: Vec<String>,
}

/// Bob's phone: subscribes through the edge and, whenever the stream
/// ends, subscribes again from the last pts it got.
async fn device(edge: String, stop: Arc<AtomicBool>, seen: Arc<Mutex<Seen>>) {
    let bob = token(1, BOB);
    let mut sync = SyncClient::connect(edge).await.unwrap();
    while !stop.load(Ordering::Relaxed) {
        let (from_pts, queue_id) = seen
            .lock()
            .unwrap()
            .events
            .last()
            .map_or((0, 0), |e| (e.pts, e.queue_id));
        let request = SubscribeRequest {
            caller: None,
            from_pts,
            queue_id,
        };
        let mut stream = match sync.subscribe(authed(request, &bob)).await {
            Ok(s) => s.into_inner(),
            Err(e) => {
                seen.lock().unwrap().ends.push(format!("subscribe: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        loop {
            let next = tokio::time::timeout(Duration::from_millis(200), stream.message()).await;
            if stop.load(Ordering::Relaxed) {
                return;
            }
            match next {
                Err(_) => continue,
                Ok(Ok(Some(push))) => {
                    let mut seen = seen.lock().unwrap();
                    match push.push {
                        Some(sync_push::Push::Event(e)) => seen.events.push(e),
                        Some(sync_push::Push::Rebase(_)) => seen.rebases += 1,
                        _ => {}
                    }
                }
                Ok(Ok(None)) => break,
                Ok(Err(status)) => {
                    let d = error_detail(&status);
                    seen.lock().unwrap().ends.push(d.reason);
                    break;
                }
            }
        }
    }
}

/// `values` is 1, 2, 3, ... (else: where it first is not).
fn assert_counts_up(values: &[u64], what: &str) {
    if let Some(at) = (0..values.len()).find(|&i| values[i] != i as u64 + 1) {
        let around = &values[at.saturating_sub(3)..(at + 4).min(values.len())];
        panic!("{what} lost, repeated or reordered at #{at}: ...{around:?}...");
    }
}

/// `conversation` as Bob's conversation list shows it.
async fn bob_summary(edge: &str, conversation: u64) -> ConversationSummary {
    let mut sync = SyncClient::connect(edge.to_string()).await.unwrap();
    let list = sync
        .list_conversations(authed(ListConversationsRequest::default(), &token(1, BOB)))
        .await
        .unwrap()
        .into_inner();
    list.conversations
        .into_iter()
        .find(|s| s.conversation.as_ref().map(|c| c.conversation_id) == Some(conversation))
        .expect("the conversation is in Bob's list")
}

/// The seq of the last message Bob's conversation list shows for
/// `conversation`; it is the latest Bob has been told of (he read nothing).
async fn last_message_seq(edge: &str, conversation: u64) -> u64 {
    let summary = bob_summary(edge, conversation).await;
    let last = summary.last_message.as_ref().expect("a last message");
    assert_eq!(last.seq, summary.unread, "the last message is the latest");
    last.seq
}

async fn move_home(routes: &RouteClient, to: &str) -> u64 {
    let migrator = migrator(routes);
    let report = migrator
        .migrate_user(TenantId(1), UserId(BOB), to, |p| {
            println!(
                "move to {to}: {} {}/{}",
                p.phase, p.copied_through, p.source_latest
            )
        })
        .await
        .unwrap();
    println!(
        "home of user {BOB} moved {} -> {}: {} events verified, frozen {} ms, total {} ms",
        report.from,
        report.to,
        report.events_verified,
        report.frozen_for.as_millis(),
        report.total.as_millis()
    );
    report.final_pts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_home_moves_under_load_and_the_device_goes_on_from_its_cursor() {
    let d = deploy(None).await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conversation = create_via_edge(&mut m, &alice, vec![BOB]).await;
    for i in 0..50 {
        m.send(authed(text(conversation, &format!("seed-{i}")), &alice))
            .await
            .unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let phone = tokio::spawn(device(d.edge.endpoint(), stop.clone(), seen.clone()));
    let senders = Senders::start(&d.edge, conversation, &[10]);
    senders.until_acked(20, Duration::from_secs(10)).await;

    let routes = d.cluster.client().await;
    let moved_at = move_home(&routes, TARGET).await;
    let entry = routes
        .read(|t| t.entry(&Key::user(TenantId(1), UserId(BOB))).cloned())
        .unwrap();
    assert_eq!(
        (entry.cell.as_str(), &entry.state),
        (TARGET, &RouteState::Active)
    );
    // On its new home, away from the conversation, Bob's list shows the
    // conversation's last message as the events that reached him carry it:
    // sends after the move reach it there.
    let sent_by_then = senders.latest_acked_seq();
    let edge = d.edge.endpoint();
    let reached = eventually(Duration::from_secs(5), || {
        let edge = edge.clone();
        async move { last_message_seq(&edge, conversation).await > sent_by_then }
    })
    .await;
    assert!(
        reached,
        "no send after seq {sent_by_then} reached Bob's new home"
    );
    let back_at = move_home(&routes, SOURCE).await;
    let ops = senders.finish(Duration::from_millis(800)).await;

    // Everything acknowledged reaches the phone.
    let acked: Vec<u64> = ops
        .iter()
        .filter_map(|op| match op.outcome {
            Outcome::Ok { seq, .. } => Some(seq),
            _ => None,
        })
        .collect();
    let last_acked = *acked.iter().max().unwrap();
    let arrived = cellmesh_tests::eventually(Duration::from_secs(20), || {
        let seen = seen.clone();
        async move {
            let seen = seen.lock().unwrap();
            cellmesh_tests::sync::message_seqs(&seen.events).last() == Some(&last_acked)
        }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    phone.await.unwrap();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(arrived, "the phone did not get seq {last_acked}");
    assert_eq!(seen.rebases, 0, "the device had to rebase");
    // One queue throughout: the moves copied its identity along.
    let queue = seen.events[0].queue_id;
    assert!(queue != 0 && seen.events.iter().all(|e| e.queue_id == queue));
    let pts: Vec<u64> = seen.events.iter().map(|e| e.pts).collect();
    assert_counts_up(&pts, "pts");
    let seqs = cellmesh_tests::sync::message_seqs(&seen.events);
    assert_counts_up(&seqs, "message seqs");
    assert_eq!(seqs.len() as u64, last_acked);
    for seq in &acked {
        assert!(seqs.contains(seq), "acked seq {seq} never arrived");
    }
    assert!(
        seen.ends.iter().any(|r| r == Reason::NotOwner.as_str()),
        "the old home never told the device to move: {:?}",
        seen.ends
    );
    println!(
        "{} messages acked, {} sync events in order across 2 moves (switched at pts {moved_at} and {back_at}); streams ended: {:?}",
        acked.len(),
        pts.len(),
        seen.ends
    );

    // Bob's conversation list and cursor live on the home he is back at.
    let summary = bob_summary(&d.edge.endpoint(), conversation).await;
    assert_eq!(summary.unread, last_acked);
    let mut sync = SyncClient::connect(d.edge.endpoint()).await.unwrap();
    let bob = token(1, BOB);
    let last_pts = *pts.last().unwrap();
    let ack = |pts| AckRequest {
        caller: None,
        pts,
        queue_id: queue,
    };
    let acked_cursor = sync.ack(authed(ack(last_pts), &bob)).await.unwrap();
    assert_eq!(acked_cursor.into_inner().cursor, last_pts);

    // The cell Bob left refuses his sync writes.
    let mut away = SyncClient::connect(d.cells[1].endpoint.clone())
        .await
        .unwrap();
    let r = with_secret(AckRequest {
        caller: cellmesh_tests::sync::device(1, BOB, "phone"),
        pts: 1,
        queue_id: 0,
    });
    let e = away.ack(r).await.unwrap_err();
    assert_eq!(error_detail(&e).code, ErrorCode::WrongCell as i32);
}

/// On a home away from the conversation, Bob's list takes the last message
/// from the sync event his list entry names. Entry and event are written in
/// one batch; while that batch waits for its sync (readers of his queue stop
/// below it), the list still shows the message the entry counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_home_lists_the_last_message_while_its_batch_waits_for_a_sync() {
    let d = deploy(None).await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conversation = create_via_edge(&mut m, &alice, vec![BOB]).await;
    let routes = d.cluster.client().await;
    move_home(&routes, TARGET).await;
    let target = d.cells[1].cell.service.store().clone();
    let slow_sync = "storage.fan_out_unsynced=delay(1500ms)";
    target
        .failpoints()
        .set(cellmesh_cell::failpoints::parse(slow_sync).unwrap());
    let sent = m.send(authed(text(conversation, "while syncing"), &alice));
    let seq = sent.await.unwrap().into_inner().seq;
    let edge = d.edge.endpoint();
    let listed = eventually(Duration::from_secs(5), || {
        let edge = edge.clone();
        async move { bob_summary(&edge, conversation).await.unread >= seq }
    })
    .await;
    let summary = bob_summary(&edge, conversation).await;
    target.failpoints().set(Vec::new());
    assert!(listed, "the send never reached Bob's list");
    let last = summary.last_message.as_ref().map(|m| m.seq);
    assert_eq!(
        (last, summary.unread),
        (Some(seq), seq),
        "the list counts seq {seq} and shows another last message"
    );
}

/// The source of a conversation move and of a user-home move drops its copy
/// once the grace period is over; the new owner serves everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moved_copies_are_dropped_after_the_grace_period() {
    let d = deploy_with(None, |c| c.routing.cleanup_grace_secs = 1).await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conversation = create_via_edge(&mut m, &alice, vec![BOB]).await;
    for i in 0..20 {
        m.send(authed(text(conversation, &format!("m-{i}")), &alice))
            .await
            .unwrap();
    }
    let source = d.cells[0].cell.service.store().clone();
    let target = d.cells[1].cell.service.store().clone();
    let has_history = |store: &cellmesh_cell::storage::Store| {
        !store
            .messages_after(ConversationId(conversation), 0, 1, usize::MAX)
            .unwrap()
            .is_empty()
    };
    let has_queue = |store: &cellmesh_cell::storage::Store| {
        store
            .user_pts(cellmesh_cell::UserKey::new(TenantId(1), UserId(BOB)))
            .unwrap()
            > 0
    };
    assert!(
        cellmesh_tests::eventually(Duration::from_secs(10), || {
            let source = source.clone();
            async move {
                source
                    .user_pts(cellmesh_cell::UserKey::new(TenantId(1), UserId(BOB)))
                    .unwrap()
                    >= 21
            }
        })
        .await
    );
    let pts = source
        .user_pts(cellmesh_cell::UserKey::new(TenantId(1), UserId(BOB)))
        .unwrap();

    let routes = d.cluster.client().await;
    let migrator = migrator(&routes);
    migrator
        .migrate_conversation(TenantId(1), ConversationId(conversation), TARGET, |_| {})
        .await
        .unwrap();
    move_home(&routes, TARGET).await;
    // Both copies are still there right after the moves...
    assert!(has_history(&source) && has_queue(&source));
    // ...and gone once the grace period is over.
    let dropped = cellmesh_tests::eventually(Duration::from_secs(10), || {
        let source = source.clone();
        async move { !has_history(&source) && !has_queue(&source) }
    })
    .await;
    assert!(dropped, "the source kept its copies past the grace period");
    assert!(has_history(&target));
    assert_eq!(
        target
            .user_pts(cellmesh_cell::UserKey::new(TenantId(1), UserId(BOB)))
            .unwrap(),
        pts
    );
    let history = history_via_edge(&mut m, &alice, conversation).await;
    assert_eq!(history.len(), 20);
}

/// Moves whose migrator died — a conversation left frozen, a user home
/// left migrating — are finished by the leading control plane.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_finishes_moves_nobody_drives() {
    use cellmesh_control_plane::migration::StopPoint;
    use cellmesh_control_plane::migration::orphans::OrphanConfig;
    use cellmesh_control_plane::server::ControlPlaneConfig;

    let d = deploy(None).await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conversation = create_via_edge(&mut m, &alice, vec![BOB]).await;
    for i in 0..30 {
        m.send(authed(text(conversation, &format!("m-{i}")), &alice))
            .await
            .unwrap();
    }
    let routes = d.cluster.client().await;
    let dying = |stop| {
        Migrator::new(
            routes.clone(),
            ClusterSecret::new(SECRET),
            MigrationOptions {
                stop_after: Some(stop),
                ..MigrationOptions::default()
            },
        )
    };
    let frozen = dying(StopPoint::Frozen)
        .migrate_conversation(TenantId(1), ConversationId(conversation), TARGET, |_| {})
        .await;
    assert!(frozen.is_err(), "the migrator stops once frozen");
    let planned = dying(StopPoint::Planned)
        .migrate_user(TenantId(1), UserId(BOB), TARGET, |_| {})
        .await;
    assert!(planned.is_err(), "the migrator stops once planned");
    let state =
        |key: Key| routes.read(|t| t.entry(&key).map(|e| (e.cell.clone(), e.state.clone())));
    assert!(matches!(
        state(Key::conversation(TenantId(1), ConversationId(conversation))),
        Some((_, RouteState::Frozen { .. }))
    ));

    let _cp = cellmesh_control_plane::server::start(ControlPlaneConfig {
        routers: d.cluster.endpoints(),
        cluster_secret: SECRET.into(),
        console_listen: String::new(),
        admin_listen: "127.0.0.1:0".into(),
        migrations: OrphanConfig {
            resume_after_ms: 1_000,
            resume_frozen_after_ms: 500,
            tenant_parallel: 4,
        },
        ..ControlPlaneConfig::default()
    })
    .await
    .unwrap();
    let finished = cellmesh_tests::eventually(Duration::from_secs(30), || {
        let done = [
            Key::conversation(TenantId(1), ConversationId(conversation)),
            Key::user(TenantId(1), UserId(BOB)),
        ]
        .into_iter()
        .all(|k| state(k) == Some((TARGET.to_string(), RouteState::Active)));
        async move { done }
    })
    .await;
    assert!(
        finished,
        "moves left: {:?} {:?}",
        state(Key::conversation(TenantId(1), ConversationId(conversation))),
        state(Key::user(TenantId(1), UserId(BOB)))
    );
    // Nothing was lost, and the conversation takes writes again.
    m.send(authed(text(conversation, "after"), &alice))
        .await
        .unwrap();
    let history = history_via_edge(&mut m, &alice, conversation).await;
    assert_eq!(history.len(), 31);
}

/// Bob's home moved to `TARGET` and failed back onto `SOURCE` (see
/// [`moved_then_failed_back`]).
async fn bob_failed_back(d: &Deployment) -> FailedBack {
    let move_away = async |routes: &RouteClient| {
        move_home(routes, TARGET).await;
    };
    moved_then_failed_back(d, UserId(BOB), (SOURCE, TARGET), move_away).await
}

/// A home that moved away and then failed back onto the cell it left does
/// not resume the copy left behind: the queue starts anew under a new id,
/// so a device resuming the queue it followed is told to rebase, and no pts
/// is handed out twice under one queue id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_home_failed_back_onto_the_copy_it_left_starts_a_new_queue() {
    let d = deploy(None).await;
    let edge = d.edge.endpoint();
    let back = bob_failed_back(&d).await;
    let (queue, last_pts) = (back.queue, back.last_pts);
    // A device back before any new event for Bob: the copy is not handed
    // out under the queue id the device followed elsewhere.
    let (first_queue, latest, rebased) = first_push(&edge, UserId(BOB), last_pts, queue).await;
    assert!(rebased, "a device beyond the failed-back queue is rebased");
    assert_ne!(
        first_queue, queue,
        "the copy left behind was answered under the old queue id (latest pts {latest}, the device had {last_pts})"
    );
    let mut m = messaging(&d.edge).await;
    let send = authed(text(back.conversation, "m-13"), &token(1, 10));
    m.send(send).await.unwrap();
    let (now_queue, latest, rebased) = first_push(&edge, UserId(BOB), last_pts, queue).await;
    assert!(rebased, "a device beyond the failed-back queue is rebased");
    assert_ne!(
        now_queue, queue,
        "the copy left behind was resumed under the old queue id (latest pts {latest}, the device had {last_pts})"
    );
    assert_eq!(now_queue, first_queue, "the queue starts anew once");
}

/// A home failed back onto the copy it left and then moved on, before any
/// device or event reached it, does not carry the old queue id to its next
/// home: a device resuming there is rebased onto a new queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_back_home_moved_on_does_not_take_the_old_queue_id_along() {
    let d = deploy(None).await;
    let back = bob_failed_back(&d).await;
    let routes = d.cluster.client().await;
    mark_up(&routes, TARGET).await;
    move_home(&routes, TARGET).await;
    let (queue, last_pts) = (back.queue, back.last_pts);
    let resumed = first_push(&d.edge.endpoint(), UserId(BOB), last_pts, queue).await;
    let (now_queue, latest, rebased) = resumed;
    assert!(rebased, "a device beyond the moved copy is rebased");
    assert_ne!(
        now_queue, queue,
        "the copy left behind moved on under the old queue id (latest pts {latest}, the device had {last_pts})"
    );
}

/// A device streaming from Bob's home with nothing to push is still told
/// once the home moved away: the cell's sweep of its streaming users ends
/// the stream with `WRONG_CELL` within a couple of seconds, so the device
/// reconnects to the new home instead of waiting on a cell that will never
/// push to it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_ends_soon_after_its_users_home_moved_away() {
    let d = deploy(None).await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conversation = create_via_edge(&mut m, &alice, vec![BOB]).await;
    m.send(authed(text(conversation, "hello"), &alice))
        .await
        .unwrap();
    let mut sync = SyncClient::connect(d.cells[0].endpoint.clone())
        .await
        .unwrap();
    let request = with_secret(SubscribeRequest {
        caller: cellmesh_tests::sync::device(1, BOB, "phone"),
        from_pts: 0,
        queue_id: 0,
    });
    let mut stream = sync.subscribe(request).await.unwrap().into_inner();
    // The backlog first; then the stream has nothing to push.
    let first = tokio::time::timeout(Duration::from_secs(5), stream.message()).await;
    assert!(matches!(first, Ok(Ok(Some(_)))), "no backlog: {first:?}");
    while let Ok(Ok(Some(_))) =
        tokio::time::timeout(Duration::from_millis(300), stream.message()).await
    {}

    let routes = d.cluster.client().await;
    move_home(&routes, TARGET).await;
    let moved = std::time::Instant::now();
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match stream.message().await {
                Ok(Some(push)) => println!("pushed after the move: {push:?}"),
                other => return other,
            }
        }
    })
    .await
    .expect("the idle stream still open 5 s after the move");
    let e = end.expect_err("the stream ended without an error");
    assert_eq!(error_detail(&e).code, ErrorCode::WrongCell as i32, "{e}");
    println!("the idle stream ended {:?} after the move", moved.elapsed());
}
