//! A conversation that fails over to the same cell a second time: the
//! history the first backfill brought back there is no answer for the
//! second. After a failover, a backfill and a move back, the owner fails
//! again; until the second backfill, a send naming an upload on the failed
//! cell stays open (`AWAITING_BACKFILL`) instead of a refusal the
//! backfilled message could contradict, and a page reports the history
//! below the new floor as not yet here.

use cellmesh_proto::ids::{ConversationId, TenantId};
use cellmesh_proto::reason::Reason;
use std::time::Duration;

use cellmesh_proto::v1::ErrorCode;
use cellmesh_route_client::table::Key;
use cellmesh_tests::deploy::{
    assert_reason, authed, migrator, pull_via_edge, text, wait_for_backfill, wait_for_checkpoint,
};
use cellmesh_tests::{TestCell, eventually};

use crate::attachments::{upload_via_edge, write_file};
use crate::exactly_once::{
    FAILED, FALLBACK, fail_first_cell, failover_deployment_with, send_before,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_failover_to_the_same_cell_waits_for_its_own_backfill() {
    let (mut d, routes, cp, alice, mut m, conversation) = failover_deployment_with(|_| {}).await;
    let owner = |cell: &'static str| {
        let routes = routes.clone();
        move || {
            let owned = routes.read(|t| {
                t.resolve(&Key::conversation(
                    TenantId(1),
                    ConversationId(conversation),
                ))
                .is_some_and(|r| r.entry.cell == cell)
            });
            async move { owned }
        }
    };
    // The first failover, and its backfill into the fallback.
    let first = send_before(&mut m, &alice, conversation, 3).await;
    wait_for_checkpoint(&routes, conversation, first[2].seq, Duration::from_secs(10)).await;
    let data = fail_first_cell(&mut d, conversation).await;
    let back = TestCell::start_routed_in(FAILED, d.cluster.endpoints(), data).await;
    wait_for_backfill(&cp, FAILED, Duration::from_secs(30)).await;
    // Moved back to the returned cell, which takes a file and a message.
    migrator(&routes)
        .migrate_conversation(TenantId(1), ConversationId(conversation), FAILED, |_| {})
        .await
        .expect("the conversation moves back");
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "second.bin", 5_000, 7);
    let file = upload_via_edge(&d.edge.endpoint(), &alice, conversation, &path).await;
    let after = m
        .send(authed(text(conversation, "after-the-move"), &alice))
        .await
        .unwrap()
        .into_inner();
    wait_for_checkpoint(&routes, conversation, after.seq, Duration::from_secs(10)).await;

    // The second failover, to the same fallback.
    drop(back.stop().await);
    let failed_over = eventually(Duration::from_secs(30), owner(FALLBACK)).await;
    assert!(failed_over, "no second failover");
    let mut send = text(conversation, "names-the-file");
    send.attachment_ids = vec![file];
    let err = m.send(authed(send, &alice)).await.unwrap_err();
    assert_reason(
        &err,
        ErrorCode::RetryLater,
        Reason::AwaitingBackfill.as_str(),
    );
    let page = pull_via_edge(&mut m, &alice, conversation).await;
    assert!(
        page.unavailable_through > 0,
        "the history below the second floor is not here yet: {page:?}"
    );
    cp.stop();
}
