//! A whole tenant moving between cells under load as one workflow: copy
//! and catch-up rounds while clients keep sending and creating new
//! conversations, one freeze and one switch of the tenant entry (no
//! conversation or home gets a route of its own), new conversations land on
//! the target, nothing acknowledged is lost, duplicated or reordered, and
//! the source refuses writes afterwards. Stopped at any point, the move
//! resumes or cancels cleanly.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellmesh_chaos::history::History;
use cellmesh_control_plane::migration::{MigrationOptions, Migrator};
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1::*;
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::table::{Change, Key, RouteState, Scope};
use cellmesh_tests::deploy::*;
use cellmesh_tests::router::SECRET;

const CONVERSATIONS: usize = 1_000;
const SOURCE: &str = "eu-west/c1";
const TARGET: &str = "us-east/c1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_of_1000_conversations_moves_under_load_with_one_freeze_and_one_switch() {
    let d = deploy(None).await;
    let alice = token(1, 10);
    let started = Instant::now();
    let mut creators = Vec::new();
    for _ in 0..8 {
        let edge = d.edge.endpoint();
        let alice = alice.clone();
        creators.push(tokio::spawn(async move {
            let mut m = cellmesh_proto::v1::messaging_client::MessagingClient::connect(edge)
                .await
                .unwrap();
            let mut ids = Vec::new();
            for _ in 0..CONVERSATIONS / 8 {
                ids.push(create_via_edge(&mut m, &alice, vec![11]).await);
            }
            ids
        }));
    }
    let mut conversations = Vec::new();
    for c in creators {
        conversations.extend(c.await.unwrap());
    }
    let mut m = messaging(&d.edge).await;
    for (i, &c) in conversations.iter().enumerate().step_by(10) {
        m.send(authed(text(c, &format!("seed-{i}")), &alice))
            .await
            .unwrap();
    }
    println!(
        "{CONVERSATIONS} conversations created and seeded in {} ms",
        started.elapsed().as_millis()
    );

    let routes = d.cluster.client().await;
    let mut watch = routes.changes();
    let route_changes = Arc::new(Mutex::new(Vec::new()));
    let recorder = tokio::spawn({
        let route_changes = route_changes.clone();
        async move {
            while let Ok((index, changes)) = watch.recv().await {
                for change in changes {
                    if let Change::Route(e) = change {
                        route_changes.lock().unwrap().push((index, e));
                    }
                }
            }
        }
    });

    // Load: senders in three old conversations, and new conversations
    // created (and written to) while the tenant moves.
    let loaded = &conversations[..3];
    let senders: Vec<Senders> = loaded
        .iter()
        .map(|&c| Senders::start(&d.edge, c, &[10, 11]))
        .collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let creating = tokio::spawn({
        let edge = d.edge.endpoint();
        let alice = alice.clone();
        let stop = stop.clone();
        async move {
            let mut m = cellmesh_proto::v1::messaging_client::MessagingClient::connect(edge)
                .await
                .unwrap();
            let mut created = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let c = create_via_edge(&mut m, &alice, vec![12]).await;
                let ack = m
                    .send(authed(text(c, &format!("first-{c}")), &alice))
                    .await
                    .expect("a new conversation takes writes during the move")
                    .into_inner();
                created.push((c, ack.seq));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            created
        }
    });
    for s in &senders {
        s.until_acked(10, Duration::from_secs(10)).await;
    }

    let migrator = migrator(&routes);
    let report = migrator
        .migrate_tenant(TenantId(1), TARGET, 8, |_| {})
        .await
        .expect("tenant move succeeds");
    println!(
        "moved {} conversations ({} messages) and {} user homes in {} ms, longest freeze {} ms, {} overrides dropped",
        report.conversations_moved,
        report.messages_moved,
        report.users_moved,
        report.total.as_millis(),
        report.max_freeze.as_millis(),
        report.overrides_removed
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let created = creating.await.unwrap();
    let mut ops = Vec::new();
    for s in senders {
        ops.extend(s.finish(Duration::from_millis(500)).await);
    }
    recorder.abort();
    assert_eq!((report.from.as_str(), report.to.as_str()), (SOURCE, TARGET));
    // Bytes are what the target stored: every message or event carries ids,
    // positions and a body, so more than a few bytes each.
    assert!(
        report.bytes_moved >= report.messages_moved * 16,
        "{} bytes for {} rows",
        report.bytes_moved,
        report.messages_moved
    );
    assert!(report.conversations_moved >= CONVERSATIONS as u64);
    // The members' homes came along, sync queues included (12 joined
    // conversations created on the target during the move): the target
    // holds everything the source had for them, and nothing overrides the
    // tenant's route for them any more.
    assert_eq!(report.users_moved, 3);
    for user in [10, 11, 12] {
        let pts = |cell: &cellmesh_tests::TestCell| {
            cell.cell
                .service
                .store()
                .user_pts(cellmesh_cell::UserKey::new(TenantId(1), UserId(user)))
                .unwrap()
        };
        let (source, target) = (pts(&d.cells[0]), pts(&d.cells[1]));
        assert!(
            target >= source && target > 0,
            "user {user}: source pts {source}, target {target}"
        );
        assert!(routes.read(|t| t.entry(&Key::user(TenantId(1), UserId(user))).is_none()));
    }
    assert!(
        !created.is_empty(),
        "conversations were created during the move"
    );

    // One workflow on the tenant's entry: begin, catch-up, freeze, switch.
    // No conversation or home that existed before the move got a route of
    // its own (only those created meanwhile were placed on the target).
    let changes = route_changes.lock().unwrap().clone();
    let tenant_changes: Vec<&RouteState> = changes
        .iter()
        .filter(|(_, e)| e.key == Key::tenant(TenantId(1)))
        .map(|(_, e)| &e.state)
        .collect();
    assert_eq!(tenant_changes.len(), 4, "{tenant_changes:?}");
    assert!(matches!(tenant_changes[2], RouteState::Frozen { .. }));
    let tenant_switch = changes
        .iter()
        .find(|(_, e)| {
            e.key == Key::tenant(TenantId(1)) && e.cell == TARGET && e.state == RouteState::Active
        })
        .map(|(i, _)| *i)
        .expect("the tenant entry switched");
    assert_eq!(tenant_switch, report.switch_epoch);
    let existing: std::collections::HashSet<u64> = conversations.iter().copied().collect();
    let own_routes: Vec<&Key> = changes
        .iter()
        .map(|(_, e)| &e.key)
        .filter(|k| match k.scope {
            Scope::Conversation(c) => existing.contains(&c),
            Scope::User(_) => true,
            Scope::Tenant => false,
        })
        .collect();
    assert!(own_routes.is_empty(), "{own_routes:?}");
    assert_eq!(report.route_writes, 4 + report.overrides_removed);
    // Everything now resolves to the target, through the tenant entry.
    let (on_target, overrides) = routes.read(|t| {
        let all = conversations.iter().chain(created.iter().map(|(c, _)| c));
        (
            all.filter(|&&c| {
                t.resolve(&Key::conversation(TenantId(1), ConversationId(c)))
                    .unwrap()
                    .entry
                    .cell
                    == TARGET
            })
            .count(),
            t.routes
                .keys()
                .filter(|k| k.tenant == TenantId(1) && k.is_override())
                .count(),
        )
    });
    assert_eq!(on_target, conversations.len() + created.len());
    assert_eq!(overrides, 0, "overrides agreeing with the tenant are gone");

    // Conversations created during the move live on the target.
    for &(c, seq) in &created {
        let h = history_via_edge(&mut m, &alice, c).await;
        assert_eq!(h.iter().map(|s| s.seq).collect::<Vec<_>>(), vec![seq]);
    }
    // Nothing acknowledged is lost, duplicated or reordered; seeds kept.
    let mut history = History {
        sends: ops,
        ..History::default()
    };
    for &c in loaded {
        history
            .conversations
            .insert(c, history_via_edge(&mut m, &alice, c).await);
    }
    assert_every_invariant(&history);
    let seeded = history_via_edge(&mut m, &alice, conversations[10]).await;
    assert_eq!(seeded.len(), 1, "{seeded:?}");
    // The source answers WRONG_CELL for the tenant's writes now.
    let mut direct = d.cells[0].client().await;
    let mut r = tonic::Request::new(SendRequest {
        caller: cellmesh_tests::caller(1, 10),
        ..text(conversations[500], "late")
    });
    ClusterSecret::new(SECRET).attach(&mut r);
    let e = direct.send(r).await.unwrap_err();
    assert_eq!(error_detail(&e).code, ErrorCode::WrongCell as i32);
}

