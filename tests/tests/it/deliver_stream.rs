//! The ordered delivery stream between cells: batches submitted back to
//! back are applied in order and answered in order, and a cell that does
//! not serve the call (an earlier release) is told apart, so the
//! forwarder falls back to one call at a time.

use cellmesh_proto::ids::{TenantId, UserId};
use std::collections::BTreeMap;
use std::time::Duration;

use cellmesh_cell::pipeline::deliver_stream::DeliverStream;
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::*;
use cellmesh_route_client::peers::Peers;
use cellmesh_tests::TestCell;

const T: u64 = 4;

fn batch(user: u64, conversation: u64, seq: u64) -> DeliverBatchRequest {
    DeliverBatchRequest {
        source_cell: "eu-west/c9".into(),
        events: vec![PeerEvent {
            tenant_id: T,
            user_id: user,
            event_id: seq,
            kind: SyncEventKind::Message as i32,
            conversation_id: conversation,
            seq,
            ..Default::default()
        }],
        route_index: 0,
    }
}

#[tokio::test]
async fn batches_sent_back_to_back_are_applied_and_answered_in_order() {
    let home = TestCell::start().await;
    let client = Peers::new(BTreeMap::new()).cell(&home.endpoint).unwrap();
    let stream = DeliverStream::open(client, &ClusterSecret::default(), Duration::from_secs(10));
    let answers: Vec<_> = (1..=20)
        .map(|seq| stream.submit(batch(3, 77, seq)))
        .collect();
    for answer in answers {
        let answer = answer.await.unwrap().expect("delivered");
        assert_eq!(answer.applied, 1);
        assert!(answer.refused.is_empty());
    }
    let queue = home
        .cell
        .service
        .store()
        .sync_after(cellmesh_cell::UserKey::new(TenantId(T), UserId(3)), 0, 100)
        .unwrap();
    let seqs: Vec<u64> = queue.iter().map(|(_, r)| r.seq).collect();
    assert_eq!(seqs, (1..=20).collect::<Vec<_>>());
    // The same events again on a new stream apply nothing.
    let client = Peers::new(BTreeMap::new()).cell(&home.endpoint).unwrap();
    let again = DeliverStream::open(client, &ClusterSecret::default(), Duration::from_secs(10));
    let answer = again.submit(batch(3, 77, 20)).await.unwrap().unwrap();
    assert_eq!(answer.applied, 0);
    drop(again);
    drop(stream);
    // An open stream does not hold the cell's shutdown.
    let client = Peers::new(BTreeMap::new()).cell(&home.endpoint).unwrap();
    let open = DeliverStream::open(client, &ClusterSecret::default(), Duration::from_secs(10));
    open.submit(batch(3, 77, 21)).await.unwrap().unwrap();
    tokio::time::timeout(Duration::from_secs(10), home.stop())
        .await
        .expect("the cell stops with a delivery stream open");
}

#[tokio::test]
async fn a_cell_that_serves_no_streams_is_told_apart() {
    // A gRPC server with no CellPeer service at all.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_, health) = tonic_health::server::health_reporter();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let client = Peers::new(BTreeMap::new())
        .cell(&format!("http://{addr}"))
        .unwrap();
    let stream = DeliverStream::open(client, &ClusterSecret::default(), Duration::from_secs(10));
    let outcome = stream.submit(batch(3, 77, 1)).await.unwrap();
    assert!(outcome.is_err(), "{outcome:?}");
    assert!(stream.is_broken());
    assert!(stream.unimplemented());
    // Broken for good: later batches fail without being sent.
    assert!(stream.submit(batch(3, 77, 2)).await.unwrap().is_err());
}
