//! Error details are the standard `google.rpc.Status`: a generic decoder
//! (tonic-types, which knows nothing of cellmesh) reads the stable reason
//! from its `ErrorInfo`, the code and the owner route from its metadata,
//! and the wait from its `RetryInfo`.

use cellmesh_proto::reason::Reason;
use cellmesh_tests::deploy::*;
use tonic_types::StatusExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generic_grpc_client_reads_the_reason_from_the_standard_details() {
    let mut d = deploy(None).await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;

    let mut empty = text(conv, "empty");
    empty.body.clear();
    let e = m.send(authed(empty, &alice)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let details = e.get_error_details();
    let info = details.error_info().expect("an ErrorInfo");
    assert_eq!(
        (info.reason.as_str(), info.domain.as_str()),
        (Reason::EmptyBody.as_str(), "cellmesh")
    );
    assert_eq!(info.metadata["code"], "INVALID_ARGUMENT");
    assert!(details.retry_info().is_none());

    // The owner is gone: retryable, with the route the edge tried.
    let dead = d.cells.remove(0);
    let _dir = dead.stop().await;
    let e = m
        .send(authed(text(conv, "to-nobody"), &alice))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e}");
    let details = e.get_error_details();
    let info = details.error_info().expect("an ErrorInfo");
    assert_eq!(info.reason, Reason::OwnerUnreachable.as_str());
    assert_eq!(info.metadata["code"], Reason::RetryLater.as_str());
    assert_eq!(info.metadata["cell_id"], "eu-west/c1");
    let wait = details.retry_info().and_then(|r| r.retry_delay);
    assert!(wait.is_some_and(|w| !w.is_zero()), "{wait:?}");
}