/// Fails a cell over by hand (its process keeps running, as after a false
/// alarm), backfills it, fails its tenant back by live migration while a
/// client keeps sending, then drains it: nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_over_cell_takes_its_tenant_back_and_is_then_drained() {
    use cellmesh_chaos::history::Floor;
    use cellmesh_control_plane::failover::backfill::backfill;
    use cellmesh_control_plane::failover::{execute, planner::plan_failover};
    use cellmesh_route_client::commands::set_cell_status;
    use cellmesh_route_client::table::CellStatus;

    let d = deploy(None).await;
    let routes = d.cluster.client().await;
    let secret = ClusterSecret::new(SECRET);
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conversations = create_seeded(&mut m, &alice, 12, 3).await;
    // The failover floors come from the marks the target holds: let them
    // land.
    for &c in &conversations {
        cellmesh_tests::deploy::wait_for_checkpoint(&routes, c, 3, Duration::from_secs(10)).await;
    }

    // A cell's own write (its mark holders) may land between the plan and
    // its execution: plan again, as the control plane does.
    for attempt in 0.. {
        let plan = routes
            .read(|t| plan_failover(t, SOURCE, 1000))
            .expect("failover plan");
        match execute(&routes, &plan.commands).await {
            Ok(_) => break,
            Err(e) if attempt < 5 => {
                eprintln!("the failover plan was stale ({e}); planning again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("failover: {e}"),
        }
    }
    // The failover's route changes reach this client's cache.
    let moved = cellmesh_tests::eventually(Duration::from_secs(5), || {
        let cell = routes.read(|t| t.entry(&Key::tenant(TenantId(1))).map(|e| e.cell.clone()));
        async move { cell.as_deref() == Some(TARGET) }
    })
    .await;
    assert!(moved, "the tenant failed over");
    let failed_over = routes.read(|t| t.entry(&Key::tenant(TenantId(1))).cloned().unwrap());
    assert_eq!(failed_over.cell, TARGET);
    assert_eq!(failed_over.failed_from.as_deref(), Some(SOURCE));
    let floors: Vec<Floor> =
        cellmesh_chaos::floors::failover_floors(&routes, &secret, 1, &conversations)
            .await
            .into_iter()
            .map(|(conversation, floor)| Floor {
                conversation,
                floor,
            })
            .collect();
    let loaded = conversations[0];
    let senders = Senders::start(&d.edge, loaded, &[10, 11]);
    senders.until_acked(10, Duration::from_secs(10)).await;

    // The cell is back: its history goes to the new owner, then it is Up.
    let backfilled = backfill(&routes, &Default::default(), &secret, SOURCE).await;
    assert_eq!((backfilled.conversations, backfilled.failed), (12, 0));
    let up = routes
        .apply(set_cell_status(SOURCE, cellmesh_proto::v1::CellStatus::Up))
        .await
        .unwrap();
    routes.wait_applied(up.index, Duration::from_secs(5)).await;
    let migrator = Migrator::new(routes.clone(), secret, MigrationOptions::default());
    let back = migrator.failback(SOURCE, 4, |_| {}).await.unwrap();
    assert!(back.failures.is_empty(), "{:?}", back.failures);
    assert_eq!(back.selection.tenants, vec![1]);
    let entry = routes.read(|t| t.entry(&Key::tenant(TenantId(1))).cloned().unwrap());
    assert_eq!((entry.cell.as_str(), entry.failed_from), (SOURCE, None));
    // Nothing is left to fail back.
    let again = migrator.failback(SOURCE, 4, |_| {}).await.unwrap();
    assert!(again.selection.tenants.is_empty() && again.selection.conversations.is_empty());

    // Drain it into its fallback (the only other Up cell).
    let drained = migrator.drain(SOURCE, None, 4, |_| {}).await.unwrap();
    assert!(drained.failures.is_empty(), "{:?}", drained.failures);
    assert_eq!(drained.to, TARGET);
    let (tenant_cell, status) = routes.read(|t| {
        (
            t.entry(&Key::tenant(TenantId(1))).unwrap().cell.clone(),
            t.cell(SOURCE).unwrap().status,
        )
    });
    assert_eq!(
        (tenant_cell.as_str(), status),
        (TARGET, CellStatus::Draining)
    );
    // A draining cell takes no new placements.
    let refused = migrator
        .migrate_conversation(
            TenantId(1),
            ConversationId(conversations[1]),
            SOURCE,
            |_| {},
        )
        .await;
    assert!(refused.is_err(), "{refused:?}");

    let ops = senders.finish(Duration::from_millis(300)).await;
    let acked = ops
        .iter()
        .filter(|o| matches!(o.outcome, cellmesh_chaos::history::Outcome::Ok { .. }))
        .count();
    assert!(
        acked > 10,
        "sends went on through failback and drain ({acked})"
    );
    let mut history = History {
        sends: ops,
        floors,
        ..History::default()
    };
    for &c in &conversations {
        let h = history_via_edge(&mut m, &alice, c).await;
        if c != loaded {
            assert_eq!(h.len(), 3, "seeds of {c} kept: {h:?}");
        }
        history.conversations.insert(c, h);
    }
    assert_every_invariant(&history);
}

/// The workflow interrupted at each of its points (as when the control
/// plane dies there): run again, it finishes from what the target holds;
/// cancelled there instead, the tenant stays on the source and takes
/// writes, and a later move finishes. A sender writes throughout, and its
/// history is checked at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_move_stopped_at_any_point_cancels_or_resumes() {
    use cellmesh_control_plane::migration::StopPoint;
    for point in [
        StopPoint::Planned,
        StopPoint::Copied,
        StopPoint::Frozen,
        StopPoint::Sealed,
    ] {
        for cancel in [false, true] {
            stop_then_finish(point, cancel).await;
        }
    }
}

