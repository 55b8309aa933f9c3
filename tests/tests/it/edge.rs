//! The edge and routed cells: clients authenticate with tokens, requests
//! reach the owning cell (also right after a route change the edge has not
//! seen yet), cells refuse what they do not own with WRONG_CELL and refuse
//! callers without the deployment secret.

use cellmesh_proto::ids::{TenantId, UserId};
use cellmesh_proto::reason::Reason;
use std::time::Duration;

use cellmesh_edge::RunningEdge;
use cellmesh_edge::auth::{Claims, TokenKey, now_secs};
use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::sync_client::SyncClient;
use cellmesh_proto::v1::*;
use cellmesh_route_client::commands::*;
use cellmesh_route_client::table::Key;
use cellmesh_tests::deploy::*;
use cellmesh_tests::router::*;
use cellmesh_tests::*;
use tonic::transport::Channel;

async fn edge_clients(edge: &RunningEdge) -> (MessagingClient<Channel>, SyncClient<Channel>) {
    let channel = Channel::from_shared(edge.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    (
        MessagingClient::new(channel.clone()),
        SyncClient::new(channel),
    )
}

fn send(conversation: u64, req_id: &str, body: &str) -> SendRequest {
    SendRequest {
        caller: None,
        conversation_id: conversation,
        client_req_id: req_id.into(),
        r#type: MessageType::Text as i32,
        body: body.as_bytes().to_vec(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_talk_through_the_edge_and_cells_refuse_what_they_do_not_own() {
    let d = deploy(None).await;
    let (mut m, mut s) = edge_clients(&d.edge).await;
    let alice = token(1, 10);
    let bob = token(1, 11);
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    let mut stream = s
        .subscribe(authed(
            SubscribeRequest {
                from_pts: 0,
                ..Default::default()
            },
            &bob,
        ))
        .await
        .expect("subscribe through the edge")
        .into_inner();
    // Streams outlive the edge's per-attempt timeout for unary calls.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let sent = m
        .send(authed(send(conv, "r1", "hello"), &alice))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(sent.seq, 1);
    let delivered = loop {
        let push = sync::next_push(&mut stream, Duration::from_secs(10))
            .await
            .expect("a push");
        if let Some(sync_push::Push::Event(e)) = push.push
            && e.kind == SyncEventKind::Message as i32
        {
            break e;
        }
    };
    assert_eq!((delivered.conversation_id, delivered.seq), (conv, 1));

    // The other cell does not own tenant 1: WRONG_CELL naming the owner.
    let mut wrong = d.cells[1].client().await;
    let mut direct = tonic::Request::new(SendRequest {
        caller: caller(1, 10),
        ..send(conv, "r2", "x")
    });
    cellmesh_proto::secret::ClusterSecret::new(SECRET).attach(&mut direct);
    let e = wrong.send(direct).await.unwrap_err();
    let detail = error_detail(&e);
    assert_eq!(detail.code, ErrorCode::WrongCell as i32, "{e}");
    let route = detail.route.expect("the current route");
    assert_eq!(route.cell_id, "eu-west/c1");
    assert_eq!(route.cell_address, d.cells[0].endpoint);

    // Cells only serve the deployment's own components.
    let mut bare = d.cells[0].client().await;
    let e = bare
        .send(SendRequest {
            caller: caller(1, 10),
            ..send(conv, "r3", "x")
        })
        .await
        .unwrap_err();
    assert_eq!(error_detail(&e).code, ErrorCode::Unauthenticated as i32);
    let _ = d.cluster;
}

/// A token of user 10 of tenant 1, signed with `secret`, expiring at `exp`.
fn token_signed(secret: &str, exp: u64) -> String {
    TokenKey::new(secret).issue(&Claims {
        tenant: TenantId(1),
        user: UserId(10),
        device: "d".into(),
        exp,
        ..Default::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_rejects_missing_expired_forged_and_cross_tenant_requests() {
    let d = deploy(None).await;
    let (mut m, _) = edge_clients(&d.edge).await;
    let alice = token(1, 10);
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    let expired = token_signed(TOKEN_SECRET, now_secs() - 1);
    let forged = token_signed("another-deployment-secret", now_secs() + 60);
    let as_caller = |tenant, user, tag| SendRequest {
        caller: caller(tenant, user),
        ..send(conv, tag, "x")
    };
    let cases = [
        // No token, an expired one, one signed with another secret.
        (
            None,
            send(conv, "a", "x"),
            ErrorCode::Unauthenticated,
            Reason::MissingToken,
        ),
        (
            Some(&expired),
            send(conv, "b", "x"),
            ErrorCode::Unauthenticated,
            Reason::TokenExpired,
        ),
        (
            Some(&forged),
            send(conv, "c", "x"),
            ErrorCode::Unauthenticated,
            Reason::BadSignature,
        ),
        // A token of tenant 1 cannot act for tenant 2, nor as another user.
        (
            Some(&alice),
            as_caller(2, 10, "d"),
            ErrorCode::PermissionDenied,
            Reason::CrossTenant,
        ),
        (
            Some(&alice),
            as_caller(1, 99, "e"),
            ErrorCode::PermissionDenied,
            Reason::CallerMismatch,
        ),
    ];
    for (token, request, code, reason) in cases {
        let request = match token {
            Some(token) => authed(request, token),
            None => tonic::Request::new(request),
        };
        let e = m.send(request).await.unwrap_err();
        let d = error_detail(&e);
        assert_eq!(ErrorCode::try_from(d.code).unwrap(), code, "{e:?}");
        assert_eq!(d.reason, reason, "{e:?}");
    }
    // A user of another tenant cannot reach tenant 1's conversation.
    let mallory = token(2, 10);
    d.cluster
        .client()
        .await
        .apply(assign_tenant(TenantId(2), "us-east/c1", 0))
        .await
        .unwrap();
    let r = m.send(authed(send(conv, "f", "x"), &mallory)).await;
    assert!(
        r.is_err(),
        "a tenant-2 token reached a tenant-1 conversation"
    );
    // Nothing above created a message.
    let pulled = m
        .pull(authed(
            PullRequest {
                caller: None,
                conversation_id: conv,
                since_seq: 0,
                direction: Direction::Forward as i32,
                limit: 10,
            },
            &alice,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(pulled.messages.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_routed_by_a_stale_edge_reaches_the_new_owner() {
    // The edge sees route changes a second late; cells see them at once.
    let d = deploy(Some(Duration::from_millis(1000))).await;
    let (mut m, _) = edge_clients(&d.edge).await;
    let routes = d.cluster.client().await;
    let carol = token(3, 30);
    let placed = routes
        .apply(assign_tenant(TenantId(3), "eu-west/c1", 0))
        .await
        .unwrap();
    assert!(
        d.edge
            .routes
            .wait_applied(placed.index, Duration::from_secs(10))
            .await
    );
    let first = create_via_edge(&mut m, &carol, vec![31]).await;
    // Tenant 3 moves to us-east/c1 (it has no conversations left to copy in
    // this test: only new conversations are created after the move).
    // A cell's own write to the tenant's entry may land after the
    // placement: move from the epoch the table holds then.
    let mut moved = None;
    for attempt in 0..5 {
        let epoch = routes
            .read(|t| t.entry(&Key::tenant(TenantId(3))).map(|e| e.epoch))
            .unwrap_or(placed.index);
        match routes
            .apply(assign_tenant(TenantId(3), "us-east/c1", epoch))
            .await
        {
            Ok(applied) => {
                moved = Some(applied);
                break;
            }
            Err(e) if error_detail(&e).reason == Reason::StaleEpoch.as_str() && attempt < 4 => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("moving tenant 3: {e:?}"),
        }
    }
    let moved = moved.expect("tenant 3 moved");
    let mut old_owner = d.cells[0].client().await;
    assert!(
        eventually(Duration::from_secs(5), || {
            let mut c = old_owner.clone();
            async move {
                let mut r = tonic::Request::new(CreateConversationRequest {
                    caller: caller(3, 30),
                    kind: ConversationKind::Group as i32,
                    title: "probe".into(),
                    member_ids: vec![31],
                    client_req_id: String::new(),
                });
                cellmesh_proto::secret::ClusterSecret::new(SECRET).attach(&mut r);
                c.create_conversation(r)
                    .await
                    .is_err_and(|e| error_detail(&e).code == ErrorCode::WrongCell as i32)
            }
        })
        .await,
        "the old owner learns the move"
    );
    assert!(
        d.edge.routes.applied() < moved.index,
        "the edge is still stale"
    );
    let second = create_via_edge(&mut m, &carol, vec![31]).await;
    assert_ne!(first, second);
    // It was created on the new owner.
    let mut new_owner = d.cells[1].client().await;
    let mut r = tonic::Request::new(GetConversationRequest {
        caller: caller(3, 30),
        conversation_id: second,
        ..Default::default()
    });
    cellmesh_proto::secret::ClusterSecret::new(SECRET).attach(&mut r);
    assert!(new_owner.get_conversation(r).await.is_ok());
    assert_eq!(
        d.edge
            .routes
            .resolve(&Key::tenant(TenantId(3)))
            .unwrap()
            .entry
            .cell,
        "us-east/c1"
    );
    let _ = &mut old_owner;
}

/// An edge with a second token key, a lifetime limit and a revoked token
/// id: tokens of either key pass, a revoked one and one that lives too
/// long are refused with their reasons.
#[tokio::test]
async fn the_edge_takes_rotated_keys_and_refuses_revoked_and_overlong_tokens() {
    let d = deploy(None).await;
    let keys =
        std::collections::BTreeMap::from([("k2".to_string(), "a-newer-token-key-16".to_string())]);
    let newer = TokenKey::new(TOKEN_SECRET)
        .with_keys(&keys)
        .issuing_with("k2");
    let claims = |exp| Claims {
        tenant: TenantId(1),
        user: UserId(10),
        device: "d".into(),
        exp,
        ..Default::default()
    };
    let revoked = newer.issue(&claims(now_secs() + 600));
    let jti = TokenKey::peek(&revoked).unwrap().jti;
    let edge = cellmesh_edge::start(cellmesh_edge::EdgeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        routers: d.cluster.endpoints(),
        cluster_secret: cellmesh_tests::router::SECRET.into(),
        token_secret: TOKEN_SECRET.into(),
        token_keys: keys.clone(),
        max_token_lifetime_secs: 3600,
        revoked_tokens: vec![jti],
        ..cellmesh_edge::EdgeConfig::default()
    })
    .await
    .unwrap();
    let (mut m, _) = edge_clients(&edge).await;
    let conv = create_via_edge(&mut m, &newer.issue(&claims(now_secs() + 600)), vec![11]).await;
    let old = TokenKey::new(TOKEN_SECRET).issue(&claims(now_secs() + 600));
    m.send(authed(send(conv, "old-key", "x"), &old))
        .await
        .expect("the first key's token");
    for (token, expected) in [
        (revoked, Reason::TokenRevoked.as_str()),
        (
            newer.issue(&claims(now_secs() + 7200)),
            Reason::TokenLifetimeTooLong.as_str(),
        ),
    ] {
        let e = m
            .send(authed(send(conv, "refused", "x"), &token))
            .await
            .unwrap_err();
        assert_eq!(error_detail(&e).reason, expected);
    }
}

/// An edge following a directory file admits only the users it lists for
/// a tenant (`UNKNOWN_USER` for a validly signed token of anyone else, on
/// unary calls and sync streams alike), follows the file as the operator
/// adds a user, and will not start on a file that does not parse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_with_a_directory_refuses_users_the_tenant_does_not_have() {
    let d = deploy(None).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("users");
    std::fs::write(&file, "# tenant user\n1 10\n1 11\n").unwrap();
    let config = cellmesh_edge::EdgeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        routers: d.cluster.endpoints(),
        cluster_secret: cellmesh_tests::router::SECRET.into(),
        token_secret: TOKEN_SECRET.into(),
        directory_file: file.display().to_string(),
        ..cellmesh_edge::EdgeConfig::default()
    };
    let edge = cellmesh_edge::start(config.clone()).await.unwrap();
    let (mut m, mut sync) = edge_clients(&edge).await;
    let conv = create_via_edge(&mut m, &token(1, 10), vec![11, 12]).await;
    let stranger = token(1, 12);
    let unknown = |e: tonic::Status| {
        assert_eq!(
            (e.code(), error_detail(&e).reason),
            (
                tonic::Code::Unauthenticated,
                Reason::UnknownUser.as_str().to_string()
            ),
            "{e:?}"
        );
    };
    unknown(
        m.send(authed(send(conv, "s-1", "hi"), &stranger))
            .await
            .unwrap_err(),
    );
    unknown(
        sync.subscribe(authed(SubscribeRequest::default(), &stranger))
            .await
            .unwrap_err(),
    );
    // Another tenant's user 10 is not tenant 1's.
    unknown(
        m.send(authed(send(conv, "s-2", "hi"), &token(2, 10)))
            .await
            .unwrap_err(),
    );
    m.send(authed(send(conv, "s-3", "hi"), &token(1, 11)))
        .await
        .expect("a listed user sends");

    // The operator adds user 12: admitted within seconds, no restart.
    std::fs::write(&file, "1 10\n1 11\n1 12\n").unwrap();
    let admitted = cellmesh_tests::eventually(Duration::from_secs(5), || {
        let mut m = m.clone();
        let stranger = stranger.clone();
        async move {
            m.send(authed(send(conv, "s-4", "hi"), &stranger))
                .await
                .is_ok()
        }
    })
    .await;
    assert!(
        admitted,
        "user 12 was not admitted after the file listed them"
    );

    std::fs::write(&file, "1 twelve\n").unwrap();
    let e = cellmesh_edge::start(config).await.err().expect("refused");
    assert!(e.to_string().contains("directory_file"), "{e}");
    assert!(e.to_string().contains("line 1"), "{e}");
}

/// An edge with `[client_tls]`: clients send and tail over TLS, verifying
/// the edge's certificate against the CA that issued it; a plaintext
/// client gets no answer.
#[tokio::test]
async fn clients_reach_an_edge_over_tls() {
    use cellmesh_proto::tls::{Peer, PublicTlsConfig, Role, SERVER_NAME};
    use tonic::transport::{Certificate, ClientTlsConfig};
    let d = deploy(None).await;
    let dir = tempfile::tempdir().unwrap();
    let pki = cellmesh_deployment::dev::pki::Pki::create(dir.path()).unwrap();
    let issued = pki.issue(&Peer::new(Role::Edge, "clients")).unwrap();
    let edge = cellmesh_edge::start(cellmesh_edge::EdgeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        routers: d.cluster.endpoints(),
        cluster_secret: cellmesh_tests::router::SECRET.into(),
        token_secret: TOKEN_SECRET.into(),
        client_tls: PublicTlsConfig {
            cert_file: issued.cert_file.clone(),
            key_file: issued.key_file.clone(),
        },
        ..cellmesh_edge::EdgeConfig::default()
    })
    .await
    .unwrap();
    let ca = Certificate::from_pem(std::fs::read(&issued.ca_file).unwrap());
    let channel = Channel::from_shared(edge.endpoint().replace("http://", "https://"))
        .unwrap()
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(ca)
                .domain_name(SERVER_NAME),
        )
        .unwrap()
        .connect()
        .await
        .expect("a TLS connection to the edge");
    let mut m = MessagingClient::new(channel.clone());
    let token = TokenKey::new(TOKEN_SECRET).issue(&Claims {
        tenant: TenantId(1),
        user: UserId(10),
        device: "d".into(),
        exp: now_secs() + 600,
        ..Default::default()
    });
    let conv = create_via_edge(&mut m, &token, vec![11]).await;
    // User 11 tails over the same TLS connection.
    let mut tail = SyncClient::new(channel)
        .subscribe(authed(
            SubscribeRequest::default(),
            &cellmesh_tests::deploy::token(1, 11),
        ))
        .await
        .expect("a stream over TLS")
        .into_inner();
    let sent = m
        .send(authed(send(conv, "over-tls", "hello"), &token))
        .await
        .expect("a send over TLS")
        .into_inner();
    assert_eq!(sent.seq, 1);
    let pushed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let push = tail
                .message()
                .await
                .unwrap()
                .expect("the stream stays open");
            if let Some(sync_push::Push::Event(e)) = push.push
                && e.seq == 1
                && e.conversation_id == conv
            {
                break e;
            }
        }
    })
    .await
    .expect("the message is pushed over TLS");
    assert_eq!(pushed.seq, sent.seq);
    let plain = Channel::from_shared(edge.endpoint())
        .unwrap()
        .connect()
        .await;
    if let Ok(channel) = plain {
        assert!(
            MessagingClient::new(channel)
                .send(authed(send(conv, "plain", "x"), &token))
                .await
                .is_err(),
            "a plaintext client was answered"
        );
    }
    // A config naming a missing file is refused, naming the field.
    let e = cellmesh_edge::EdgeConfig {
        token_secret: TOKEN_SECRET.into(),
        client_tls: PublicTlsConfig {
            cert_file: "/nonexistent/edge.pem".into(),
            key_file: issued.key_file,
        },
        ..cellmesh_edge::EdgeConfig::default()
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(e.contains("client_tls"), "{e}");
}

/// A sync stream opened through the edge with `token`.
async fn open(sync: &SyncClient<Channel>, token: &str) -> tonic::Streaming<SyncPush> {
    (sync.clone())
        .subscribe(authed(SubscribeRequest::default(), token))
        .await
        .expect("subscribe")
        .into_inner()
}

/// Reads `stream` until it ends with an error (panics after `within`): the
/// error and when it came.
async fn ends_with(
    stream: &mut tonic::Streaming<SyncPush>,
    within: Duration,
) -> (tonic::Status, std::time::Instant) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.message()).await {
            Ok(Err(status)) => return (status, std::time::Instant::now()),
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None)) => panic!("the stream ended without an error"),
            Err(_) => panic!("the stream stayed open"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_stream_ends_when_its_token_is_revoked_or_its_user_leaves_the_directory() {
    let d = deploy(None).await;
    let files = tempfile::tempdir().unwrap();
    let (revoked, users) = (files.path().join("revoked"), files.path().join("users"));
    std::fs::write(&revoked, "# revoked token ids\n").unwrap();
    std::fs::write(&users, "1 10\n1 11\n").unwrap();
    let edge = cellmesh_edge::start(cellmesh_edge::EdgeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        routers: d.cluster.endpoints(),
        cluster_secret: SECRET.into(),
        token_secret: TOKEN_SECRET.into(),
        revoked_tokens_file: revoked.display().to_string(),
        directory_file: users.display().to_string(),
        ..cellmesh_edge::EdgeConfig::default()
    })
    .await
    .unwrap();
    let (mut m, sync) = edge_clients(&edge).await;
    let (alice, bob) = (token(1, 10), token(1, 11));
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    let (mut alices, mut bobs) = (open(&sync, &alice).await, open(&sync, &bob).await);
    m.send(authed(send(conv, "r-1", "hello"), &alice))
        .await
        .unwrap();
    assert!(
        bobs.message().await.unwrap().is_some(),
        "bob's stream is live"
    );

    // Alice's token is revoked: her open stream ends, with its reason.
    let jti = TokenKey::peek(&alice).unwrap().jti;
    std::fs::write(&revoked, format!("{jti}\n")).unwrap();
    let written = std::time::Instant::now();
    let (status, at) = ends_with(&mut alices, Duration::from_secs(5)).await;
    assert_eq!(
        (status.code(), error_detail(&status).reason.as_str()),
        (tonic::Code::Unauthenticated, Reason::TokenRevoked.as_str())
    );
    assert!(at - written < Duration::from_secs(3), "{:?}", at - written);

    // Bob leaves the directory: his stream ends too.
    std::fs::write(&users, "1 10\n").unwrap();
    let (status, _) = ends_with(&mut bobs, Duration::from_secs(5)).await;
    assert_eq!(
        error_detail(&status).reason.as_str(),
        Reason::UnknownUser.as_str()
    );
    // And a new stream with the revoked token is refused.
    let mut sync = sync.clone();
    let refused = sync
        .subscribe(authed(SubscribeRequest::default(), &alice))
        .await
        .unwrap_err();
    assert_eq!(error_detail(&refused).reason, Reason::TokenRevoked.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_edge_ends_its_open_streams_at_once_with_a_code_to_subscribe_again() {
    let d = deploy(None).await;
    let (mut m, sync) = edge_clients(&d.edge).await;
    let alice = token(1, 10);
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    let mut stream = open(&sync, &alice).await;
    m.send(authed(send(conv, "r-1", "hello"), &alice))
        .await
        .unwrap();
    assert!(
        stream.message().await.unwrap().is_some(),
        "the stream is live"
    );

    // The stop does not wait for the device to hang up: the stream ends
    // with STOPPING (retry later) and the edge is down soon after.
    let asked = std::time::Instant::now();
    let stopped = tokio::spawn(d.edge.stop());
    let (status, _) = ends_with(&mut stream, Duration::from_secs(4)).await;
    assert_eq!(
        (status.code(), error_detail(&status).reason.as_str()),
        (tonic::Code::Unavailable, Reason::Stopping.as_str())
    );
    stopped.await.unwrap();
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
}
