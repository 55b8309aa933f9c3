//! The control plane's operations: a tenant move started through the admin
//! API of a standby replica is recorded, run by the active replica (the
//! caller does not wait), and when that replica dies mid-move the other
//! one takes the operation up from the record and finishes it. A paused
//! move holds (its route says so) until it is resumed. Bad requests get
//! stable codes.

use cellmesh_proto::ids::{ConversationId, TenantId};
use cellmesh_proto::reason::Reason;
use std::time::Duration;

use cellmesh_control_plane::server::{
    ControlPlaneConfig, CoordinationBackend, CoordinationConfig, RunningControlPlane,
};
use cellmesh_coord::local::LocalCoordination;
use cellmesh_coord::{CONTROL_PLANE_ELECTION, Coordination};
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1::operations_client::OperationsClient;
use cellmesh_proto::v1::start_operation_request::Spec;
use cellmesh_proto::v1::*;
use cellmesh_route_client::table::{Key, Phase, RouteState};
use cellmesh_tests::deploy::*;
use cellmesh_tests::router::SECRET;
use cellmesh_tests::{ControlPlaneProcess, eventually};
use tonic::transport::Channel;

const TARGET: &str = "us-east/c1";

async fn replica(routers: Vec<String>, dir: &std::path::Path, name: &str) -> RunningControlPlane {
    cellmesh_control_plane::server::start(ControlPlaneConfig {
        routers,
        cluster_secret: SECRET.into(),
        console_listen: "127.0.0.1:0".into(),
        admin_listen: "127.0.0.1:0".into(),
        coordination: CoordinationConfig {
            backend: CoordinationBackend::Local,
            dir: dir.display().to_string(),
            name: name.into(),
            ..CoordinationConfig::default()
        },
        ..ControlPlaneConfig::default()
    })
    .await
    .expect("control plane starts")
}

async fn admin(cp: &RunningControlPlane) -> OperationsClient<Channel> {
    let addr = cp.admin.expect("the admin API is on");
    OperationsClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

fn authed<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    ClusterSecret::new(SECRET).attach(&mut request);
    request
}

async fn get(client: &mut OperationsClient<Channel>, id: &str) -> OperationInfo {
    client
        .get(authed(OperationRequest { id: id.into() }))
        .await
        .unwrap()
        .into_inner()
}

/// Waits (up to `secs`) until operation `id` satisfies `done`; the
/// operation as it is then, and whether it did.
async fn wait_for(
    client: &OperationsClient<Channel>,
    id: &str,
    secs: u64,
    done: impl Fn(&OperationInfo) -> bool,
) -> (OperationInfo, bool) {
    let done = &done;
    let reached = eventually(Duration::from_secs(secs), || {
        let (mut client, id) = (client.clone(), id.to_string());
        async move { done(&get(&mut client, &id).await) }
    })
    .await;
    (get(&mut client.clone(), id).await, reached)
}

