//! A recalled message's files stay for `recall_grace_secs` and go with the
//! first sweep after it.

use std::sync::Arc;

use cellmesh_cell::clock::{Clock, ManualClock, SystemClock};
use cellmesh_proto::v1::RecallRequest;
use cellmesh_tests::{TestCell, caller, create_group, text};

use crate::attachments::{files_of, no_progress, write_file};

#[tokio::test]
async fn a_recalled_file_stays_through_its_grace() {
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let cell =
        TestCell::start_with(|c| c.attachments.recall_grace_secs = 3_600, clock.clone()).await;
    let mut client = cell.client().await;
    let conversation = create_group(&mut client, 1, 1, &[2]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "draft.bin", 20_000, 3);
    let a = files_of(&cell, 1, 1)
        .await
        .upload(
            conversation,
            &path,
            "application/octet-stream",
            None,
            &mut no_progress(),
        )
        .await
        .unwrap();
    let mut send = text(1, 1, conversation, "draft", "");
    send.attachment_ids = vec![a.attachment_id];
    let sent = client.send(send).await.unwrap().into_inner();
    client
        .recall(RecallRequest {
            caller: caller(1, 1),
            conversation_id: conversation,
            seq: sent.seq,
        })
        .await
        .unwrap();
    let object = cell
        .dir
        .path()
        .join("attachments/objects")
        .join(&a.object_key);
    let service = &cell.cell.service;
    clock.advance_ms(1_000);
    assert_eq!(service.sweep_uploads().await.unwrap(), 0);
    assert!(object.exists(), "within the grace the file stays");
    clock.advance_ms(3_600 * 1000);
    assert_eq!(service.sweep_uploads().await.unwrap(), 1);
    assert!(!object.exists(), "after the grace it is gone");
}
