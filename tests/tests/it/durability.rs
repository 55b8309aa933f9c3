//! Acknowledged means fsynced: a cell process killed with SIGKILL right after
//! acknowledging sends keeps every one of them, and seq continues above them.

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
