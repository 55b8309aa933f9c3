//! Replication mode `sync`: a write is acknowledged only once the standby
//! stored it, so a failover promotes a standby that already holds every
//! acknowledged message and answer — re-sends keep their first answer and
//! history is whole before the failed cell returns, with the asynchronous
//! answer shipping switched off. A standby that cannot be reached fails the
//! write with a stable code, and the retry is answered once it is back.

use cellmesh_proto::ids::{ConversationId, TenantId};
use cellmesh_proto::reason::Reason;
use std::time::Duration;

use cellmesh_cell::config::ReplicationMode;
use cellmesh_cell::failpoints;
use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1::*;
use cellmesh_route_client::table::Key;
use cellmesh_tests::deploy::*;
use cellmesh_tests::{TestCell, eventually};

use super::exactly_once::{
    FAILED, FALLBACK, answer_key, fail_first_cell, failover_deployment_with, resend, send_before,
};

fn sync_mode(config: &mut cellmesh_cell::CellConfig) {
    config.replication.mode = ReplicationMode::Sync;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_sync_mode_a_failover_keeps_every_acknowledged_message_and_answer() {
    let (mut d, routes, cp, alice, mut m, conv) = failover_deployment_with(sync_mode).await;
    // The asynchronous copy of answers is off: only the synchronous one
    // can answer re-sends after the failover.
    let points = failpoints::parse("standby.answers=error").unwrap();
    d.cells[0].cell.service.store().failpoints().set(points);
    let answers = send_before(&mut m, &alice, conv, 20).await;
    m.recall(authed(
        RecallRequest {
            caller: None,
            conversation_id: conv,
            seq: answers[4].seq,
        },
        &alice,
    ))
    .await
    .unwrap();
    // Stored on the standby before the ack: no waiting here.
    let standby = d.cells[1].cell.service.store().clone();
    for (i, answer) in answers.iter().enumerate() {
        let held = standby
            .idempotency(&answer_key(&format!("before-{i}")))
            .unwrap()
            .unwrap_or_else(|| panic!("the standby holds the answer to before-{i}"));
        assert_eq!((held.seq, held.msg_id), (answer.seq, answer.msg_id));
        let message = standby
            .message(ConversationId(conv), answer.seq)
            .unwrap()
            .unwrap();
        assert_eq!(message.msg_id, answer.msg_id);
    }
    let recalled = standby
        .message(ConversationId(conv), answers[4].seq)
        .unwrap()
        .unwrap();
    assert_eq!(recalled.state, MessageState::Recalled as i32);
    wait_for_checkpoint(&routes, conv, answers[19].seq, Duration::from_secs(10)).await;

    let dir = fail_first_cell(&mut d, conv).await;
    for i in [0, 4, 11, 19] {
        let again = resend(&mut m, &alice, conv, i).await;
        assert_eq!(
            (again.seq, again.msg_id, again.duplicate),
            (answers[i].seq, answers[i].msg_id, true),
            "re-send of before-{i} after the failover"
        );
    }
    // History is whole on the new owner before the failed cell returns.
    let page = pull_via_edge(&mut m, &alice, conv).await;
    assert_eq!(page.unavailable_through, 0, "nothing waits for a backfill");
    let seqs: Vec<u64> = page.messages.iter().map(|x| x.seq).collect();
    let acked: Vec<u64> = answers.iter().map(|a| a.seq).collect();
    assert_eq!(seqs, acked);
    // A recall served by the new owner outlives the backfill.
    m.recall(authed(
        RecallRequest {
            caller: None,
            conversation_id: conv,
            seq: answers[9].seq,
        },
        &alice,
    ))
    .await
    .unwrap();
    // The promoted standby indexed what it stored before the ack: search
    // answers from it at once, the recalls left out.
    let search = SearchRequest {
        query: "before".into(),
        conversation_id: conv,
        page_size: 100,
        ..Default::default()
    };
    let found = eventually(Duration::from_secs(10), || {
        let (mut m, r, alice) = (m.clone(), search.clone(), alice.clone());
        async move {
            let hits = m.search(authed(r, &alice)).await.unwrap().into_inner().hits;
            hits.len() == 18
        }
    })
    .await;
    assert!(found, "the new owner did not find the replicated history");

    let _returned =
        TestCell::start_routed_with(FAILED, d.cluster.endpoints(), dir, sync_mode).await;
    wait_for_backfill(&cp, FAILED, Duration::from_secs(20)).await;
    let history = history_via_edge(&mut m, &alice, conv).await;
    let tags: Vec<String> = history.iter().map(|s| s.tag.clone()).collect();
    let expected: Vec<String> = (0..20)
        .map(|i| match i {
            4 | 9 => format!("tombstone-{}", answers[i].seq),
            _ => format!("before-{i}"),
        })
        .collect();
    assert_eq!(
        tags, expected,
        "every acknowledged send once, rewrites kept"
    );
    let again = resend(&mut m, &alice, conv, 12).await;
    assert_eq!((again.seq, again.duplicate), (answers[12].seq, true));
    // The failed cell's late writes are refused by the promoted standby.
    assert!(routes.read(|t| {
        t.resolve(&Key::conversation(TenantId(1), ConversationId(conv)))
            .unwrap()
            .entry
            .cell
            == FALLBACK
    }));
    cp.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_sync_mode_a_write_the_standby_did_not_store_is_not_acknowledged() {
    let mut d = deploy_with(None, sync_mode).await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    let first = m
        .send(authed(text(conv, "first"), &alice))
        .await
        .unwrap()
        .into_inner();

    let standby = d.cells.remove(1);
    let standby_dir = standby.stop().await;
    let e = m
        .send(authed(text(conv, "second"), &alice))
        .await
        .unwrap_err();
    assert_reason(
        &e,
        ErrorCode::RetryLater,
        Reason::StandbyUnreachable.as_str(),
    );

    // Back (on a new port it registers): the retry is answered with the
    // seq the failed attempt stored, now on the standby too.
    let back =
        TestCell::start_routed_with(FALLBACK, d.cluster.endpoints(), standby_dir, sync_mode).await;
    let routes = d.cluster.client().await;
    let endpoint = back.endpoint.clone();
    let registered = eventually(Duration::from_secs(10), || {
        let moved = routes.read(|t| t.cell(FALLBACK).is_some_and(|c| c.address == endpoint));
        async move { moved }
    })
    .await;
    assert!(registered, "the standby registered its new address");
    let second = m
        .send(authed(text(conv, "second"), &alice))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.seq, first.seq + 1);
    assert!(second.duplicate, "answered from the stored attempt");
    let held = back
        .cell
        .service
        .store()
        .message(ConversationId(conv), second.seq)
        .unwrap();
    assert_eq!(held.map(|h| h.msg_id), Some(second.msg_id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_refuses_to_store_a_replica_of_what_it_owns() {
    let d = deploy(None).await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    let mut peer =
        cellmesh_proto::v1::cell_peer_client::CellPeerClient::connect(d.cells[0].endpoint.clone())
            .await
            .unwrap();
    let mut request = tonic::Request::new(ReplicateRequest {
        source_cell: FALLBACK.into(),
        writes: vec![ReplicatedWrite {
            tenant_id: 1,
            conversation_id: conv,
            message: Some(StoredMessage {
                seq: 1,
                record: Some(Default::default()),
            }),
            ..Default::default()
        }],
    });
    cellmesh_proto::secret::ClusterSecret::new(cellmesh_tests::router::SECRET).attach(&mut request);
    let e = peer.replicate(request).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    assert_eq!(error_detail(&e).reason, Reason::NotAStandby.as_str());
}

/// A standby stores messages only of a conversation it holds the record
/// of: a write of an unknown conversation without its meta is refused
/// (retryably), with it the conversation and message are stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_refuses_messages_of_a_conversation_it_has_no_record_of() {
    let d = deploy(None).await;
    // A conversation of tenant 1 (owned by eu-west/c1) no cell holds yet:
    // its meta has reached no standby.
    let conv = u64::MAX / 3;
    let record = Conversation {
        kind: ConversationKind::Group as i32,
        title: "t".into(),
        created_by: 10,
        created_at_ms: 1,
        ..Default::default()
    };
    // us-east/c1 owns nothing of tenant 1: it is a standby here.
    let mut peer =
        cellmesh_proto::v1::cell_peer_client::CellPeerClient::connect(d.cells[1].endpoint.clone())
            .await
            .unwrap();
    let write = |seq: u64, meta: Option<ConversationMeta>| {
        let mut request = tonic::Request::new(ReplicateRequest {
            source_cell: "eu-west/c1".into(),
            writes: vec![ReplicatedWrite {
                tenant_id: 1,
                conversation_id: conv,
                message: Some(StoredMessage {
                    seq,
                    record: Some(Default::default()),
                }),
                meta,
                ..Default::default()
            }],
        });
        cellmesh_proto::secret::ClusterSecret::new(cellmesh_tests::router::SECRET)
            .attach(&mut request);
        request
    };
    let e = peer.replicate(write(1, None)).await.unwrap_err();
    assert_eq!(
        error_detail(&e).reason,
        Reason::StandbyLacksMeta.as_str(),
        "{e}"
    );
    assert_eq!(error_detail(&e).code, ErrorCode::RetryLater as i32);
    let meta = ConversationMeta {
        record: Some(cellmesh_proto::storage::v1::ConversationRecord {
            tenant_id: 1,
            kind: record.kind,
            title: record.title.clone(),
            created_by: record.created_by,
            created_at_ms: record.created_at_ms,
            member_count: 2,
            admins: Vec::new(),
        }),
        members: vec![10, 11],
    };
    // Another tenant's record is refused.
    let mut foreign = meta.clone();
    foreign.record.as_mut().unwrap().tenant_id = 2;
    let e = peer.replicate(write(1, Some(foreign))).await.unwrap_err();
    assert_eq!(error_detail(&e).reason, Reason::WrongTenant.as_str(), "{e}");
    let stored = peer.replicate(write(1, Some(meta))).await.unwrap();
    assert_eq!(stored.into_inner().stored, 1);
    // Now the standby holds the record: later writes need no meta.
    let stored = peer.replicate(write(2, None)).await.unwrap();
    assert_eq!(stored.into_inner().stored, 1);
}

/// In sync mode an answer can reach a standby (through the forward queue)
/// ahead of its message, when the owner hangs between the two: after the
/// failover a re-send of that request is neither acknowledged (the message
/// is not on the new owner) nor refused as unknown — it stays open until
/// the failed cell returns and is backfilled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_sync_mode_an_answer_whose_message_never_arrived_waits_for_the_backfill() {
    let (mut d, routes, cp, alice, mut m, conv) = failover_deployment_with(sync_mode).await;
    let answers = send_before(&mut m, &alice, conv, 5).await;
    wait_for_checkpoint(&routes, conv, 5, Duration::from_secs(10)).await;
    // The answer to "ghost" reached the standby; its message did not.
    let standby = d.cells[1].cell.service.store().clone();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut planted = cellmesh_cell::storage::Mutation::new();
    planted.put_idempotency(
        &answer_key("ghost"),
        &cellmesh_proto::storage::v1::IdempotencyRecord {
            conversation_id: conv,
            msg_id: answers[4].msg_id + 1,
            seq: answers[4].seq + 1,
            server_ts_ms: now,
            expires_at_ms: now + 3_600_000,
        },
    );
    standby.commit(planted).await.unwrap();

    let _dir = fail_first_cell(&mut d, conv).await;
    let e = m
        .send(authed(text(conv, "ghost"), &alice))
        .await
        .unwrap_err();
    assert_reason(&e, ErrorCode::RetryLater, Reason::AwaitingBackfill.as_str());
    // Requests whose messages it holds are answered as before.
    let again = resend(&mut m, &alice, conv, 3).await;
    assert_eq!((again.seq, again.duplicate), (answers[3].seq, true));
    cp.stop();
}

/// A tenant bound to its cell's region gets no copy on the standby in the
/// other region — its sync writes are acknowledged with no standby inside
/// its regions — while an unbound tenant's writes reach that standby.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_bound_to_a_region_is_not_replicated_outside_it() {
    use cellmesh_route_client::commands::assign_tenant;
    let d = deploy_with(None, sync_mode).await;
    let routes = d.cluster.client().await;
    bind_regions(&routes, TenantId(1), &["eu-west"]).await;
    let placed = routes
        .apply(assign_tenant(TenantId(2), FAILED, 0))
        .await
        .unwrap();
    assert!(
        routes
            .wait_applied(placed.index, Duration::from_secs(5))
            .await
    );
    // The cells and the edge follow the table's watch.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut m = messaging(&d.edge).await;
    let standby = d.cells[1].cell.service.store();
    for (tenant, replicated) in [(1, false), (2, true)] {
        let caller = token(tenant, 10);
        let conv = create_via_edge(&mut m, &caller, vec![11]).await;
        let sent = m
            .send(authed(text(conv, "where is it"), &caller))
            .await
            .unwrap()
            .into_inner();
        let held = standby.message(ConversationId(conv), sent.seq).unwrap();
        assert_eq!(held.is_some(), replicated, "tenant {tenant}");
        let meta = standby.conversation(ConversationId(conv)).unwrap();
        assert_eq!(
            meta.is_some(),
            replicated,
            "tenant {tenant}'s conversation record"
        );
    }
}
