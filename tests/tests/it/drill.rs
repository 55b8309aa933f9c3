//! A small crash drill against real `cellmesh cell` processes: concurrent
//! senders and a subscribed device record what they see, the cell is
//! SIGKILLed mid-run and restarted, sends whose outcome was unknown are
//! retried with the same request id, and the recorded history must satisfy
//! every invariant the chaos checker knows.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellmesh_chaos::check_all;
use cellmesh_chaos::history::{CursorAck, DeliveryRecord, History, Outcome, SendOp, Stored};

use cellmesh_proto::v1::{AckRequest, sync_push};
use cellmesh_tests::sync::{connect_sync, device, subscribe};
use cellmesh_tests::*;

const T: u64 = 51;

fn now_ms(epoch: Instant) -> u64 {
    epoch.elapsed().as_millis() as u64
}

/// Sends `tags` from `sender`, recording each outcome.
async fn send_all(
    endpoint: String,
    conv: u64,
    sender: u64,
    tags: Vec<String>,
    epoch: Instant,
) -> Vec<SendOp> {
    let mut ops = Vec::new();
    let Ok(channel) = tonic::transport::Channel::from_shared(endpoint)
        .unwrap()
        .connect()
        .await
    else {
        return tags
            .into_iter()
            .map(|tag| SendOp {
                conversation: conv,
                sender,
                client_req_id: tag,
                invoked_ms: now_ms(epoch),
                completed_ms: now_ms(epoch),
                outcome: Outcome::Rejected {
                    code: "UNREACHABLE".into(),
                },
            })
            .collect();
    };
    let mut client = cellmesh_proto::v1::messaging_client::MessagingClient::new(channel);
    for tag in tags {
        let invoked_ms = now_ms(epoch);
        let outcome = match tokio::time::timeout(
            Duration::from_secs(5),
            client.send(text(T, sender, conv, &tag, &tag)),
        )
        .await
        {
            Ok(answer) => Outcome::of_send(answer.as_ref().map(|r| r.get_ref())),
            Err(_) => Outcome::Unknown,
        };
        ops.push(SendOp {
            conversation: conv,
            sender,
            client_req_id: tag,
            invoked_ms,
            completed_ms: now_ms(epoch),
            outcome,
        });
    }
    ops
}

/// Follows user 2's "phone" until `stop`, recording deliveries and acks.
async fn follow(
    endpoint: String,
    session: u64,
    record: Arc<Mutex<History>>,
    epoch: Instant,
    stop: Duration,
) {
    let mut s = connect_sync(&endpoint).await;
    let mut stream = subscribe(&mut s, T, 2, "phone", 0).await;
    let deadline = tokio::time::Instant::now() + stop;
    while let Ok(Ok(Some(push))) = tokio::time::timeout_at(deadline, stream.message()).await {
        if let Some(sync_push::Push::Event(e)) = push.push {
            record.lock().unwrap().deliveries.push(DeliveryRecord {
                tenant: T,
                user: 2,
                device: "phone".into(),
                session,
                pts: e.pts,
                conversation: e.conversation_id,
                seq: e.seq,
                kind: e.kind,
                queue: e.queue_id,
                at_ms: epoch.elapsed().as_millis() as u64,
            });
            if let Ok(ack) = s
                .ack(AckRequest {
                    caller: device(T, 2, "phone"),
                    pts: e.pts,
                    queue_id: e.queue_id,
                })
                .await
            {
                let ack = ack.into_inner();
                record.lock().unwrap().cursor_acks.push(CursorAck {
                    tenant: T,
                    user: 2,
                    device: "phone".into(),
                    at_ms: now_ms(epoch),
                    cursor: ack.cursor,
                    queue: ack.queue_id,
                });
            }
        }
    }
}

#[tokio::test]
async fn a_crash_drill_satisfies_every_invariant() {
    let epoch = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let mut cell = CellProcess::start(dir.path()).await;
    let mut c = connect(&cell.endpoint).await;
    let conv = create_group(&mut c, T, 1, &[2, 3, 4]).await;
    let record = Arc::new(Mutex::new(History::default()));

    // Phase 1: four senders and a device; the cell is killed mid-stream.
    let follower = tokio::spawn(follow(
        cell.endpoint.clone(),
        1,
        record.clone(),
        epoch,
        Duration::from_secs(2),
    ));
    let senders: Vec<_> = (1..=4u64)
        .map(|user| {
            let tags = (0..400).map(|i| format!("u{user}-{i}")).collect();
            tokio::spawn(send_all(cell.endpoint.clone(), conv, user, tags, epoch))
        })
        .collect();
    // Kill once the pipeline is visibly working, so the crash lands mid-stream.
    let seen = record.clone();
    let working = eventually(Duration::from_secs(20), || {
        let seen = seen.clone();
        async move { seen.lock().unwrap().deliveries.len() >= 20 }
    })
    .await;
    assert!(working, "deliveries before the crash");
    cell.kill();
    for s in senders {
        let ops = s.await.unwrap();
        record.lock().unwrap().sends.extend(ops);
    }
    follower.await.unwrap();

    // Phase 2: restart; retry every send whose outcome is unknown (same id).
    let cell = CellProcess::start(dir.path()).await;
    let follower = tokio::spawn(follow(
        cell.endpoint.clone(),
        2,
        record.clone(),
        epoch,
        Duration::from_secs(3),
    ));
    let retries: Vec<(u64, String)> = record
        .lock()
        .unwrap()
        .sends
        .iter()
        .filter(|s| s.outcome == Outcome::Unknown)
        .map(|s| (s.sender, s.client_req_id.clone()))
        .collect();
    for (sender, tag) in retries {
        let ops = send_all(cell.endpoint.clone(), conv, sender, vec![tag], epoch).await;
        record.lock().unwrap().sends.extend(ops);
    }
    let more = send_all(
        cell.endpoint.clone(),
        conv,
        1,
        (0..20).map(|i| format!("after-{i}")).collect(),
        epoch,
    )
    .await;
    record.lock().unwrap().sends.extend(more);
    follower.await.unwrap();

    // Read back and check.
    let mut c = connect(&cell.endpoint).await;
    let stored: Vec<Stored> = pull_all(&mut c, T, 1, conv)
        .await
        .into_iter()
        .map(|m| Stored {
            seq: m.seq,
            msg_id: m.msg_id,
            tag: String::from_utf8_lossy(&m.body).into_owned(),
        })
        .collect();
    let mut history = record.lock().unwrap().clone();
    history.conversations.insert(conv, stored);
    history.tenants.insert(conv, T);

    let before_crash = |want: fn(&Outcome) -> bool| {
        history
            .sends
            .iter()
            .filter(|s| s.client_req_id.starts_with('u') && want(&s.outcome))
            .count()
    };
    let acked = before_crash(|o| matches!(o, Outcome::Ok { .. }));
    let cut_off = before_crash(|o| !matches!(o, Outcome::Ok { .. }));
    assert!(
        acked >= 20 && cut_off >= 1,
        "crash mid-stream: {acked} acked, {cut_off} cut off"
    );
    assert!(!history.deliveries.is_empty(), "the device saw deliveries");
    let failed: Vec<_> = check_all(&history)
        .into_iter()
        .filter(|v| !v.holds)
        .collect();
    assert!(failed.is_empty(), "invariants violated: {failed:#?}");
}
