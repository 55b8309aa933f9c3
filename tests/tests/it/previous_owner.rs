//! A route failed over while the cell it left still hears from the route
//! table (the control plane lost that cell, the table did not): the cell
//! may go on writing, from a view of the table that does not show the
//! switch yet, until the owner lease it confirmed before the switch runs
//! out. The new owner writes there only after that, and the edge holds a
//! client's send over the wait.

use cellmesh_proto::reason::Reason;
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1::ErrorCode;
use cellmesh_tests::deploy::*;
use cellmesh_tests::router::SECRET;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_over_route_is_written_once_the_cell_it_left_can_write_no_more() {
    let d = deploy(None).await;
    let routes = d.cluster.client().await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    for i in 0..5 {
        let tag = format!("before-{i}");
        m.send(authed(text(conv, &tag), &alice)).await.unwrap();
    }
    wait_for_checkpoint(&routes, conv, 5, Duration::from_secs(10)).await;

    // eu-west/c1 still runs and renews its lease: only the route moves.
    let fallback = fail_over(&routes, "eu-west/c1", 1_000).await;
    let switched = Instant::now();
    assert_eq!(fallback, "us-east/c1");
    let through_edge = tokio::spawn({
        let (mut m, alice) = (m.clone(), alice.clone());
        async move { m.send(authed(text(conv, "via-edge"), &alice)).await }
    });
    let mut direct = d.cells[1].client().await;
    let send = |tag: &str| {
        let mut r = tonic::Request::new(cellmesh_tests::text(1, 10, conv, tag, "x"));
        ClusterSecret::new(SECRET).attach(&mut r);
        r
    };
    let refused = loop {
        match direct.send(send("early")).await {
            Ok(r) => panic!(
                "the new owner wrote seq {} {} ms after the switch",
                r.into_inner().seq,
                switched.elapsed().as_millis()
            ),
            // Its view of the table has not reached the switch yet.
            Err(e) if error_detail(&e).code == ErrorCode::WrongCell as i32 => {
                assert!(switched.elapsed() < Duration::from_secs(1), "{e:?}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => break e,
        }
    };
    let detail = assert_reason(
        &refused,
        ErrorCode::RetryLater,
        Reason::PreviousOwnerLease.as_str(),
    );
    assert!(detail.retry_after_ms > 0, "{detail:?}");

    // Once the failed cell's lease (1.5 s, a tenth more) has surely run
    // out, the new owner writes.
    let written = loop {
        match direct.send(send("later")).await {
            Ok(r) => break r.into_inner(),
            Err(e) => {
                assert_reason(
                    &e,
                    ErrorCode::RetryLater,
                    Reason::PreviousOwnerLease.as_str(),
                );
                assert!(switched.elapsed() < Duration::from_secs(5), "{e:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let waited = switched.elapsed();
    assert!(waited >= Duration::from_millis(1_400), "{waited:?}");
    let floor = floor_of(&routes, conv).await;
    assert!(
        written.seq > floor,
        "seq {} above floor {floor}",
        written.seq
    );
    let via_edge = through_edge.await.unwrap().expect("the edge held the send");
    assert!(via_edge.into_inner().seq > floor);
    println!(
        "the new owner wrote {} ms after the switch",
        waited.as_millis()
    );
}
