//! Exactly once across a failover: a client re-sends a request the failed
//! cell had acknowledged (it lost the answer). The answer was replicated to
//! the standby, so the failover target answers the re-send as the failed
//! cell did; and where it was not (a failover inside the replication lag),
//! the re-send was accepted again and the backfill keeps the answer given
//! last (what a client that re-sends for want of an answer holds): the
//! failed cell's copy becomes its duplicate. The edge answers an owner it
//! cannot reach with a stable code, and the route table shows the floors
//! the failover set.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::reason::Reason;
use std::time::Duration;

use cellmesh_cell::failpoints;
use cellmesh_cell::storage::{IdemKey, IdemKind};
use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::*;
use cellmesh_route_client::table::Key;
use cellmesh_tests::deploy::*;
use cellmesh_tests::eventually;
use tonic::transport::Channel;

pub(crate) const FAILED: &str = "eu-west/c1";
pub(crate) const FALLBACK: &str = "us-east/c1";

/// Sends `n` messages tagged `before-{i}`; their answers.
pub(crate) async fn send_before(
    m: &mut MessagingClient<Channel>,
    alice: &str,
    conv: u64,
    n: usize,
) -> Vec<SendResponse> {
    let mut answers = Vec::new();
    for i in 0..n {
        let r = m
            .send(authed(text(conv, &format!("before-{i}")), alice))
            .await;
        answers.push(r.unwrap().into_inner());
    }
    answers
}

pub(crate) async fn resend(
    m: &mut MessagingClient<Channel>,
    alice: &str,
    conv: u64,
    i: usize,
) -> SendResponse {
    let tag = format!("before-{i}");
    m.send(authed(text(conv, &tag), alice))
        .await
        .unwrap_or_else(|e| panic!("re-send of {tag}: {e}"))
        .into_inner()
}

pub(crate) fn answer_key(tag: &str) -> IdemKey {
    IdemKey {
        kind: IdemKind::Send,
        tenant: TenantId(1),
        user: UserId(10),
        client_req_id: tag.into(),
    }
}

/// Fails the first cell (a clean stop: everything it acknowledged is on its
/// disk) and waits until its tenant is served by the fallback; the stopped
/// cell's data dir.
pub(crate) async fn fail_first_cell(d: &mut Deployment, conv: u64) -> tempfile::TempDir {
    let routes = d.cluster.client().await;
    let dead = d.cells.remove(0);
    let dir = dead.stop().await;
    let moved = eventually(Duration::from_secs(30), || {
        let moved = routes.read(|t| {
            t.resolve(&Key::conversation(TenantId(1), ConversationId(conv)))
                .is_some_and(|r| r.entry.cell == FALLBACK)
        });
        async move { moved }
    })
    .await;
    assert!(moved, "no failover");
    dir
}

/// A deployment with a control plane that fails cells over quickly, and a
/// conversation of user 10 (Alice) with user 11: the deployment, its route
/// client, the control plane, Alice's token and client, the conversation.
async fn failover_deployment() -> FailoverDeployment {
    failover_deployment_with(|_| {}).await
}

pub(crate) type FailoverDeployment = (
    Deployment,
    cellmesh_route_client::client::RouteClient,
    cellmesh_control_plane::server::RunningControlPlane,
    String,
    MessagingClient<Channel>,
    u64,
);