async fn stop_then_finish(point: cellmesh_control_plane::migration::StopPoint, cancel: bool) {
    use cellmesh_control_plane::migration::{MigrationError, StopPoint};
    use cellmesh_proto::v1::update_route::Transition;
    use cellmesh_route_client::commands::update_route;
    {
        let d = deploy(None).await;
        let routes = d.cluster.client().await;
        let alice = token(1, 10);
        let mut m = messaging(&d.edge).await;
        let conversations = create_seeded(&mut m, &alice, 20, 1).await;
        let loaded = conversations[0];
        let senders = Senders::start(&d.edge, loaded, &[10, 11]);
        senders.until_acked(5, Duration::from_secs(10)).await;
        let stopping = Migrator::new(
            routes.clone(),
            ClusterSecret::new(SECRET),
            MigrationOptions {
                stop_after: Some(point),
                ..MigrationOptions::default()
            },
        );
        let stopped = stopping
            .migrate_tenant(TenantId(1), TARGET, 4, |_| {})
            .await;
        assert!(
            matches!(stopped, Err(MigrationError::Stopped(p)) if p == point),
            "{point:?}: {stopped:?}"
        );

        let mut writes = 4;
        if !cancel {
            // Resumed: the phases already recorded are not written again.
            writes = match point {
                StopPoint::Planned => 3,
                StopPoint::Copied => 2,
                _ => 1,
            };
        }
        // Cancelled there: back on the source, which takes writes again.
        // (The stopped move's last write may not be in this cache yet.)
        let epoch = routes
            .resolve_linearizable(&Key::tenant(TenantId(1)))
            .await
            .unwrap()
            .entry
            .unwrap()
            .epoch;
        let seq_after_cancel = if cancel { 2 } else { 1 };
        if cancel {
            let cancelled = routes
                .apply(update_route(
                    &Key::tenant(TenantId(1)),
                    epoch,
                    Transition::Cancel(true),
                ))
                .await
                .unwrap();
            routes
                .wait_applied(cancelled.index, Duration::from_secs(5))
                .await;
            let back = routes.read(|t| t.entry(&Key::tenant(TenantId(1))).cloned().unwrap());
            assert_eq!(
                (back.cell.as_str(), &back.state),
                (SOURCE, &RouteState::Active),
                "{point:?}"
            );
            let ack = m
                .send(authed(text(conversations[5], "after-cancel"), &alice))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(ack.seq, 2, "{point:?}: the source goes on after its seq");
        }
        // Writes flow again unless the move stopped with the tenant frozen
        // (then only the resumed move lets them through).
        let frozen = !cancel && matches!(point, StopPoint::Frozen | StopPoint::Sealed);
        if !frozen {
            senders.until_acked(20, Duration::from_secs(10)).await;
        }

        // Moved again: it finishes, and everything is on the target.
        let report = migrator(&routes)
            .migrate_tenant(TenantId(1), TARGET, 4, |_| {})
            .await
            .unwrap_or_else(|e| panic!("{point:?}: {e}"));
        assert_eq!(report.route_writes, writes, "{point:?} cancel {cancel}");
        // Writes flow on the target.
        senders
            .until_acked(senders.acked() + 5, Duration::from_secs(10))
            .await;
        let ops = senders.finish(Duration::from_millis(300)).await;
        let mut history = History {
            sends: ops,
            ..History::default()
        };
        history
            .conversations
            .insert(loaded, history_via_edge(&mut m, &alice, loaded).await);
        assert_every_invariant(&history);
        let h = history_via_edge(&mut m, &alice, conversations[5]).await;
        let tags: Vec<&str> = h.iter().map(|s| s.tag.as_str()).collect();
        let expected: &[&str] = if cancel {
            &["seed-5", "after-cancel"]
        } else {
            &["seed-5"]
        };
        assert_eq!(tags, expected, "{point:?}");
        for &c in &conversations {
            let owner = routes.read(|t| {
                t.resolve(&Key::conversation(TenantId(1), ConversationId(c)))
                    .unwrap()
                    .entry
                    .cell
            });
            assert_eq!(owner, TARGET, "{point:?}: conversation {c}");
        }
        // The target goes on after the source's last seq.
        let ack = m
            .send(authed(text(conversations[5], "on-target"), &alice))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(ack.seq, seq_after_cancel + 1, "{point:?}");
    }
}

