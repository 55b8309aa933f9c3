//! The web chat app in a real browser: headless Chromium (Debian's, driven
//! by puppeteer-core from Node) loads the app from two edges of a two-cell
//! deployment and two users chat. The browser side is
//! `clients/web/browser-test`; this test starts the deployment, serves the
//! identity provider's key set on loopback, and moves the tenant, then
//! fails its new cell over, when the browser test asks (a file in a shared
//! directory).

use cellmesh_proto::ids::TenantId;
use std::path::Path;
use std::time::Duration;

use cellmesh_edge::EdgeConfig;
use cellmesh_edge::oidc::OidcProvider;
use cellmesh_tests::deploy::{
    Deployment, TOKEN_SECRET, create_via_edge, deploy, fail_over, messaging, migrator,
    pull_via_edge, token, wait_for_checkpoint,
};
use cellmesh_tests::router::SECRET;
use cellmesh_tests::web;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ISSUER: &str = "https://idp.test";

/// Serves `file` at any path over HTTP/1.0 on a loopback port (404 while
/// it does not exist): the provider's JWKS URL.
async fn serve_file(file: std::path::PathBuf) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut request = [0u8; 4096];
            let _ = conn.read(&mut request).await;
            let answer = match std::fs::read(&file) {
                Ok(body) => [
                    format!("HTTP/1.0 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len()).into_bytes(),
                    body,
                ]
                .concat(),
                Err(_) => b"HTTP/1.0 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_vec(),
            };
            let _ = conn.write_all(&answer).await;
        }
    });
    format!("http://{addr}/jwks.json")
}

async fn edge(
    region: &str,
    routers: Vec<String>,
    origins: Vec<String>,
    oidc: Vec<OidcProvider>,
) -> cellmesh_edge::RunningEdge {
    cellmesh_edge::start(EdgeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        region: region.into(),
        routers,
        cluster_secret: SECRET.into(),
        token_secret: TOKEN_SECRET.into(),
        web_app: true,
        web_root: web::client_dir().join("dist/app").display().to_string(),
        web_origins: origins,
        oidc,
        ..EdgeConfig::default()
    })
    .await
    .expect("edge starts")
}

async fn asked(control: &Path, what: &str) {
    while !control.join(what).exists() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the browser test asks for, in order: `move` (tenant 1 moves to
/// us-east/c1; answered with `moved`), then `fail-over` (us-east/c1 stops
/// and its routes fail over; answered with `failed-over`).
async fn operate(d: &mut Deployment, control: &Path, conv: u64) {
    let routes = d.cluster.client().await;
    asked(control, "move").await;
    migrator(&routes)
        .migrate_tenant(TenantId(1), "us-east/c1", 4, |_| {})
        .await
        .expect("the tenant moves");
    std::fs::write(control.join("moved"), "").unwrap();

    asked(control, "fail-over").await;
    let mut m = messaging(&d.edge).await;
    let latest = pull_via_edge(&mut m, &token(1, 10), conv).await.latest_seq;
    wait_for_checkpoint(&routes, conv, latest, Duration::from_secs(15)).await;
    let cell = d.cells.remove(1);
    let _dir = cell.stop().await;
    assert_eq!(fail_over(&routes, "us-east/c1", 100).await, "eu-west/c1");
    std::fs::write(control.join("failed-over"), "").unwrap();
    std::future::pending::<()>().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_app_works_in_a_real_browser() {
    web::build();
    let mut d = deploy(None).await;
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    let provider = OidcProvider {
        tenant: TenantId(1),
        issuer: ISSUER.into(),
        audience: "cellmesh".into(),
        jwks_file: String::new(),
        jwks_url: serve_file(jwks.clone()).await,
        user_claim: "sub".into(),
        leeway_secs: 30,
    };
    let routers = d.cluster.endpoints();
    let b = edge("ap-south", routers.clone(), vec![], vec![]).await;
    let a = edge("eu-west", routers, vec![b.endpoint()], vec![provider]).await;
    let mut m = messaging(&a).await;
    let conv = create_via_edge(&mut m, &token(1, 10), vec![11, 12]).await;

    let env = [
        ("CELLMESH_EDGE_A", a.endpoint()),
        ("CELLMESH_EDGE_B", b.endpoint()),
        ("CELLMESH_CONVERSATION", conv.to_string()),
        ("CELLMESH_TOKEN_A", token(1, 10)),
        ("CELLMESH_TOKEN_B", token(1, 11)),
        ("CELLMESH_OIDC_USER", "12".into()),
        ("CELLMESH_ISSUER", ISSUER.into()),
        ("CELLMESH_JWKS_PATH", jwks.display().to_string()),
        ("CELLMESH_CONTROL", dir.path().display().to_string()),
    ];
    let report = tokio::select! {
        report = web::node_tests("browser-test", &env) => report,
        () = operate(&mut d, dir.path(), conv) => unreachable!(),
    };
    assert!(report.contains("# pass 9"), "{report}");
    a.stop().await;
    b.stop().await;
}