fn succeeded(op: &OperationInfo) -> bool {
    op.state == OperationState::Succeeded as i32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_outlives_its_caller_and_the_replica_that_ran_it() {
    let d = deploy(None).await;
    let conversations = fill_tenant(&d, 30).await;
    let coordination = tempfile::tempdir().unwrap();
    let first = replica(d.cluster.endpoints(), coordination.path(), "cp-1").await;
    assert!(eventually(Duration::from_secs(10), || async { first.is_leader() }).await);
    let second = replica(d.cluster.endpoints(), coordination.path(), "cp-2").await;

    // Started through the standby; the caller goes away at once.
    let started = start_tenant_move(&mut admin(&second).await).await;
    assert_eq!(started.state, OperationState::Pending as i32);
    let id = started.id.clone();

    // The active replica runs it; it dies mid-move.
    let mut client = admin(&second).await;
    let (op, mid_move) = wait_for(&client, &id, 20, |op| {
        op.state == OperationState::Running as i32 && op.runner == "cp-1" && op.done >= 2
    })
    .await;
    assert!(mid_move, "cp-1 ran the move: {op:?}");
    first.stop();

    // The other replica leads and finishes it from the record.
    let (op, finished) = wait_for(&client, &id, 60, succeeded).await;
    assert!(finished, "{op:?}");
    assert!(second.is_leader());
    assert_eq!(op.runner, "cp-2");
    // What this replica's run copied (the homes at least: they are copied
    // afresh by each run), none left behind, and the freeze.
    assert!(
        op.rows_copied > 0 && op.bytes_copied > op.rows_copied && op.lag == 0 && op.frozen_ms > 0,
        "{op:?}"
    );
    let routes = d.cluster.client().await;
    for c in &conversations {
        let route = routes.read(|t| {
            t.resolve(&Key::conversation(TenantId(1), ConversationId(*c)))
                .unwrap()
        });
        assert_eq!(route.entry.cell, TARGET, "conversation {c}");
    }
    let tenant = routes.read(|t| t.entry(&Key::tenant(TenantId(1))).cloned().unwrap());
    assert_eq!(
        (tenant.cell.as_str(), &tenant.state),
        (TARGET, &RouteState::Active)
    );
    // History came along whole.
    let mut m = messaging(&d.edge).await;
    let history = history_via_edge(&mut m, &token(1, 10), conversations[17]).await;
    let tags: Vec<&str> = history.iter().map(|s| s.tag.as_str()).collect();
    assert_eq!(tags, ["m-17-0", "m-17-1", "m-17-2"]);
    let listed = client
        .list(authed(ListOperationsRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.operations.len(), 1);
    // The console lists it with its outcome.
    let console = second.console.expect("the console is on");
    let listed = eventually(Duration::from_secs(5), || async {
        let status = cellmesh_tests::http::status(console).await;
        status["operations"].as_array().is_some_and(|ops| {
            ops.iter()
                .any(|o| o["id"] == id && o["state"] == "succeeded")
        })
    })
    .await;
    assert!(listed, "the console shows the operation");
    second.stop();
}

/// The same takeover with real processes: the active control-plane
/// replica is SIGKILLed mid-operation (no shutdown, no release of its
/// leadership) and the other process finishes the operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_control_plane_process_leaves_its_operation_to_the_other() {
    let d = deploy(None).await;
    let conversations = fill_tenant(&d, 30).await;
    let dir = tempfile::tempdir().unwrap();
    let config = |name: &str| ControlPlaneConfig {
        routers: d.cluster.endpoints(),
        cluster_secret: SECRET.into(),
        coordination: CoordinationConfig {
            backend: CoordinationBackend::Local,
            dir: dir.path().join("coordination").display().to_string(),
            name: name.into(),
            ..CoordinationConfig::default()
        },
        ..ControlPlaneConfig::default()
    };
    let election = LocalCoordination::open(&dir.path().join("coordination")).unwrap();
    let leader = || async { election.leader(CONTROL_PLANE_ELECTION).await.unwrap() };
    let mut first = ControlPlaneProcess::start(dir.path(), config("cp-1")).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            leader().await.as_deref() == Some("cp-1")
        })
        .await
    );
    let second = ControlPlaneProcess::start(dir.path(), config("cp-2")).await;
    let mut client = OperationsClient::connect(second.admin.clone())
        .await
        .unwrap();
    let id = start_tenant_move(&mut client).await.id;
    let (op, mid_move) = wait_for(&client, &id, 20, |op| op.runner == "cp-1" && op.done >= 2).await;
    assert!(mid_move, "{op:?}");
    first.kill();

    let (op, finished) = wait_for(&client, &id, 60, succeeded).await;
    assert!(finished, "{op:?}");
    assert_eq!(op.runner, "cp-2");
    assert_eq!(leader().await.as_deref(), Some("cp-2"));
    let routes = d.cluster.client().await;
    for c in &conversations {
        let route = routes.read(|t| {
            t.resolve(&Key::conversation(TenantId(1), ConversationId(*c)))
                .unwrap()
        });
        assert_eq!(route.entry.cell, TARGET, "conversation {c}");
    }
    let mut m = messaging(&d.edge).await;
    let history = history_via_edge(&mut m, &token(1, 10), conversations[29]).await;
    let tags: Vec<&str> = history.iter().map(|s| s.tag.as_str()).collect();
    assert_eq!(tags, ["m-29-0", "m-29-1", "m-29-2"]);
}

/// Starts moving tenant 1 to the target, one copy at a time and slowly
/// enough to be caught mid-move.
async fn start_tenant_move(client: &mut OperationsClient<Channel>) -> OperationInfo {
    client
        .start(authed(StartOperationRequest {
            spec: Some(Spec::MoveTenant(MoveTenantSpec {
                tenant_id: 1,
                to_cell: TARGET.into(),
                parallel: 1,
                rate: 60,
                file_rate: 0,
            })),
        }))
        .await
        .unwrap()
        .into_inner()
}