/// A round of a tenant move asks the source what changed since its last
/// answer: only the conversations written since and the homes they
/// touched, never another tenant's; a token the cell does not know (of
/// another life) gets everything again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_marks_round_answers_only_what_changed_since_its_token() {
    let d = deploy(None).await;
    let routes = d.cluster.client().await;
    routes
        .apply(cellmesh_route_client::commands::assign_tenant(
            TenantId(2),
            SOURCE,
            0,
        ))
        .await
        .unwrap();
    let (alice, bob) = (token(1, 10), token(2, 10));
    let mut m = messaging(&d.edge).await;
    let conversations = create_seeded(&mut m, &alice, 5, 1).await;
    let other = create_seeded(&mut m, &bob, 1, 1).await[0];
    let mut peer =
        cellmesh_proto::v1::cell_peer_client::CellPeerClient::connect(d.cells[0].endpoint.clone())
            .await
            .unwrap();
    let mut marks = async |since: u64| {
        let mut r = tonic::Request::new(TenantMarksRequest {
            tenant_id: 1,
            since,
            ..Default::default()
        });
        ClusterSecret::new(SECRET).attach(&mut r);
        peer.tenant_marks(r).await.unwrap().into_inner()
    };
    let ids = |r: &TenantMarksResponse| {
        let c: Vec<u64> = r.conversations.iter().map(|m| m.id).collect();
        let u: Vec<u64> = r.users.iter().map(|m| m.id).collect();
        (c, u)
    };

    let all = marks(0).await;
    assert!(all.complete && all.token != 0);
    assert_eq!(ids(&all), (conversations.clone(), vec![10, 11]));
    // The seeds' fan-out (sync events, conversation lists) lands after
    // their acks; once it has, a round finds nothing.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut quiet = marks(all.token).await;
    while !(quiet.conversations.is_empty() && quiet.users.is_empty()) {
        assert!(!quiet.complete);
        assert!(Instant::now() < deadline, "still changing: {quiet:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        quiet = marks(quiet.token).await;
    }

    m.send(authed(text(conversations[2], "changed"), &alice))
        .await
        .unwrap();
    m.send(authed(text(other, "another tenant"), &bob))
        .await
        .unwrap();
    // The members' sync events are written by the fan-out after the ack.
    let deadline = Instant::now() + Duration::from_secs(10);
    let changed = loop {
        let changed = marks(quiet.token).await;
        let users = changed.users.iter().filter(|u| u.latest >= 2).count();
        if users == 2 || Instant::now() > deadline {
            break changed;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!changed.complete);
    assert_eq!(ids(&changed), (vec![conversations[2]], vec![10, 11]));
    assert_eq!(changed.conversations[0].latest, 2);
    assert!(changed.users.iter().all(|u| u.latest >= 2), "{changed:?}");

    // A token of another life of the cell: everything again.
    let stranger = marks(all.token ^ (1 << 40)).await;
    assert!(stranger.complete);
    assert_eq!(ids(&stranger).0, conversations);
}

/// The source of a tenant move marks the tenant sealed with one key under
/// the freeze, then its conversations and homes one by one off it; after
/// the grace period it drops their copies (history and sync queues), and
/// the marks are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_source_of_a_tenant_move_drops_its_copy_after_the_grace_period() {
    use cellmesh_cell::storage::moved;
    let d = deploy_with(None, |c| c.routing.cleanup_grace_secs = 1).await;
    let routes = d.cluster.client().await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conversations = create_seeded(&mut m, &alice, 3, 2).await;
    let source = d.cells[0].cell.service.store().clone();
    let user = |u| cellmesh_cell::UserKey::new(TenantId(1), u);
    assert!(
        !source
            .sync_after(user(UserId(11)), 0, 10)
            .unwrap()
            .is_empty()
    );
    let migrator = migrator(&routes);
    migrator
        .migrate_tenant(TenantId(1), TARGET, 4, |_| {})
        .await
        .expect("the move succeeds");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let held = conversations
            .iter()
            .filter(|&&c| source.message(ConversationId(c), 1).unwrap().is_some())
            .count();
        let homes = [10, 11]
            .iter()
            .filter(|&&u| {
                !source
                    .sync_after(user(UserId(u)), 0, 10)
                    .unwrap()
                    .is_empty()
            })
            .count();
        let marks: usize = [moved::TENANT, moved::CONVERSATION, moved::USER]
            .iter()
            .map(|&k| source.moved(k).unwrap().len())
            .sum();
        if (held, homes, marks) == (0, 0, 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{held} conversations and {homes} homes still held, {marks} marks"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The target holds everything.
    for &c in &conversations {
        assert_eq!(history_via_edge(&mut m, &alice, c).await.len(), 2);
    }
}

/// A tenant moved away and failed back onto the cell it left, then moved
/// again before any device or event reached its users there: the homes
/// copied with the tenant do not carry the queue ids of the copies left
/// behind, which lack what arrived after the first move. A device
/// resuming at the new home is rebased onto a new queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_failed_back_and_moved_on_does_not_take_its_homes_old_queue_ids_along() {
    use cellmesh_tests::homes::{first_push, mark_up, moved_then_failed_back};
    let d = deploy(None).await;
    let move_tenant = async |routes: &RouteClient| {
        let migrator = migrator(routes);
        let moved = migrator
            .migrate_tenant(TenantId(1), TARGET, 4, |_| {})
            .await;
        moved.expect("the tenant moves");
    };
    let back = moved_then_failed_back(&d, UserId(11), (SOURCE, TARGET), move_tenant).await;
    let routes = d.cluster.client().await;
    mark_up(&routes, TARGET).await;
    move_tenant(&routes).await;
    let (queue, last_pts) = (back.queue, back.last_pts);
    let resumed = first_push(&d.edge.endpoint(), UserId(11), last_pts, queue).await;
    let (now_queue, latest, rebased) = resumed;
    assert!(rebased, "a device beyond the moved copy is rebased");
    assert_ne!(
        now_queue, queue,
        "the copy left behind moved on under the old queue id (latest pts {latest}, the device had {last_pts})"
    );
}
