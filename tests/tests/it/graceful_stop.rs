//! A graceful stop leaves nothing acknowledged waiting in the cell: what
//! was acknowledged before the stop is fanned out and pushed to the
//! devices streaming from it before their streams end, even when the
//! fan-out is slow.

use std::time::Duration;

use cellmesh_proto::v1::{SyncEventKind, sync_push};
use cellmesh_tests::sync::{connect_sync, subscribe};
use cellmesh_tests::{TestCell, create_group, send_direct, text};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_pushes_what_was_acknowledged_before_it() {
    let cell = TestCell::start().await;
    let mut client = cell.client().await;
    let conv = create_group(&mut client, 1, 1, &[2]).await;
    let mut sync = connect_sync(&cell.endpoint).await;
    let mut stream = subscribe(&mut sync, 1, 2, "phone", 0).await;

    // Every group commit now takes 300 ms: the fan-out of the next send
    // cannot be durable until well after it is acknowledged.
    cell.arm_failpoint("storage.slow_write", "delay(300ms)")
        .await;
    let sent = send_direct(&mut client, text(1, 1, conv, "r1", "just before the stop")).await;
    let stopping = tokio::spawn(cell.stop());

    let mut pushed = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(push)) = stream.message().await {
            if let Some(sync_push::Push::Event(e)) = push.push
                && e.kind == SyncEventKind::Message as i32
            {
                pushed.push(e.seq);
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the stream ends once the cell stops");
    assert!(
        pushed.contains(&sent.seq),
        "message {} acknowledged before the stop was pushed before the stream ended (pushed {pushed:?})",
        sent.seq
    );
    tokio::time::timeout(Duration::from_secs(20), stopping)
        .await
        .expect("the stop ends")
        .unwrap();
}