/// [`failover_deployment`] with both cells' configs adjusted by `tweak`.
pub(crate) async fn failover_deployment_with(
    tweak: impl Fn(&mut cellmesh_cell::CellConfig),
) -> FailoverDeployment {
    let d = deploy_with(None, tweak).await;
    let routes = d.cluster.client().await;
    let cp = fast_control_plane(d.cluster.endpoints()).await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    (d, routes, cp, alice, m, conv)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_after_a_failover_is_answered_as_the_failed_cell_answered_it() {
    let (mut d, routes, cp, alice, mut m, conv) = failover_deployment().await;
    let answers = send_before(&mut m, &alice, conv, 20).await;
    wait_for_checkpoint(&routes, conv, 20, Duration::from_secs(10)).await;
    // The standby holds every answer (replicated after the ack).
    let standby = d.cells[1].cell.service.store().clone();
    let replicated = eventually(Duration::from_secs(10), || {
        let standby = standby.clone();
        async move {
            (0..20).all(|i| {
                standby
                    .idempotency(&answer_key(&format!("before-{i}")))
                    .unwrap()
                    .is_some()
            })
        }
    })
    .await;
    assert!(replicated, "the standby holds the answers");

    let dir = fail_first_cell(&mut d, conv).await;
    for i in [0, 7, 19] {
        let again = resend(&mut m, &alice, conv, i).await;
        assert_eq!(
            (again.seq, again.msg_id, again.duplicate),
            (answers[i].seq, answers[i].msg_id, true),
            "re-send of before-{i} while the failed cell is down"
        );
    }
    // The new owner puts the floor above the mark it held, and a pull
    // shows that floor.
    let floor = cellmesh_tests::deploy::floor_of(&routes, conv).await;
    assert!(floor >= 20);
    let page = pull_via_edge(&mut m, &alice, conv).await;
    assert_eq!(
        page.seq_floor, floor,
        "the owner serves the floor it assigns above"
    );

    // The failed cell returns and is backfilled: still one copy each, and
    // re-sends keep their first answer.
    let _returned =
        cellmesh_tests::TestCell::start_routed_in(FAILED, d.cluster.endpoints(), dir).await;
    wait_for_backfill(&cp, FAILED, Duration::from_secs(20)).await;
    let history = history_via_edge(&mut m, &alice, conv).await;
    let tags: Vec<&str> = history.iter().map(|s| s.tag.as_str()).collect();
    let expected: Vec<String> = (0..20).map(|i| format!("before-{i}")).collect();
    assert_eq!(tags, expected, "every acknowledged send exactly once");
    let again = resend(&mut m, &alice, conv, 7).await;
    assert_eq!((again.seq, again.duplicate), (answers[7].seq, true));
    cp.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_keeps_the_answer_last_given_in_either_order() {
    let (mut d, routes, cp, alice, mut m, conv) = failover_deployment().await;
    // Answers are not replicated: a failover inside the replication lag.
    let points = failpoints::parse("standby.answers=error").unwrap();
    d.cells[0].cell.service.store().failpoints().set(points);
    let answers = send_before(&mut m, &alice, conv, 10).await;
    wait_for_checkpoint(&routes, conv, 10, Duration::from_secs(10)).await;

    let dir = fail_first_cell(&mut d, conv).await;
    // Re-send first: the new owner knows nothing of before-3 and accepts
    // it again, above the floor.
    let copy = resend(&mut m, &alice, conv, 3).await;
    let floor = cellmesh_tests::deploy::floor_of(&routes, conv).await;
    assert!(
        !copy.duplicate && copy.seq > floor,
        "{copy:?} above {floor}"
    );

    let _returned =
        cellmesh_tests::TestCell::start_routed_in(FAILED, d.cluster.endpoints(), dir).await;
    wait_for_backfill(&cp, FAILED, Duration::from_secs(20)).await;
    // The copy the re-send was answered with stands; the failed cell's
    // copy is its tombstone: one message for the request id.
    let page = pull_via_edge(&mut m, &alice, conv).await;
    let at = |seq: u64| page.messages.iter().find(|x| x.seq == seq).cloned();
    let kept = at(copy.seq).expect("the answered copy is in history");
    assert_eq!(kept.body, b"before-3");
    assert_eq!(kept.state, MessageState::Normal as i32);
    let tombstone = at(answers[3].seq).expect("the failed cell's copy is in history");
    assert_eq!(tombstone.state, MessageState::Recalled as i32);
    assert!(tombstone.body.is_empty());
    // Re-sends keep their answers: before-3 the one it got last, before-5
    // (re-sent only after the backfill) its first, rebuilt from history.
    let again = resend(&mut m, &alice, conv, 3).await;
    assert_eq!(
        (again.seq, again.msg_id, again.duplicate),
        (copy.seq, copy.msg_id, true)
    );
    let again = resend(&mut m, &alice, conv, 5).await;
    assert_eq!(
        (again.seq, again.msg_id, again.duplicate),
        (answers[5].seq, answers[5].msg_id, true)
    );
    cp.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_the_edge_cannot_reach_is_answered_with_a_stable_code() {
    let mut d = deploy(None).await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    // No control plane: the route keeps naming the stopped cell.
    let dead = d.cells.remove(0);
    let address = dead.endpoint.trim_start_matches("http://").to_string();
    let _dir = dead.stop().await;
    // Its port stays taken (no other test's server may take it over) and
    // every connection to it is dropped at once, as a dead host's would be.
    let closed = tokio::net::TcpListener::bind(&address).await.unwrap();
    let _refuser = tokio::spawn(async move {
        while let Ok((socket, _)) = closed.accept().await {
            drop(socket);
        }
    });
    let e = m
        .send(authed(text(conv, "to-nobody"), &alice))
        .await
        .unwrap_err();
    let detail = assert_reason(&e, ErrorCode::RetryLater, Reason::OwnerUnreachable.as_str());
    let route = detail.route.expect("the route the edge tried");
    assert_eq!(route.cell_id, FAILED);
}
