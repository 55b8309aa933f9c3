//! Bad input gets a clear error with a stable code and reason, and the
//! server keeps serving (and its data stays intact) afterwards.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::reason::Reason;
use cellmesh_proto::status::{error_code, error_detail};
use cellmesh_proto::v1::*;
use cellmesh_tests::router::with_secret;
use cellmesh_tests::*;
use tonic::codegen::http::uri::PathAndQuery;

const T: u64 = 11;

/// A request whose field 1 (the caller, a nested message) holds bytes that
/// do not decode: malformed protobuf on the wire.
#[derive(Clone, PartialEq, prost::Message)]
struct Garbage {
    #[prost(bytes = "vec", tag = "1")]
    junk: Vec<u8>,
}

async fn send_garbage(endpoint: &str) -> tonic::Status {
    let channel = tonic::transport::Channel::from_shared(endpoint.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let codec = tonic_prost::ProstCodec::<Garbage, SendResponse>::default();
    grpc.unary(
        tonic::Request::new(Garbage {
            junk: vec![0xff, 0xff, 0xff, 0xff, 0x0f],
        }),
        PathAndQuery::from_static("/cellmesh.v1.Messaging/Send"),
        codec,
    )
    .await
    .unwrap_err()
}

/// A call refused as expected: its name, what it got, the code and reason
/// it should get.
type Case = (
    &'static str,
    Result<(), tonic::Status>,
    ErrorCode,
    &'static str,
);

macro_rules! case {
    ($cases:ident, $name:expr, $call:expr, $code:expr, $reason:expr) => {
        $cases.push(($name, $call.await.map(|_| ()), $code, $reason));
    };
}

/// Malformed and refused sends into `conv` (a group of 1 and 2; `direct`
/// is theirs too).
async fn send_cases(c: &mut Client, conv: u64, direct: u64, cases: &mut Vec<Case>) {
    use ErrorCode::*;
    let max_body = cellmesh_cell::CellConfig::default().limits.max_body_bytes;
    let with = |f: fn(&mut SendRequest)| {
        let mut r = text(T, 1, conv, "bad", "x");
        f(&mut r);
        r
    };
    case!(
        cases,
        "no caller",
        c.send(with(|r| r.caller = None)),
        Unauthenticated,
        Reason::NoCaller.as_str()
    );
    case!(
        cases,
        "zero user",
        c.send(with(|r| r.caller = caller(T, 0))),
        Unauthenticated,
        Reason::NoCaller.as_str()
    );
    case!(
        cases,
        "no conversation",
        c.send(with(|r| r.conversation_id = 0)),
        InvalidArgument,
        Reason::MissingConversationId.as_str()
    );
    case!(
        cases,
        "unknown conversation",
        c.send(with(|r| r.conversation_id = 424242)),
        NotFound,
        Reason::ConversationNotFound.as_str()
    );
    case!(
        cases,
        "empty body",
        c.send(with(|r| r.body.clear())),
        InvalidArgument,
        Reason::EmptyBody.as_str()
    );
    let mut big = text(T, 1, conv, "big", "");
    big.body = vec![b'a'; max_body + 1];
    case!(
        cases,
        "oversize body",
        c.send(big),
        InvalidArgument,
        Reason::BodyTooLarge.as_str()
    );
    let mut huge = text(T, 1, conv, "huge", "");
    huge.body = vec![b'a'; 8 * 1024 * 1024];
    case!(
        cases,
        "body over the transport limit",
        c.send(huge),
        InvalidArgument,
        "GRPC_OUTOFRANGE"
    );
    case!(
        cases,
        "unknown type",
        c.send(with(|r| r.r#type = 99)),
        InvalidArgument,
        Reason::UnknownMessageType.as_str()
    );
    case!(
        cases,
        "unspecified type",
        c.send(with(|r| r.r#type = 0)),
        InvalidArgument,
        Reason::UnknownMessageType.as_str()
    );
    case!(
        cases,
        "no client_req_id",
        c.send(with(|r| r.client_req_id.clear())),
        InvalidArgument,
        Reason::MissingClientReqId.as_str()
    );
    case!(
        cases,
        "long client_req_id",
        c.send(with(|r| r.client_req_id = "x".repeat(500))),
        InvalidArgument,
        Reason::ClientReqIdTooLong.as_str()
    );
    // Another tenant's conversation is answered as one that does not exist.
    case!(
        cases,
        "wrong tenant",
        c.send(with(|r| r.caller = caller(T + 1, 1))),
        NotFound,
        Reason::ConversationNotFound.as_str()
    );
    case!(
        cases,
        "not a member",
        c.send(with(|r| r.caller = caller(T, 99))),
        PermissionDenied,
        Reason::NotAMember.as_str()
    );
    case!(
        cases,
        "req id reused elsewhere",
        c.send(text(T, 1, direct, "ok-1", "x")),
        InvalidArgument,
        Reason::ClientReqIdReused.as_str()
    );
}

/// Malformed and refused calls other than sends; `seq` is a message of
/// user 1 in `conv`.
async fn other_call_cases(c: &mut Client, conv: u64, direct: u64, seq: u64, cases: &mut Vec<Case>) {
    use ErrorCode::*;
    case!(
        cases,
        "unknown direction",
        c.pull(PullRequest {
            caller: caller(T, 1),
            conversation_id: conv,
            direction: 7,
            ..Default::default()
        }),
        InvalidArgument,
        Reason::UnknownDirection.as_str()
    );
    case!(
        cases,
        "pull by non-member",
        c.pull(PullRequest {
            caller: caller(T, 50),
            conversation_id: conv,
            ..Default::default()
        }),
        PermissionDenied,
        Reason::NotAMember.as_str()
    );
    case!(
        cases,
        "direct with three",
        c.create_conversation(CreateConversationRequest {
            caller: caller(T, 1),
            kind: ConversationKind::Direct as i32,
            member_ids: vec![2, 3],
            ..Default::default()
        }),
        InvalidArgument,
        Reason::DirectNeedsTwoMembers.as_str()
    );
    case!(
        cases,
        "no kind",
        c.create_conversation(CreateConversationRequest {
            caller: caller(T, 1),
            member_ids: vec![2],
            ..Default::default()
        }),
        InvalidArgument,
        Reason::UnknownConversationKind.as_str()
    );
    case!(
        cases,
        "user id zero",
        c.create_conversation(CreateConversationRequest {
            caller: caller(T, 1),
            kind: ConversationKind::Group as i32,
            member_ids: vec![0],
            ..Default::default()
        }),
        InvalidArgument,
        Reason::InvalidUserId.as_str()
    );
    case!(
        cases,
        "recall by another user",
        c.recall(RecallRequest {
            caller: caller(T, 2),
            conversation_id: conv,
            seq
        }),
        PermissionDenied,
        Reason::NotSender.as_str()
    );
    case!(
        cases,
        "recall unknown seq",
        c.recall(RecallRequest {
            caller: caller(T, 1),
            conversation_id: conv,
            seq: 999
        }),
        NotFound,
        Reason::MessageNotFound.as_str()
    );
    case!(
        cases,
        "edit seq zero",
        c.edit(EditRequest {
            caller: caller(T, 1),
            conversation_id: conv,
            seq: 0,
            body: b"e".to_vec()
        }),
        InvalidArgument,
        Reason::MissingSeq.as_str()
    );
    case!(
        cases,
        "edit to empty",
        c.edit(EditRequest {
            caller: caller(T, 1),
            conversation_id: conv,
            seq,
            body: vec![]
        }),
        InvalidArgument,
        Reason::EmptyBody.as_str()
    );
    case!(
        cases,
        "delete beyond latest",
        c.delete_for_me(DeleteForMeRequest {
            caller: caller(T, 1),
            conversation_id: conv,
            seqs: vec![5]
        }),
        InvalidArgument,
        Reason::SeqOutOfRange.as_str()
    );
    case!(
        cases,
        "delete nothing",
        c.delete_for_me(DeleteForMeRequest {
            caller: caller(T, 1),
            conversation_id: conv,
            seqs: vec![]
        }),
        InvalidArgument,
        Reason::BadSeqList.as_str()
    );
    case!(
        cases,
        "members of a direct",
        c.add_members(ChangeMembersRequest {
            caller: caller(T, 1),
            conversation_id: direct,
            user_ids: vec![3]
        }),
        InvalidArgument,
        Reason::NotAGroup.as_str()
    );
    case!(
        cases,
        "members by outsider",
        c.add_members(ChangeMembersRequest {
            caller: caller(T, 77),
            conversation_id: conv,
            user_ids: vec![3]
        }),
        PermissionDenied,
        Reason::NotAMember.as_str()
    );
}

/// Every case that did not get its code and reason, in one failure.
fn judge(cases: Vec<Case>) {
    let mut failures = Vec::new();
    for (name, result, code, reason) in cases {
        match result {
            Ok(()) => failures.push(format!("{name}: succeeded")),
            Err(status) => {
                let detail = error_detail(&status);
                if error_code(&status) != code || (!reason.is_empty() && detail.reason != reason) {
                    failures.push(format!(
                        "{name}: expected {code:?}/{reason}, got {:?}/{} ({})",
                        error_code(&status),
                        detail.reason,
                        detail.message
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn malformed_requests_get_stable_codes_and_the_server_keeps_serving() {
    let cell = TestCell::start().await;
    let mut c = cell.client().await;
    let conv = create_group(&mut c, T, 1, &[2]).await;
    let direct = c
        .create_conversation(CreateConversationRequest {
            caller: caller(T, 1),
            kind: ConversationKind::Direct as i32,
            member_ids: vec![2],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .conversation
        .unwrap()
        .conversation_id;
    let ok = c
        .send(text(T, 1, conv, "ok-1", "fine"))
        .await
        .unwrap()
        .into_inner();

    let mut cases = Vec::new();
    send_cases(&mut c, conv, direct, &mut cases).await;
    other_call_cases(&mut c, conv, direct, ok.seq, &mut cases).await;
    cases.push((
        "malformed protobuf",
        Err(send_garbage(&cell.endpoint).await),
        ErrorCode::InvalidArgument,
        Reason::MalformedRequest.as_str(),
    ));

    judge(cases);

    // Still serving, and nothing bad was stored.
    let next = c
        .send(text(T, 1, conv, "ok-2", "still here"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next.seq, ok.seq + 1);
    let history = pull_all(&mut c, T, 1, conv).await;
    assert_eq!(
        history.iter().map(|m| m.seq).collect::<Vec<_>>(),
        vec![1, 2]
    );
    cell.stop().await;
}

/// A migration chunk handed to a target is checked before anything of it is
/// stored: no chunk, another tenant's, or one whose messages do not match
/// their checksum are refused with stable codes; the good one is stored.
#[tokio::test]
async fn bad_migration_chunks_are_refused_and_store_nothing() {
    use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
    let (source, target) = (TestCell::start().await, TestCell::start().await);
    let mut c = source.client().await;
    let conv = create_group(&mut c, T, 1, &[2]).await;
    for i in 0..3 {
        let req = format!("m-{i}");
        c.send(text(T, 1, conv, &req, "moving")).await.unwrap();
    }
    let export = ExportRequest {
        tenant_id: T,
        conversation_id: conv,
        after_seq: 0,
        limit: 10,
    };
    let mut from = CellPeerClient::connect(source.endpoint.clone())
        .await
        .unwrap();
    let chunk = from.export_conversation(export).await.unwrap().into_inner();
    assert_eq!(chunk.messages.len(), 3);
    let mut to = CellPeerClient::connect(target.endpoint.clone())
        .await
        .unwrap();
    let store = |tenant_id, chunk| StoreChunkRequest {
        tenant_id,
        conversation_id: conv,
        chunk,
    };
    let mut corrupted = chunk.clone();
    corrupted.messages[1].record.as_mut().unwrap().body = b"tampered".to_vec();
    let cases = [
        (
            "no chunk",
            store(T, None),
            ErrorCode::InvalidArgument,
            Reason::EmptyChunk.as_str(),
        ),
        (
            "another tenant",
            store(T + 1, Some(chunk.clone())),
            ErrorCode::PermissionDenied,
            Reason::WrongTenant.as_str(),
        ),
        (
            "checksum mismatch",
            store(T, Some(corrupted)),
            ErrorCode::RetryLater,
            Reason::ChunkChecksum.as_str(),
        ),
    ];
    for (name, request, code, reason) in cases {
        let e = to.store_conversation_chunk(request).await.unwrap_err();
        assert_eq!(
            (error_code(&e), error_detail(&e).reason.as_str()),
            (code, reason),
            "{name}"
        );
        let digest = DigestRequest {
            conversation_id: conv,
            ..Default::default()
        };
        let held = to.conversation_digest(digest).await.unwrap().into_inner();
        assert_eq!(held.count, 0, "{name}: nothing is stored");
    }
    let stored = to
        .store_conversation_chunk(store(T, Some(chunk)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((stored.copied_through, stored.messages), (3, 3));
}

/// A copy pulls only from a cell the route table names: a caller-supplied
/// address (anywhere it likes, with the deployment's credentials) is
/// refused with a stable code, and nothing dials it.
#[tokio::test]
async fn copies_pull_only_from_registered_cells_never_from_a_made_up_address() {
    use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
    let d = cellmesh_tests::deploy::deploy(None).await;
    let trap = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let made_up = format!("http://{}", trap.local_addr().unwrap());
    let dialled = tokio::spawn(async move { trap.accept().await.is_ok() });
    let mut target = CellPeerClient::connect(d.cells[1].endpoint.clone())
        .await
        .unwrap();
    let refused = [
        target
            .copy_conversation(with_secret(CopyRequest {
                source_address: made_up.clone(),
                tenant_id: 1,
                conversation_id: 5,
                ..Default::default()
            }))
            .await
            .unwrap_err(),
        target
            .copy_conversations(with_secret(CopyManyRequest {
                source_address: made_up.clone(),
                tenant_id: 1,
                items: vec![ExportPosition {
                    conversation_id: 5,
                    after_seq: 0,
                }],
                limit: 10,
            }))
            .await
            .unwrap_err(),
        target
            .copy_user(with_secret(CopyUserRequest {
                source_address: made_up.clone(),
                tenant_id: 1,
                user_id: 7,
                ..Default::default()
            }))
            .await
            .unwrap_err(),
        target
            .copy_users(with_secret(CopyUsersRequest {
                source_address: made_up.clone(),
                tenant_id: 1,
                ..Default::default()
            }))
            .await
            .unwrap_err(),
    ];
    for e in refused {
        assert_eq!(
            (error_code(&e), error_detail(&e).reason.as_str()),
            (
                ErrorCode::InvalidArgument,
                Reason::BadSourceAddress.as_str()
            ),
            "{e:?}"
        );
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!dialled.is_finished(), "the made-up address was dialled");
    // The registered source is still reachable for a copy.
    let source = d.cells[0].endpoint.clone();
    let ok = target
        .copy_users(with_secret(CopyUsersRequest {
            source_address: source,
            tenant_id: 1,
            ..Default::default()
        }))
        .await;
    assert!(ok.is_ok(), "{ok:?}");
}

/// A batch of homes that names a user twice is refused before the source
/// is asked for anything: two imports of one home in one commit would
/// store the later over the earlier.
#[tokio::test]
async fn a_copy_batch_naming_a_user_twice_is_malformed() {
    use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
    let d = cellmesh_tests::deploy::deploy(None).await;
    let mut target = CellPeerClient::connect(d.cells[1].endpoint.clone())
        .await
        .unwrap();
    let home = |user_id| UserPosition {
        user_id,
        ..Default::default()
    };
    let e = target
        .copy_users(with_secret(CopyUsersRequest {
            source_address: d.cells[0].endpoint.clone(),
            source_cell: "eu-west/c1".into(),
            tenant_id: 1,
            items: vec![home(7), home(8), home(7)],
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(
        (error_code(&e), error_detail(&e).reason.as_str()),
        (
            ErrorCode::InvalidArgument,
            Reason::MalformedRequest.as_str()
        ),
        "{e:?}"
    );
    assert!(e.message().contains("user 7"), "{}", e.message());
}

/// A copy from a cell registered after the target's view of the route
/// table last moved (its watch stalled) is not refused as a made-up
/// address: the target asks the routers' leader before refusing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_from_a_cell_the_targets_view_has_not_seen_yet_asks_the_leader() {
    use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
    let cluster = cellmesh_tests::router::RouterCluster::start(1, |_| {}).await;
    let direct = cluster.endpoints();
    let link = cellmesh_chaos::proxy::FaultProxy::start(
        "127.0.0.1:0".parse().unwrap(),
        cluster.replicas[0].config.api_listen,
    )
    .await
    .unwrap();
    // The target follows the table through the link first.
    let mut routers = vec![format!("http://{}", link.addr())];
    routers.extend(direct.clone());
    let target = TestCell::start_routed("eu-west/c1", routers).await;
    link.partition(true, true);
    let source = TestCell::start_routed("eu-west/c2", direct).await;
    let mut peer = CellPeerClient::connect(target.endpoint.clone())
        .await
        .unwrap();
    let copied = peer
        .copy_user(with_secret(CopyUserRequest {
            source_address: source.endpoint.clone(),
            source_cell: "eu-west/c2".into(),
            tenant_id: 1,
            user_id: 7,
            ..Default::default()
        }))
        .await;
    let copied = copied.map(|r| r.into_inner().copied_through);
    assert!(copied.is_ok(), "{copied:?}");
}

/// A two-cell deployment with a conversation of users 10 and 11, created
/// and written to through the edge (owned by the first cell), a client of
/// the edge and user 10's token.
async fn deployed_conversation() -> (
    cellmesh_tests::deploy::Deployment,
    messaging_client::MessagingClient<tonic::transport::Channel>,
    String,
    u64,
) {
    use cellmesh_tests::deploy as dep;
    let d = dep::deploy(None).await;
    let alice = dep::token(1, 10);
    let mut m = messaging_client::MessagingClient::connect(d.edge.endpoint())
        .await
        .unwrap();
    let conv = dep::create_via_edge(&mut m, &alice, vec![11]).await;
    m.send(dep::authed(dep::text(conv, "original"), &alice))
        .await
        .unwrap();
    (d, m, alice, conv)
}

/// Copied history is stored only for a conversation the route table moves
/// to the cell: a chunk handed to its active owner, or to a cell it is
/// not moving to, is refused and changes nothing (members, bodies,
/// tenant).
#[tokio::test]
async fn a_chunk_for_a_conversation_not_moving_here_is_refused_and_changes_nothing() {
    use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
    let (d, _edge, _alice, conv) = deployed_conversation().await;
    let mut owner = CellPeerClient::connect(d.cells[0].endpoint.clone())
        .await
        .unwrap();
    let mut other = CellPeerClient::connect(d.cells[1].endpoint.clone())
        .await
        .unwrap();
    let export = ExportRequest {
        tenant_id: 1,
        conversation_id: conv,
        after_seq: 0,
        limit: 10,
    };
    let chunk = owner
        .export_conversation(with_secret(export))
        .await
        .unwrap()
        .into_inner();
    // A forged chunk: one more member, and a second one for another tenant.
    let mut forged = chunk.clone();
    forged.members.push(99);
    let mut other_tenant = chunk.clone();
    other_tenant.conversation.as_mut().unwrap().tenant_id = 2;
    let store = |tenant_id, chunk| StoreChunkRequest {
        tenant_id,
        conversation_id: conv,
        chunk: Some(chunk),
    };
    for (name, on_owner, request) in [
        ("its active owner", true, store(1, forged.clone())),
        ("a cell it is not moving to", false, store(1, forged)),
        ("its owner, as another tenant", true, store(2, other_tenant)),
    ] {
        let peer = if on_owner { &mut owner } else { &mut other };
        let e = peer
            .store_conversation_chunk(with_secret(request))
            .await
            .unwrap_err();
        assert_eq!(
            (error_code(&e), error_detail(&e).reason.as_str()),
            (ErrorCode::InvalidArgument, Reason::NotMovingHere.as_str()),
            "{name}: {e:?}"
        );
    }
    let members = d.cells[0]
        .cell
        .service
        .store()
        .members(ConversationId(conv), 0, 100)
        .unwrap()
        .0;
    assert_eq!(members, vec![10, 11], "the owner's members are unchanged");
    let held = d.cells[0]
        .cell
        .service
        .store()
        .conversation(ConversationId(conv))
        .unwrap()
        .unwrap();
    assert_eq!(held.tenant_id, 1);
    // The other cell (the owner's standby) holds no forged member either.
    let replica = d.cells[1]
        .cell
        .service
        .store()
        .members(ConversationId(conv), 0, 100)
        .unwrap()
        .0;
    assert!(!replica.contains(&99), "{replica:?}");
}

/// A conversation's meta and a send's answer are replicated only by the
/// conversation's owner to a cell that does not own it: a forged meta
/// (one more member) or answer delivered to the owner, or to its standby
/// from a cell that does not own the conversation or under another tenant,
/// changes nothing; the owner's own replication still reaches the standby.
#[tokio::test]
async fn replicated_meta_from_a_cell_that_does_not_own_the_conversation_is_refused() {
    use cellmesh_proto::storage::v1::IdempotencyRecord;
    use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
    use cellmesh_tests::deploy as dep;
    let (d, mut m, alice, conv) = deployed_conversation().await;
    let members = |cell: usize| {
        d.cells[cell]
            .cell
            .service
            .store()
            .members(ConversationId(conv), 0, 100)
            .unwrap()
            .0
    };
    assert!(
        eventually(std::time::Duration::from_secs(10), || async {
            members(1) == vec![10, 11]
        })
        .await,
        "the standby holds the replicated members: {:?}",
        members(1)
    );
    let record = d.cells[0]
        .cell
        .service
        .store()
        .conversation(ConversationId(conv))
        .unwrap()
        .unwrap();
    let forged_meta = |tenant_id| PeerEvent {
        tenant_id,
        conversation_id: conv,
        meta: Some(ConversationMeta {
            record: Some(record.clone()),
            members: vec![10, 11, 99],
        }),
        ..Default::default()
    };
    let forged_answer = PeerEvent {
        tenant_id: 1,
        conversation_id: conv,
        sender_id: 10,
        client_req_id: "forged".into(),
        idempotency: Some(IdempotencyRecord::default()),
        ..Default::default()
    };
    // The role decides, not the payload: a standby role without its
    // payload is refused, and meta on a user's event is never applied.
    let role_without_payload = PeerEvent {
        role: PeerEventRole::StandbyMeta as i32,
        ..forged_answer.clone()
    };
    let user_event_with_meta = PeerEvent {
        role: PeerEventRole::User as i32,
        user_id: 99,
        ..forged_meta(1)
    };
    let (owner, standby) = (d.cells[0].endpoint.clone(), d.cells[1].endpoint.clone());
    let mut peer = CellPeerClient::connect(standby.clone()).await.unwrap();
    let user_event = peer
        .deliver_batch(with_secret(DeliverBatchRequest {
            source_cell: "eu-west/c1".into(),
            events: vec![user_event_with_meta],
            route_index: 0,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(user_event.refused_standby_events, 0, "a user's event");
    for (name, to, source, event) in [
        (
            "a meta role without meta",
            &standby,
            "eu-west/c1",
            role_without_payload,
        ),
        ("meta to the owner", &owner, "us-east/c1", forged_meta(1)),
        ("answer to the owner", &owner, "us-east/c1", forged_answer),
        (
            "meta from a non-owner",
            &standby,
            "us-east/c9",
            forged_meta(1),
        ),
        (
            "meta as another tenant",
            &standby,
            "eu-west/c1",
            forged_meta(2),
        ),
    ] {
        let mut peer = CellPeerClient::connect(to.clone()).await.unwrap();
        let answer = peer
            .deliver_batch(with_secret(DeliverBatchRequest {
                source_cell: source.into(),
                events: vec![event],
                route_index: 0,
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (answer.applied, answer.refused_standby_events),
            (0, 1),
            "{name}"
        );
    }
    // From a sender whose route view is ahead of the standby's (it may
    // know a move the standby does not yet): left for later, not refused,
    // and nothing stored.
    let mut peer = CellPeerClient::connect(standby.clone()).await.unwrap();
    let ahead = peer
        .deliver_batch(with_secret(DeliverBatchRequest {
            source_cell: "us-east/c9".into(),
            events: vec![forged_meta(1)],
            route_index: u64::MAX / 2,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            ahead.applied,
            ahead.refused_standby_events,
            ahead.deferred_standby_events
        ),
        (0, 0, vec![0]),
        "meta from a view ahead of the standby's"
    );
    assert_eq!(members(0), vec![10, 11], "the owner's members");
    assert_eq!(members(1), vec![10, 11], "the standby's members");
    let key = cellmesh_cell::storage::IdemKey {
        kind: cellmesh_cell::storage::IdemKind::Send,
        tenant: TenantId(1),
        user: UserId(10),
        client_req_id: "forged".into(),
    };
    assert!(
        d.cells[0]
            .cell
            .service
            .store()
            .idempotency(&key)
            .unwrap()
            .is_none(),
        "no forged answer"
    );
    // The owner's own replication still lands: a member added through the
    // edge reaches the standby.
    m.add_members(dep::authed(
        ChangeMembersRequest {
            conversation_id: conv,
            user_ids: vec![12],
            ..Default::default()
        },
        &alice,
    ))
    .await
    .unwrap();
    assert!(
        eventually(std::time::Duration::from_secs(10), || async {
            members(1) == vec![10, 11, 12]
        })
        .await,
        "{:?}",
        members(1)
    );
}
