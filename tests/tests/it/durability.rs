//! Acknowledged means fsynced: a cell process killed with SIGKILL right after
//! acknowledging sends keeps every one of them, and seq continues above them,
//! and what is sent after the restart still reaches the members' devices.

use std::time::Duration;

use cellmesh_tests::sync::{connect_sync, message_seqs, messages, subscribe};
use cellmesh_tests::*;

const TENANT: u64 = 3;

#[tokio::test]
async fn sigkill_after_acks_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut cell = CellProcess::start(dir.path()).await;
    let mut client = connect(&cell.endpoint).await;
    let conv = create_group(&mut client, TENANT, 1, &[2, 3, 4]).await;

    // Concurrent senders, so acks come from group-committed batches.
    let senders = (1..=4u64).map(|user| {
        let mut c = client.clone();
        tokio::spawn(async move {
            let mut acks = Vec::new();
            for i in 0..50 {
                let r = c
                    .send(text(
                        TENANT,
                        user,
                        conv,
                        &format!("d{user}-{i}"),
                        &format!("{user}:{i}"),
                    ))
                    .await
                    .expect("send")
                    .into_inner();
                acks.push((r.seq, r.msg_id));
            }
            acks
        })
    });
    let mut acked = Vec::new();
    for s in futures::future::join_all(senders).await {
        acked.extend(s.unwrap());
    }
    cell.kill();
    drop(client);

    let restarted = CellProcess::start(dir.path()).await;
    let mut client = connect(&restarted.endpoint).await;
    let history = pull_all(&mut client, TENANT, 1, conv).await;
    assert_eq!(
        history.len(),
        acked.len(),
        "every acked send survived SIGKILL"
    );
    for (seq, msg_id) in &acked {
        let m = &history[(*seq - 1) as usize];
        assert_eq!((m.seq, m.msg_id), (*seq, *msg_id));
    }
    let next = client
        .send(text(TENANT, 1, conv, "after-restart", "again"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        next.seq,
        acked.len() as u64 + 1,
        "seq continues above the acked ones"
    );
    assert!(
        acked.iter().all(|(_, id)| *id < next.msg_id),
        "msg ids keep increasing"
    );
    // A retry of an acked request is still recognised after the crash.
    let retry = client
        .send(text(TENANT, 2, conv, "d2-0", "2:0"))
        .await
        .unwrap()
        .into_inner();
    assert!(retry.duplicate);
}

/// The fan-out of a restarted cell goes on: its outbox was drained before the
/// kill, and the events it takes after the restart are new ones, not taken
/// for redeliveries of those it fanned out before.
#[tokio::test]
async fn fan_out_goes_on_after_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let mut cell = CellProcess::start(dir.path()).await;
    let mut client = connect(&cell.endpoint).await;
    let conv = create_group(&mut client, TENANT, 1, &[2]).await;
    send_then_read(&mut client, &cell.endpoint, conv, "before", 20).await;
    cell.kill();
    drop(client);

    let restarted = CellProcess::start(dir.path()).await;
    let mut client = connect(&restarted.endpoint).await;
    // Every message, before and after the restart, reaches the device once,
    // in order.
    send_then_read(&mut client, &restarted.endpoint, conv, "after", 5).await;
}

/// A cell that dies in the middle of fanning out — with a batch of events
/// read and none of their effects committed, or right after a batch's
/// effects and queue positions committed but before it announced them —
/// hands every event to the members' queues exactly once, in order, after
/// its restart.
#[tokio::test]
async fn a_fan_out_killed_mid_batch_hands_every_event_over_once() {
    for point in ["fanout.read", "fanout.committed"] {
        let dir = tempfile::tempdir().unwrap();
        let mut cell = CellProcess::start(dir.path()).await;
        let mut client = connect(&cell.endpoint).await;
        let conv = create_group(&mut client, TENANT, 1, &[2]).await;
        send_then_read(&mut client, &cell.endpoint, conv, "before", 5).await;
        std::fs::write(dir.path().join("failpoints"), format!("{point}=abort\n")).unwrap();
        // The cell reads its fail point file every 100 ms.
        tokio::time::sleep(Duration::from_millis(400)).await;
        // The first send's event is read (and the process dies) as soon
        // as it is committed, maybe before its answer leaves.
        for i in 0..20 {
            let sent = client.send(text(TENANT, 1, conv, &format!("{point}-{i}"), "mid"));
            if sent.await.is_err() {
                break;
            }
        }
        let died = eventually(Duration::from_secs(20), || {
            let exited = cell.exited();
            async move { exited }
        })
        .await;
        assert!(died, "the cell did not reach fail point {point}");
        std::fs::remove_file(dir.path().join("failpoints")).unwrap();
        drop(client);

        let restarted = CellProcess::start(dir.path()).await;
        let mut client = connect(&restarted.endpoint).await;
        // Every message — before, at and after the crash — reaches the
        // device once, in order.
        send_then_read(&mut client, &restarted.endpoint, conv, "after", 5).await;
    }
}

/// Sends `n` more messages from user 1 into `conv`, then reads user 2's
/// queue from the start and checks it holds exactly seq 1 to the latest.
async fn send_then_read(client: &mut Client, endpoint: &str, conv: u64, tag: &str, n: usize) {
    let mut latest = 0;
    for i in 0..n {
        let req = format!("{tag}-{i}");
        let sent = client.send(text(TENANT, 1, conv, &req, tag)).await.unwrap();
        latest = sent.into_inner().seq;
    }
    let mut sync = connect_sync(endpoint).await;
    let mut stream = subscribe(&mut sync, TENANT, 2, "phone", 0).await;
    let events = messages(&mut stream, latest as usize, Duration::from_secs(10)).await;
    assert_eq!(message_seqs(&events), (1..=latest).collect::<Vec<_>>());
}
