//! The TypeScript SDK (`clients/web`) against a live edge: builds it (npm,
//! cached under ~/.cache) and runs its Node tests with gRPC-Web to an edge
//! of a two-cell deployment. What they check is in `clients/web/test`.

use cellmesh_edge::EdgeConfig;
use cellmesh_tests::deploy::{TOKEN_SECRET, create_via_edge, messaging, token};
use cellmesh_tests::router::SECRET;
use cellmesh_tests::web;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_sdk_passes_its_tests_against_a_live_edge() {
    web::build();
    let d = cellmesh_tests::deploy::deploy(None).await;
    let edge = cellmesh_edge::start(EdgeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        routers: d.cluster.endpoints(),
        cluster_secret: SECRET.into(),
        token_secret: TOKEN_SECRET.into(),
        ..EdgeConfig::default()
    })
    .await
    .unwrap();
    let mut m = messaging(&edge).await;
    let conv = create_via_edge(&mut m, &token(1, 10), vec![11]).await;
    let report = web::node_tests(
        "test",
        &[
            ("CELLMESH_EDGE", edge.endpoint()),
            ("CELLMESH_CONVERSATION", conv.to_string()),
            ("CELLMESH_TOKEN_A", token(1, 10)),
            ("CELLMESH_TOKEN_B", token(1, 11)),
            ("CELLMESH_TOKEN_OUTSIDER", token(1, 12)),
        ],
    )
    .await;
    assert!(report.contains("# pass 6"), "{report}");
    edge.stop().await;
}
