//! A send naming a file, re-sent after its conversation failed over
//! inside the replication lag: the new owner holds neither the answer nor
//! (a finished record of) the upload, and the failed cell may have stored
//! the message. The outcome stays open (`AWAITING_BACKFILL`) until the
//! backfill brings the message and its answer, never a refusal the
//! backfilled message would belie.

use cellmesh_cell::storage::Mutation;
use cellmesh_proto::ids::TenantId;
use cellmesh_proto::reason::Reason;
use cellmesh_proto::v1::{ErrorCode, UploadState};
use cellmesh_tests::TestCell;
use cellmesh_tests::deploy::{assert_reason, authed, wait_for_backfill, wait_for_checkpoint};
use std::time::Duration;

use crate::attachments::{upload_via_edge, write_file};
use crate::exactly_once::{fail_first_cell, failover_deployment_with};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_naming_an_upload_on_the_failed_cell_waits_for_the_backfill() {
    resend_after_failover(false).await;
}

/// The new owner had the conversation before a move in its region, and
/// the upload reserved: its record there is that reservation, finished
/// on the cell it moved to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_naming_an_upload_the_new_owner_holds_unfinished_waits_for_the_backfill() {
    resend_after_failover(true).await;
}

async fn resend_after_failover(stale_reservation: bool) {
    let (mut d, routes, cp, alice, mut m, conversation) = failover_deployment_with(|_| {}).await;
    // Answers are not replicated: a failover inside the replication lag.
    let points = cellmesh_cell::failpoints::parse("standby.answers=error").unwrap();
    d.cells[0].cell.service.store().failpoints().set(points);
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "late.bin", 9_000, 3);
    let a = upload_via_edge(&d.edge.endpoint(), &alice, conversation, &path).await;
    let mut send = cellmesh_tests::deploy::text(conversation, "with-late-file");
    send.attachment_ids = vec![a];
    let first = m
        .send(authed(send.clone(), &alice))
        .await
        .unwrap()
        .into_inner();
    wait_for_checkpoint(&routes, conversation, first.seq, Duration::from_secs(10)).await;
    if stale_reservation {
        let owner = d.cells[0].cell.service.store();
        let mut record = owner.upload(TenantId(1), a).unwrap().expect("the upload");
        (record.state, record.referenced) = (UploadState::Reserved as i32, false);
        let mut stale = Mutation::new();
        stale.put_upload(a, &record);
        d.cells[1].cell.service.store().commit(stale).await.unwrap();
    }
    let data = fail_first_cell(&mut d, conversation).await;
    let err = m.send(authed(send.clone(), &alice)).await.unwrap_err();
    assert_reason(
        &err,
        ErrorCode::RetryLater,
        Reason::AwaitingBackfill.as_str(),
    );
    // The failed cell returns; its history and answers are backfilled.
    let _back = TestCell::start_routed_in("eu-west/c1", d.cluster.endpoints(), data).await;
    wait_for_backfill(&cp, "eu-west/c1", Duration::from_secs(30)).await;
    let again = m.send(authed(send, &alice)).await.unwrap().into_inner();
    assert_eq!(
        (again.seq, again.msg_id, again.duplicate),
        (first.seq, first.msg_id, true)
    );
    cp.stop();
}
