//! The TypeScript SDK (`clients/web`) against a live edge: builds it (npm,
//! cached under ~/.cache) and runs its Node tests with gRPC-Web to an edge
//! of a two-cell deployment. What they check is in `clients/web/test`.

use std::path::PathBuf;
use std::process::Command;

use cellmesh_edge::EdgeConfig;
use cellmesh_tests::deploy::{TOKEN_SECRET, create_via_edge, messaging, token};
use cellmesh_tests::router::SECRET;

fn npm(dir: &PathBuf, args: &[&str]) {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let out = Command::new("npm")
        .args(args)
        .current_dir(dir)
        .env("npm_config_cache", format!("{home}/.cache/cellmesh/npm"))
        .output()
        .expect("npm runs");
    assert!(
        out.status.success(),
        "npm {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_sdk_passes_its_tests_against_a_live_edge() {
    let sdk = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../clients/web");
    if !sdk.join("node_modules/.bin/tsc").exists() {
        npm(&sdk, &["ci", "--no-audit", "--no-fund"]);
    }
    npm(&sdk, &["run", "build"]);

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
    let out = tokio::process::Command::new("node")
        .args(["--test", "dist/test/"])
        .current_dir(&sdk)
        .env("CELLMESH_EDGE", edge.endpoint())
        .env("CELLMESH_CONVERSATION", conv.to_string())
        .env("CELLMESH_TOKEN_A", token(1, 10))
        .env("CELLMESH_TOKEN_B", token(1, 11))
        .env("CELLMESH_TOKEN_OUTSIDER", token(1, 12))
        .output()
        .await
        .expect("node runs");
    assert!(
        out.status.success(),
        "the SDK's tests failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("# pass 4"), "{report}");
    edge.stop().await;
}
