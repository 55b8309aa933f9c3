//! Live migration of a conversation between two cells while clients keep
//! sending through the edge: nothing acknowledged is lost or duplicated, seq
//! keeps increasing, the target's history equals the source's, the source
//! answers WRONG_CELL afterwards, and retries of requests acknowledged
//! before the move are answered from the migrated idempotency records.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellmesh_chaos::check_all;
use cellmesh_chaos::history::{History, Migration, Outcome, SendOp, Stored};
use cellmesh_control_plane::migration::{MigrationError, MigrationOptions, Migrator, StopPoint};
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::*;
use cellmesh_tests::deploy::*;
use cellmesh_tests::router::SECRET;
use tonic::transport::Channel;

async fn export_all(address: &str, tenant: u64, conversation: u64) -> Vec<Stored> {
    let mut peer = CellPeerClient::connect(address.to_string()).await.unwrap();
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let mut r = tonic::Request::new(ExportRequest {
            tenant_id: tenant,
            conversation_id: conversation,
            after_seq: after,
            limit: 1000,
        });
        ClusterSecret::new(SECRET).attach(&mut r);
        let chunk = peer.export_conversation(r).await.unwrap().into_inner();
        let Some(last) = chunk.messages.last().map(|m| m.seq) else {
            return out;
        };
        for m in chunk.messages {
            let record = m.record.unwrap();
            out.push(Stored {
                seq: m.seq,
                msg_id: record.msg_id,
                tag: String::from_utf8_lossy(&record.body).into_owned(),
            });
        }
        after = last;
    }
}

const PREFILL_WRITERS: u64 = 64;