/// Fills tenant 1 with `n` conversations of three messages each.
async fn fill_tenant(d: &Deployment, n: usize) -> Vec<u64> {
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let mut conversations = Vec::new();
    for i in 0..n {
        let c = create_via_edge(&mut m, &alice, vec![11]).await;
        for j in 0..3 {
            let message = text(c, &format!("m-{i}-{j}"));
            m.send(cellmesh_tests::deploy::authed(message, &alice))
                .await
                .unwrap();
        }
        conversations.push(c);
    }
    conversations
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_move_holds_until_it_is_resumed() {
    let d = deploy(None).await;
    let conversations = fill_tenant(&d, 30).await;
    let coordination = tempfile::tempdir().unwrap();
    let cp = replica(d.cluster.endpoints(), coordination.path(), "cp-1").await;
    assert!(eventually(Duration::from_secs(10), || async { cp.is_leader() }).await);
    let mut client = admin(&cp).await;
    let id = start_tenant_move(&mut client).await.id;
    let (op, started) = wait_for(&client, &id, 20, |op| op.done >= 2).await;
    assert!(started, "{op:?}");

    let paused = client
        .pause(authed(OperationRequest { id: id.clone() }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(paused.state, OperationState::Paused as i32);
    assert!(paused.pause_requested);
    // The runner carries the pause to the tenant's route.
    let routes = d.cluster.client().await;
    let tenant_state =
        || routes.read(|t| t.entry(&Key::tenant(TenantId(1))).map(|e| e.state.clone()));
    let held = eventually(Duration::from_secs(10), || async {
        tenant_state()
            == Some(RouteState::Migrating {
                to: TARGET.into(),
                phase: Phase::Paused,
            })
    })
    .await;
    assert!(held, "the tenant's route is paused: {:?}", tenant_state());
    // Nothing more moves while it holds (the copy in flight when the pause
    // came may still finish), and it does not freeze.
    let done = |client: &mut OperationsClient<Channel>| {
        let (mut client, id) = (client.clone(), id.clone());
        async move { get(&mut client, &id).await.done }
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = done(&mut client).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = done(&mut client).await;
    assert_eq!(before, after, "a paused move makes no progress");
    let op = get(&mut client, &id).await;
    assert_eq!(op.state, OperationState::Paused as i32, "{op:?}");
    assert!(
        matches!(tenant_state(), Some(RouteState::Migrating { .. })),
        "held before its freeze: {:?}",
        tenant_state()
    );

    let resumed = client
        .resume(authed(OperationRequest { id: id.clone() }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resumed.state, OperationState::Running as i32);
    let (op, finished) = wait_for(&client, &id, 60, succeeded).await;
    assert!(finished, "{op:?}");
    for c in &conversations {
        let route = routes.read(|t| {
            t.resolve(&Key::conversation(TenantId(1), ConversationId(*c)))
                .unwrap()
        });
        assert_eq!(route.entry.cell, TARGET, "conversation {c}");
    }
    assert_eq!(tenant_state(), Some(RouteState::Active));
    cp.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_operation_requests_get_stable_codes() {
    let d = deploy(None).await;
    let coordination = tempfile::tempdir().unwrap();
    let cp = replica(d.cluster.endpoints(), coordination.path(), "cp-1").await;
    let mut client = admin(&cp).await;
    let reason = |e: tonic::Status| (e.code(), error_detail(&e).reason);

    let e = client
        .start(authed(StartOperationRequest {
            spec: Some(Spec::MoveTenant(MoveTenantSpec {
                tenant_id: 1,
                to_cell: "mars/c9".into(),
                parallel: 0,
                rate: 0,
                file_rate: 0,
            })),
        }))
        .await
        .unwrap_err();
    assert_eq!(
        reason(e),
        (
            tonic::Code::InvalidArgument,
            Reason::UnknownCell.as_str().into()
        )
    );
    let e = client
        .start(authed(StartOperationRequest { spec: None }))
        .await
        .unwrap_err();
    assert_eq!(
        reason(e),
        (
            tonic::Code::InvalidArgument,
            Reason::MissingSpec.as_str().into()
        )
    );
    let e = client
        .start(authed(StartOperationRequest {
            spec: Some(Spec::MoveConversation(MoveConversationSpec {
                tenant_id: 1,
                conversation_id: 0,
                to_cell: TARGET.into(),
            })),
        }))
        .await
        .unwrap_err();
    assert_eq!(
        reason(e),
        (
            tonic::Code::InvalidArgument,
            Reason::MissingId.as_str().into()
        )
    );
    let e = client
        .get(authed(OperationRequest {
            id: "op-none".into(),
        }))
        .await
        .unwrap_err();
    assert_eq!(
        reason(e),
        (
            tonic::Code::NotFound,
            Reason::OperationNotFound.as_str().into()
        )
    );
    // A drain picks its moves as it goes: it cannot be held.
    let drain = client
        .start(authed(StartOperationRequest {
            spec: Some(Spec::Drain(DrainSpec {
                cell_id: TARGET.into(),
                to_cell: String::new(),
                parallel: 1,
            })),
        }))
        .await
        .unwrap()
        .into_inner();
    let e = client
        .pause(authed(OperationRequest {
            id: drain.id.clone(),
        }))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), error_detail(&e).reason),
        (
            tonic::Code::InvalidArgument,
            Reason::NotPausable.as_str().into()
        )
    );
    // A cell's record of its retention deletions is listed, never run,
    // cancelled or paused by the control plane.
    let store = cellmesh_control_plane::operations::OperationStore::new(std::sync::Arc::new(
        LocalCoordination::open(coordination.path()).unwrap(),
    ));
    let expiring = store
        .create(cellmesh_control_plane::operations::Spec::ExpireHistory {
            tenant: 1,
            cell: TARGET.into(),
            retention_days: 30,
        })
        .await
        .unwrap();
    for call in ["cancel", "pause"] {
        let request = authed(OperationRequest {
            id: expiring.id.clone(),
        });
        let e = match call {
            "cancel" => client.cancel(request).await,
            _ => client.pause(request).await,
        }
        .unwrap_err();
        assert_eq!(
            (e.code(), error_detail(&e).reason),
            (
                tonic::Code::InvalidArgument,
                Reason::RunsInCell.as_str().into()
            ),
            "{call}"
        );
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let listed = client
        .get(authed(OperationRequest {
            id: expiring.id.clone(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (listed.state(), listed.runner.as_str()),
        (OperationState::Pending, ""),
        "no replica runs it"
    );

    // Without the deployment secret: refused.
    let e = client.list(ListOperationsRequest {}).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    cp.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_active_replica_prunes_finished_operations_past_their_retention() {
    use cellmesh_control_plane::operations as ops;
    let d = deploy(None).await;
    let dir = tempfile::tempdir().unwrap();
    let store = ops::OperationStore::new(std::sync::Arc::new(
        LocalCoordination::open(dir.path()).unwrap(),
    ));
    let old = ops::now_ms() - 10_000;
    let mut ids = Vec::new();
    for (cell, state) in [
        ("eu-west/c1", ops::State::Succeeded),
        ("eu-west/c2", ops::State::Running),
    ] {
        let spec = ops::Spec::Failback {
            cell: cell.into(),
            parallel: 1,
        };
        let op = store.create(spec).await.unwrap();
        store
            .update(&op.id, |op| (op.state, op.updated_ms) = (state, old))
            .await
            .unwrap();
        ids.push(op.id);
    }
    let cp = cellmesh_control_plane::server::start(ControlPlaneConfig {
        routers: d.cluster.endpoints(),
        cluster_secret: SECRET.into(),
        coordination: CoordinationConfig {
            backend: CoordinationBackend::Local,
            dir: dir.path().display().to_string(),
            name: "cp-1".into(),
            ..CoordinationConfig::default()
        },
        operations: ops::retention::OperationsConfig {
            retain_finished_secs: 2,
        },
        ..ControlPlaneConfig::default()
    })
    .await
    .expect("control plane starts");
    let pruned = eventually(Duration::from_secs(15), || async {
        store.get(&ids[0]).await.unwrap().is_none()
    })
    .await;
    assert!(pruned, "the finished operation is pruned");
    assert!(
        store.get(&ids[1]).await.unwrap().is_some(),
        "an unfinished operation is never pruned"
    );
    cp.stop();
}
