//! A route failed over while the cell it left still hears from the route
//! table (the control plane lost that cell, the table did not): the cell
//! may go on writing, from a view of the table that does not show the
//! switch yet, until the owner lease it confirmed before the switch runs
//! out. The new owner writes there only after that, and the edge holds a
//! client's send over the wait — unless the table fenced the cell (marked
//! it Degraded) a lease before: no renewal answered after the fence
//! counts, so the cell stops within a lease of it and the new owner
//! writes at once.

use cellmesh_proto::reason::Reason;
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1::ErrorCode;
use cellmesh_tests::deploy::*;
use cellmesh_tests::router::SECRET;
use std::time::{Duration, Instant};

/// A deployment with one conversation on eu-west/c1, five messages in it,
/// their marks held by its standbys.
struct Conversation {
    d: Deployment,
    routes: cellmesh_route_client::client::RouteClient,
    alice: String,
    m: cellmesh_proto::v1::messaging_client::MessagingClient<tonic::transport::Channel>,
    conv: u64,
}

async fn conversation_on_eu_west() -> Conversation {
    let d = deploy(None).await;
    let routes = d.cluster.client().await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    for i in 0..5 {
        m.send(authed(text(conv, &format!("before-{i}")), &alice))
            .await
            .unwrap();
    }
    wait_for_checkpoint(&routes, conv, 5, Duration::from_secs(10)).await;
    Conversation {
        d,
        routes,
        alice,
        m,
        conv,
    }
}

fn direct_send(conv: u64, tag: &str) -> tonic::Request<cellmesh_proto::v1::SendRequest> {
    let mut r = tonic::Request::new(cellmesh_tests::text(1, 10, conv, tag, "x"));
    ClusterSecret::new(SECRET).attach(&mut r);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_over_route_is_written_once_the_cell_it_left_can_write_no_more() {
    let Conversation {
        d,
        routes,
        alice,
        m,
        conv,
    } = conversation_on_eu_west().await;

    // eu-west/c1 still runs and renews its lease: only the route moves.
    let fallback = fail_over(&routes, "eu-west/c1", 1_000).await;
    let switched = Instant::now();
    assert_eq!(fallback, "us-east/c1");
    let through_edge = tokio::spawn({
        let (mut m, alice) = (m.clone(), alice.clone());
        async move { m.send(authed(text(conv, "via-edge"), &alice)).await }
    });
    let mut direct = d.cells[1].client().await;
    let send = |tag: &str| direct_send(conv, tag);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_fenced_a_lease_before_its_failover_stops_writing_and_its_successor_writes_at_once()
{
    let Conversation {
        d,
        routes,
        alice,
        mut m,
        conv,
    } = conversation_on_eu_west().await;

    // The table fences eu-west/c1, which still runs and hears the table.
    let fence = cellmesh_route_client::commands::set_cell_status(
        "eu-west/c1",
        cellmesh_proto::v1::CellStatus::Degraded,
    );
    routes.apply(fence).await.unwrap();
    let fenced = Instant::now();
    let mut old = d.cells[0].client().await;
    let mut last_written = None;
    let refused = loop {
        match old.send(direct_send(conv, "fenced")).await {
            Ok(_) => last_written = Some(fenced.elapsed()),
            Err(e) => break e,
        }
        assert!(
            fenced.elapsed() < Duration::from_secs(3),
            "the fenced cell still writes {:?} after the fence",
            fenced.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_reason(
        &refused,
        ErrorCode::RetryLater,
        Reason::OwnerLeaseExpired.as_str(),
    );
    // Its lease (1.5 s) was confirmed before the fence at the latest.
    let last = last_written.expect("the fenced cell wrote on its lease at first");
    assert!(last <= Duration::from_millis(1_700), "{last:?}");

    // A lease after the fence, the routes move; the successor writes at
    // once (it learns of the switch, then writes: no lease to wait for).
    tokio::time::sleep(Duration::from_millis(1_650).saturating_sub(fenced.elapsed())).await;
    assert_eq!(fail_over(&routes, "eu-west/c1", 1_000).await, "us-east/c1");
    let switched = Instant::now();
    let mut new = d.cells[1].client().await;
    let written = loop {
        match new.send(direct_send(conv, "at-once")).await {
            Ok(r) => break r.into_inner(),
            Err(e) if error_detail(&e).code == ErrorCode::WrongCell as i32 => {
                assert!(switched.elapsed() < Duration::from_secs(1), "{e:?}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!(
                "the successor refused {} ms after the switch: {e:?}",
                switched.elapsed().as_millis()
            ),
        }
    };
    assert!(written.seq > floor_of(&routes, conv).await);
    let via_edge = m
        .send(authed(text(conv, "via-edge"), &alice))
        .await
        .unwrap();
    assert!(via_edge.into_inner().seq > written.seq);
}