/// `count` messages straight into the owning cell, [`PREFILL_WRITERS`] at
/// a time (the cell commits concurrent sends together: more writers, fewer
/// fsyncs per message).
async fn prefill(cell: &str, conversation: u64, count: u64) -> Vec<SendOp> {
    let mut tasks = Vec::new();
    for w in 0..PREFILL_WRITERS {
        let cell = cell.to_string();
        tasks.push(tokio::spawn(async move {
            let channel = Channel::from_shared(cell).unwrap().connect().await.unwrap();
            let mut client = MessagingClient::new(channel);
            let mut ops = Vec::new();
            for n in (w..count).step_by(PREFILL_WRITERS as usize) {
                let tag = format!("p{n}");
                let request = SendRequest {
                    caller: cellmesh_tests::caller(1, 10),
                    ..text(conversation, &tag)
                };
                let reply = cellmesh_tests::send_direct(&mut client, request).await;
                ops.push(SendOp {
                    conversation,
                    sender: 10,
                    client_req_id: tag,
                    invoked_ms: 0,
                    completed_ms: 0,
                    outcome: Outcome::Ok {
                        msg_id: reply.msg_id,
                        seq: reply.seq,
                    },
                });
            }
            ops
        }));
    }
    let mut ops = Vec::new();
    for t in tasks {
        ops.extend(t.await.unwrap());
    }
    ops
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_moves_under_load_without_loss_duplicates_or_reordering() {
    move_under_load(0, 50).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_with_100k_messages_moves_under_load() {
    move_under_load(100_000, 1_000).await;
}

/// Moves a conversation holding `history` messages while two clients keep
/// sending through the edge, and checks every invariant.
async fn move_under_load(history: u64, chunk: u32) {
    let d = deploy(None).await;
    let (source, target) = (&d.cells[0], &d.cells[1]);
    let alice = token(1, 10);
    let bob = token(1, 11);
    let mut m = messaging(&d.edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    let started = Instant::now();
    let prefilled = prefill(&source.endpoint, conv, history).await;
    if history > 0 {
        println!(
            "prefilled {history} messages in {} ms",
            started.elapsed().as_millis()
        );
    }
    // History before the move, including a request we will retry after it.
    let before = m
        .send(authed(text(conv, "before-1"), &alice))
        .await
        .unwrap()
        .into_inner();
    m.mark_read(authed(
        MarkReadRequest {
            conversation_id: conv,
            read_seq: before.seq,
            ..Default::default()
        },
        &bob,
    ))
    .await
    .unwrap();

    let senders = Senders::start(&d.edge, conv, &[10, 11]);
    senders.until_acked(20, Duration::from_secs(10)).await;

    let migrator = Migrator::new(
        d.cluster.client().await,
        ClusterSecret::new(SECRET),
        MigrationOptions {
            chunk,
            ..MigrationOptions::default()
        },
    );
    let mut phases = Vec::new();
    let report = migrator
        .migrate_conversation(TenantId(1), ConversationId(conv), "us-east/c1", |p| {
            phases.push(p.phase)
        })
        .await
        .expect("migration succeeds");
    let switch_ms = senders.now_ms();
    println!(
        "migrated {} messages, final seq {}, writes refused for {} ms, total {} ms",
        report.messages_verified,
        report.final_seq,
        report.frozen_for.as_millis(),
        report.total.as_millis()
    );
    assert!(
        phases.contains(&"copy") && phases.contains(&"switched"),
        "{phases:?}"
    );
    // Sends go on for a while on the target, then stop.
    let mut ops = senders.finish(Duration::from_secs(1)).await;
    let acked_after_switch = ops
        .iter()
        .filter(|o| o.invoked_ms > switch_ms && matches!(o.outcome, Outcome::Ok { .. }))
        .count();
    assert!(acked_after_switch > 0, "sends continued on the target");
    let rejected: Vec<_> = ops
        .iter()
        .filter(|o| !matches!(o.outcome, Outcome::Ok { .. }))
        .collect();
    assert!(
        rejected.is_empty(),
        "the edge hid the move from clients: {:?}",
        &rejected[..rejected.len().min(3)]
    );

    // The source's copy (it keeps it until cleanup) is a prefix of the target's.
    let source_history = export_all(&source.endpoint, 1, conv).await;
    let target_history = export_all(&target.endpoint, 1, conv).await;
    assert!(target_history.len() as u64 > history);
    ops.extend(prefilled);
    assert_eq!(source_history.last().map(|s| s.seq), Some(report.final_seq));
    let mut history = History {
        sends: ops,
        ..History::default()
    };
    history.conversations.insert(conv, target_history.clone());
    history.migrations.push(Migration {
        conversation: conv,
        source: "eu-west/c1".into(),
        target: "us-east/c1".into(),
        switch_ms,
        source_history,
        target_history,
    });
    assert_every_invariant(&history);

    // The source refuses writes now; a retry of a request acknowledged
    // before the move gets its original answer from the target.
    let mut direct = source.client().await;
    let mut r = tonic::Request::new(SendRequest {
        caller: cellmesh_tests::caller(1, 10),
        ..text(conv, "late")
    });
    ClusterSecret::new(SECRET).attach(&mut r);
    let e = direct.send(r).await.unwrap_err();
    assert_eq!(error_detail(&e).code, ErrorCode::WrongCell as i32);
    let again = m
        .send(authed(text(conv, "before-1"), &alice))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((again.msg_id, again.seq), (before.msg_id, before.seq));
    // Read positions moved too.
    let listed = m
        .get_conversation(authed(
            GetConversationRequest {
                conversation_id: conv,
                ..Default::default()
            },
            &bob,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(listed.read_seq >= before.seq, "{listed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_interrupted_in_any_phase_resumes_and_finishes() {
    let d = deploy(None).await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    for (i, point) in [
        StopPoint::Planned,
        StopPoint::Copied,
        StopPoint::Frozen,
        StopPoint::Sealed,
    ]
    .into_iter()
    .enumerate()
    {
        // A fresh sender per round: request ids are per sender.
        let user = 20 + i as u64;
        let conv = create_via_edge(&mut m, &alice, vec![user]).await;
        let senders = Senders::start(&d.edge, conv, &[user]);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let routes = d.cluster.client().await;
        let interrupted = Migrator::new(
            routes.clone(),
            ClusterSecret::new(SECRET),
            MigrationOptions {
                chunk: 20,
                stop_after: Some(point),
                ..MigrationOptions::default()
            },
        )
        .migrate_conversation(TenantId(1), ConversationId(conv), "us-east/c1", |_| {})
        .await;
        assert!(
            matches!(interrupted, Err(MigrationError::Stopped(p)) if p == point),
            "{interrupted:?}"
        );
        // A new control plane picks it up from the route table.
        let report = Migrator::new(
            routes,
            ClusterSecret::new(SECRET),
            MigrationOptions::default(),
        )
        .migrate_conversation(TenantId(1), ConversationId(conv), "us-east/c1", |_| {})
        .await
        .unwrap_or_else(|e| panic!("resume after {point:?}: {e}"));
        // They send for 1.5 s from the start, whenever the move ends.
        let left = Duration::from_millis(1500).saturating_sub(senders.epoch.elapsed());
        let switch_ms = senders.now_ms();
        let ops = senders.finish(left).await;
        let failed: Vec<_> = ops
            .iter()
            .filter(|o| !matches!(o.outcome, Outcome::Ok { .. }))
            .collect();
        assert!(
            failed.is_empty(),
            "{point:?}: {} failed, e.g. {:?}",
            failed.len(),
            failed.first()
        );
        let target_history = export_all(&d.cells[1].endpoint, 1, conv).await;
        let mut history = History {
            sends: ops,
            ..History::default()
        };
        history.conversations.insert(conv, target_history.clone());
        history.migrations.push(Migration {
            conversation: conv,
            source: "eu-west/c1".into(),
            target: "us-east/c1".into(),
            switch_ms,
            source_history: export_all(&d.cells[0].endpoint, 1, conv).await,
            target_history,
        });
        for verdict in check_all(&history) {
            assert!(
                verdict.holds,
                "{point:?} {}: {:?}",
                verdict.invariant, verdict.counterexamples
            );
        }
        assert!(report.final_seq > 0, "{point:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recall_made_after_the_copy_is_never_lost_by_the_move() {
    let d = deploy(None).await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    let first = m
        .send(authed(text(conv, "r1"), &alice))
        .await
        .unwrap()
        .into_inner();
    for i in 2..=20 {
        m.send(authed(text(conv, &format!("r{i}")), &alice))
            .await
            .unwrap();
    }
    let routes = d.cluster.client().await;
    let migrator = |stop_after| {
        Migrator::new(
            routes.clone(),
            ClusterSecret::new(SECRET),
            MigrationOptions {
                stop_after,
                ..MigrationOptions::default()
            },
        )
    };
    let stopped = migrator(Some(StopPoint::Copied))
        .migrate_conversation(TenantId(1), ConversationId(conv), "us-east/c1", |_| {})
        .await;
    assert!(
        matches!(stopped, Err(MigrationError::Stopped(_))),
        "{stopped:?}"
    );
    // The source still owns the conversation: the recall lands there,
    // after the target copied the message.
    m.recall(authed(
        RecallRequest {
            conversation_id: conv,
            seq: first.seq,
            ..Default::default()
        },
        &alice,
    ))
    .await
    .unwrap();
    let resumed = migrator(None)
        .migrate_conversation(TenantId(1), ConversationId(conv), "us-east/c1", |_| {})
        .await;
    let owner = routes
        .resolve(&cellmesh_route_client::table::Key::conversation(
            TenantId(1),
            ConversationId(conv),
        ))
        .unwrap()
        .entry;
    match resumed {
        // Whole verification caught the stale copy and rolled back.
        Err(MigrationError::Mismatch { .. }) => {
            assert_eq!(owner.cell, "eu-west/c1");
            assert_eq!(
                owner.state,
                cellmesh_route_client::table::RouteState::Active
            );
        }
        Ok(_) => assert_eq!(owner.cell, "us-east/c1"),
        Err(e) => panic!("{e}"),
    }
    let page = pull_via_edge(&mut m, &alice, conv).await;
    let recalled = page.messages.iter().find(|x| x.seq == first.seq).unwrap();
    assert_eq!(
        recalled.state,
        MessageState::Recalled as i32,
        "{recalled:?}"
    );
    assert_eq!(page.messages.len(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_migration_copies_nothing_until_resumed() {
    use cellmesh_proto::v1::update_route::Transition;
    use cellmesh_route_client::commands::update_route;
    use cellmesh_route_client::table::{Key, Phase, RouteState};
    let d = deploy(None).await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    for i in 0..300 {
        m.send(authed(text(conv, &format!("p{i}")), &alice))
            .await
            .unwrap();
    }
    let routes = d.cluster.client().await;
    let migrator = Migrator::new(
        routes.clone(),
        ClusterSecret::new(SECRET),
        MigrationOptions {
            chunk: 10,
            round_messages: 20,
            pause: Duration::from_millis(100),
            ..MigrationOptions::default()
        },
    );
    let phases = Arc::new(Mutex::new(Vec::new()));
    let moving = tokio::spawn({
        let phases = phases.clone();
        async move {
            migrator
                .migrate_conversation(TenantId(1), ConversationId(conv), "us-east/c1", |p| {
                    phases.lock().unwrap().push(p.phase)
                })
                .await
        }
    });
    let key = Key::conversation(TenantId(1), ConversationId(conv));
    let set_phase = |phase: MigrationPhase| {
        let routes = routes.clone();
        async move {
            let entry = routes.read(|t| t.entry(&key).cloned()).unwrap();
            routes
                .apply(update_route(
                    &key,
                    entry.epoch,
                    Transition::SetPhase(phase as i32),
                ))
                .await
        }
    };
    assert!(
        cellmesh_tests::eventually(Duration::from_secs(10), || {
            let copying = routes.read(|t| {
                matches!(
                    t.entry(&key).map(|e| &e.state),
                    Some(RouteState::Migrating {
                        phase: Phase::CatchUp,
                        ..
                    })
                )
            });
            async move { copying }
        })
        .await
    );
    set_phase(MigrationPhase::Paused).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = export_all(&d.cells[1].endpoint, 1, conv).await.len();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        export_all(&d.cells[1].endpoint, 1, conv).await.len(),
        held,
        "nothing is copied while paused"
    );
    assert!(held < 300, "paused before the end ({held})");
    assert!(phases.lock().unwrap().contains(&"paused"));
    // A paused migration cannot be frozen.
    let entry = routes.read(|t| t.entry(&key).cloned()).unwrap();
    assert!(
        routes
            .apply(update_route(&key, entry.epoch, Transition::Freeze(true)))
            .await
            .is_err()
    );
    set_phase(MigrationPhase::CatchUp).await.unwrap();
    let report = moving.await.unwrap().unwrap();
    assert_eq!(report.final_seq, 300);
    assert_eq!(report.messages_verified, 300);
}
