//! A cell process is SIGKILLed while clients keep sending through the edge:
//! the control plane fails its tenant over, sends are accepted on the
//! fallback above every acknowledged seq, and once the process returns on
//! its data and backfill completes, every acknowledged message is there
//! exactly once, in order.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellmesh_chaos::check_all;
use cellmesh_chaos::history::{Floor, History, Outcome};
use cellmesh_control_plane::server::{ControlPlaneConfig, Event, FailoverConfig};
use cellmesh_router::commands::assign_tenant;
use cellmesh_router::table::Key;
use cellmesh_tests::deploy::*;
use cellmesh_tests::router::{RouterCluster, SECRET};
use cellmesh_tests::{CellProcess, TestCell, eventually, test_config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_cell_process_fails_over_under_continuous_sends() {
    let cluster = RouterCluster::start(1, |_| {}).await;
    let routers = cluster.endpoints();
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.cell_id = "eu-west/c1".into();
    config.routing.routers = routers.clone();
    config.routing.cluster_secret = SECRET.into();
    config.routing.checkpoint_interval_ms = 200;
    config.rate_limit.conversation_per_sec = 1_000;
    config.rate_limit.conversation_burst = 1_000;
    let mut process = CellProcess::start_configured(dir.path(), &config).await;
    let _fallback = TestCell::start_routed("eu-west/c2", routers.clone()).await;
    let routes = cluster.client().await;
    routes
        .apply(assign_tenant(1, "eu-west/c1", 0))
        .await
        .unwrap();
    let edge = start_edge(routers.clone()).await;
    let cp = cellmesh_control_plane::server::start(ControlPlaneConfig {
        routers: routers.clone(),
        cluster_secret: SECRET.into(),
        probe_interval_ms: 100,
        probe_timeout_ms: 200,
        down_after: 3,
        up_after: 3,
        failover: FailoverConfig {
            conversation_per_sec: 1_000,
            conversation_burst: 1_000,
            checkpoint_interval_ms: 200,
            owner_lease_ms: 2_000,
        },
        console_listen: String::new(),
        ..ControlPlaneConfig::default()
    })
    .await
    .unwrap();

    let alice = token(1, 10);
    let mut m = messaging(&edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    let epoch = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(Mutex::new(Vec::new()));
    let senders: Vec<_> = [(10, token(1, 10)), (11, token(1, 11))]
        .into_iter()
        .map(|(user, token)| {
            tokio::spawn(sender(
                edge.endpoint(),
                token,
                conv,
                user,
                stop.clone(),
                epoch,
                ops.clone(),
            ))
        })
        .collect();
    // Sends flow and reach a checkpoint; the standby has the meta.
    assert!(
        eventually(Duration::from_secs(15), || {
            let hwm = routes.read(|t| t.checkpoints.get(&(1, conv)).copied().unwrap_or(0));
            async move { hwm >= 50 }
        })
        .await,
        "checkpointed"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;

    let killed_ms = epoch.elapsed().as_millis() as u64;
    process.kill();
    assert!(
        eventually(Duration::from_secs(20), || {
            let moved = cp
                .events()
                .iter()
                .any(|e| matches!(e, Event::FailedOver { cell, .. } if cell == "eu-west/c1"));
            async move { moved }
        })
        .await,
        "no failover: {:?}",
        cp.events()
    );
    // Sends go on at the fallback for a while.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    for s in senders {
        s.await.unwrap();
    }
    let ops = std::mem::take(&mut *ops.lock().unwrap());
    let acked = |after: u64| {
        ops.iter()
            .filter(move |o| o.invoked_ms >= after)
            .filter_map(|o| match o.outcome {
                Outcome::Ok { seq, .. } => Some((o.completed_ms, seq)),
                _ => None,
            })
    };
    let first_after = acked(killed_ms)
        .map(|(at, _)| at)
        .min()
        .expect("sends were accepted after the kill");
    println!(
        "first send accepted {} ms after SIGKILL",
        first_after - killed_ms
    );
    let before_max = ops
        .iter()
        .filter(|o| o.completed_ms <= killed_ms)
        .filter_map(|o| match o.outcome {
            Outcome::Ok { seq, .. } => Some(seq),
            _ => None,
        })
        .max()
        .unwrap();
    let after_min = acked(first_after).map(|(_, seq)| seq).min().unwrap();
    assert!(after_min > before_max, "{after_min} <= {before_max}");
    let floor = routes.read(|t| t.resolve(&Key::conversation(1, conv)).unwrap().seq_floor);

    // The process returns on its data; its history is backfilled.
    let _returned = CellProcess::start_configured(dir.path(), &config).await;
    assert!(
        eventually(Duration::from_secs(30), || {
            let done = cp.events().iter().any(|e| {
                matches!(e, Event::Backfilled { cell, conversations, .. }
                    if cell == "eu-west/c1" && *conversations >= 1)
            });
            async move { done }
        })
        .await,
        "backfill ran: {:?}",
        cp.events()
    );
    let mut read = Vec::new();
    let mut since = 0;
    loop {
        let page = m
            .pull(authed(
                cellmesh_proto::v1::PullRequest {
                    conversation_id: conv,
                    since_seq: since,
                    direction: cellmesh_proto::v1::Direction::Forward as i32,
                    limit: 500,
                    ..Default::default()
                },
                &alice,
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(page.unavailable_through, 0, "history is complete again");
        read.extend(stored(&page.messages));
        if !page.has_more {
            break;
        }
        since = page.next_seq;
    }
    let mut history = History {
        sends: ops,
        ..History::default()
    };
    history.conversations.insert(conv, read);
    history.floors.push(Floor {
        conversation: conv,
        floor,
    });
    for verdict in check_all(&history) {
        assert!(
            verdict.holds,
            "{}: {:?}",
            verdict.invariant, verdict.counterexamples
        );
    }
    cp.stop();
}
