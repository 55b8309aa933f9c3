//! A cell process is SIGKILLed while clients keep sending through the edge:
//! the control plane fails its tenant over, sends are accepted on the
//! fallback above every acknowledged seq, and once the process returns on
//! its data and backfill completes, every acknowledged message is there
//! exactly once, in order. Requests the killed process acknowledged, sent
//! again after the failover and after the backfill, get their first answer.
//! In replication mode `sync` that holds for every acknowledged request,
//! up to the last before the kill, with no answer shipped after the ack,
//! and the new owner serves the whole history before the backfill.

use cellmesh_proto::ids::TenantId;
use std::time::Duration;

use cellmesh_cell::config::ReplicationMode;
use cellmesh_chaos::history::{Floor, History, Outcome};
use cellmesh_control_plane::server::Event;
use cellmesh_route_client::commands::assign_tenant;
use cellmesh_tests::deploy::*;
use cellmesh_tests::router::RouterCluster;
use cellmesh_tests::{CellProcess, TestCell, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_cell_process_fails_over_under_continuous_sends() {
    fail_over_under_sends(Fault::Kill, ReplicationMode::Async).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_sync_mode_cell_process_loses_no_answer_and_no_history() {
    fail_over_under_sends(Fault::Kill, ReplicationMode::Sync).await;
}

/// A hung process (SIGSTOP for 5 s) is failed over like a dead one; once
/// it resumes it is behind the new owner's floor and is backfilled. Its
/// owner lease (2.5 s) is longer than the one the control plane assumes
/// (2 s): the control plane waits out the lease the cell announced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_cell_process_fails_over_and_resends_keep_their_first_answer() {
    fail_over_under_sends(Fault::Hang, ReplicationMode::Async).await;
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGKILL, then a restart on the same data.
    Kill,
    /// SIGSTOP until the failover, then SIGCONT.
    Hang,
}

async fn fail_over_under_sends(fault: Fault, mode: ReplicationMode) {
    let cluster = RouterCluster::start(1, |_| {}).await;
    let routers = cluster.endpoints();
    let dir = tempfile::tempdir().unwrap();
    let mut config = busy_cell_config(dir.path(), "eu-west/c1", &routers, mode);
    if fault == Fault::Hang {
        config.routing.owner_lease_ms = 2_500;
    }
    if mode == ReplicationMode::Sync {
        // Only the synchronous copy reaches the standby.
        std::fs::write(config.data_dir.join("failpoints"), "standby.answers=error").unwrap();
    }
    let mut process = CellProcess::start_configured(dir.path(), &config).await;
    let _fallback = TestCell::start_routed_with(
        "eu-west/c2",
        routers.clone(),
        tempfile::tempdir().unwrap(),
        |c| c.replication.mode = mode,
    )
    .await;
    let routes = cluster.client().await;
    routes
        .apply(assign_tenant(TenantId(1), "eu-west/c1", 0))
        .await
        .unwrap();
    let edge = start_edge(routers.clone()).await;
    let cp = busy_control_plane(routers.clone()).await;

    let alice = token(1, 10);
    let mut m = messaging(&edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    let senders = Senders::start(&edge, conv, &[10, 11]);
    // Sends flow and reach a checkpoint; the standby has the meta.
    wait_for_checkpoint(&routes, conv, 50, Duration::from_secs(15)).await;
    // Long enough for acknowledged answers to be older than the window
    // the re-sends below allow for their replication.
    tokio::time::sleep(Duration::from_millis(800)).await;

    let killed_ms = senders.now_ms();
    match fault {
        Fault::Kill => process.kill(),
        Fault::Hang => process.signal(libc::SIGSTOP),
    }
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
    if fault == Fault::Hang {
        let announced = routes.read(|t| t.cell("eu-west/c1").map(|c| c.owner_lease_ms));
        assert_eq!(announced, Some(2_500), "the cell announced its lease");
        let took = cp.events().iter().find_map(|e| match e {
            Event::FailedOver { cell, took, .. } if cell == "eu-west/c1" => Some(*took),
            _ => None,
        });
        assert!(
            took.is_some_and(|t| t >= Duration::from_millis(2_750)),
            "failed over {took:?} after the first failed probe, inside the cell's lease"
        );
    }
    // Sends go on at the fallback for a while: it writes once the failed
    // cell's lease (2.5 s, a tenth more) has surely run out.
    let ops = senders.finish(Duration::from_millis(5_000)).await;
    // Clients that lost answers from before the kill send again: each gets
    // the answer the killed process gave (its answers reached the standby).
    // Async: those acknowledged well before (their answers had time to
    // reach the standby). Sync: every one, up to the kill.
    let window = match mode {
        ReplicationMode::Async => 500,
        ReplicationMode::Sync => 0,
    };
    let acked_before: Vec<_> = ops
        .iter()
        .filter(|o| o.completed_ms + window <= killed_ms && matches!(o.outcome, Outcome::Ok { .. }))
        .cloned()
        .collect();
    let mut lost: Vec<_> = acked_before.iter().step_by(7).take(10).cloned().collect();
    if mode == ReplicationMode::Sync {
        lost.extend(acked_before.iter().rev().take(10).cloned());
    }
    assert!(!lost.is_empty(), "sends were acknowledged before the kill");
    let client = m.clone();
    let resend = |op: cellmesh_chaos::history::SendOp| {
        let (mut m, token) = (client.clone(), token(1, op.sender));
        async move {
            let r = m.send(authed(text(conv, &op.client_req_id), &token)).await;
            let r = r.expect("a re-send is answered").into_inner();
            assert_eq!(
                Outcome::Ok {
                    msg_id: r.msg_id,
                    seq: r.seq
                },
                op.outcome,
                "re-send of {}",
                op.client_req_id
            );
            assert!(r.duplicate);
        }
    };
    for op in lost.iter().cloned() {
        resend(op).await;
    }
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
    let floor = cellmesh_tests::deploy::floor_of(&routes, conv).await;
    if mode == ReplicationMode::Sync {
        // The promoted standby serves every acknowledged message already.
        let page = pull_via_edge(&mut m, &alice, conv).await;
        assert_eq!(page.unavailable_through, 0, "nothing waits for a backfill");
        let held = history_via_edge(&mut m, &alice, conv).await;
        for op in &acked_before {
            let Outcome::Ok { seq, msg_id } = op.outcome else {
                continue;
            };
            assert!(
                held.iter()
                    .any(|s| s.seq == seq && s.msg_id == msg_id && s.tag == op.client_req_id),
                "{} (seq {seq}) is on the new owner before the backfill",
                op.client_req_id
            );
        }
    }

    // The process returns (on its data, or resumed); its history is
    // backfilled.
    let _returned = match fault {
        Fault::Kill => Some(CellProcess::start_configured(dir.path(), &config).await),
        Fault::Hang => {
            process.signal(libc::SIGCONT);
            None
        }
    };
    wait_for_backfill(&cp, "eu-west/c1", Duration::from_secs(30)).await;
    let page = pull_via_edge(&mut m, &alice, conv).await;
    assert_eq!(page.unavailable_through, 0, "history is complete again");
    let mut history = History {
        sends: ops,
        ..History::default()
    };
    history
        .conversations
        .insert(conv, history_via_edge(&mut m, &alice, conv).await);
    history.floors.push(Floor {
        conversation: conv,
        floor,
    });
    assert_every_invariant(&history);
    // And after the backfill, the same answers still.
    for op in lost {
        resend(op).await;
    }
    cp.stop();
}
