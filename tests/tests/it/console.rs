//! The control plane's web console, loaded in headless Chromium: the page
//! renders every cell in its region's column, coloured by health, and a
//! running migration's progress moves between two loads, and a cell's
//! failover hold shows on its card; and the bytes of files each tenant
//! keeps.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::net::SocketAddr;
use std::time::Duration;

use cellmesh_control_plane::migration::{MigrationOptions, Migrator};
use cellmesh_control_plane::server::ControlPlaneConfig;
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_tests::browser::rendered;
use cellmesh_tests::deploy::*;
use cellmesh_tests::eventually;
use cellmesh_tests::router::SECRET;

/// `data-progress` of the migration row for `key`.
fn progress(dom: &str, key: &str) -> Option<u64> {
    let row = &dom[dom.find(&format!("data-key=\"{key}\""))?..];
    let at = row.find("data-progress=\"")? + "data-progress=\"".len();
    row[at..].split('"').next()?.parse().ok()
}

/// The migration's progress in the console's status object.
async fn api_progress(console: SocketAddr, key: &str) -> Option<u64> {
    let status = cellmesh_tests::http::status(console).await;
    status["migrations"]
        .as_array()?
        .iter()
        .find(|m| m["key"] == key)
        .map(|m| m["progress_pct"].as_u64().unwrap_or(0))
}

/// The two-region deployment and a control plane serving its console.
async fn with_console() -> (
    Deployment,
    cellmesh_control_plane::server::RunningControlPlane,
    SocketAddr,
) {
    let d = deploy(None).await;
    let cp = cellmesh_control_plane::server::start(ControlPlaneConfig {
        routers: d.cluster.endpoints(),
        cluster_secret: SECRET.into(),
        console_listen: "127.0.0.1:0".into(),
        admin_listen: "127.0.0.1:0".into(),
        ..ControlPlaneConfig::default()
    })
    .await
    .unwrap();
    let console = cp.console.expect("the console is on");
    (d, cp, console)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_every_cell_and_a_migration_moving() {
    let (d, cp, console) = with_console().await;
    // A planned restart of us-east/c1 is on its card.
    let admin = [format!("http://{}", cp.admin.expect("admin API"))];
    let hold = Duration::from_secs(600);
    let secret = ClusterSecret::new(SECRET);
    cellmesh_control_plane::failover::holds::request(
        &admin,
        &secret,
        "us-east/c1",
        hold,
        "upgrade",
    )
    .await
    .unwrap();

    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    for i in 0..400 {
        m.send(authed(text(conv, &format!("m{i}")), &alice))
            .await
            .unwrap();
    }
    // A throttled move: 20 messages per round, a quarter second apart.
    let migrator = Migrator::new(
        d.cluster.client().await,
        ClusterSecret::new(SECRET),
        MigrationOptions {
            chunk: 10,
            round_messages: 20,
            pause: Duration::from_millis(250),
            ..MigrationOptions::default()
        },
    );
    let moving = tokio::spawn(async move {
        migrator
            .migrate_conversation(TenantId(1), ConversationId(conv), "us-east/c1", |_| {})
            .await
    });
    let key = format!("conversation {conv} of tenant 1");
    // The console samples once a second; wait until it has seen the move.
    assert!(
        eventually(Duration::from_secs(10), || async {
            api_progress(console, &key).await.is_some()
        })
        .await
    );

    let first = rendered(console).await;
    assert!(first.contains("data-loaded=\"true\""), "{first}");
    for (cell, region) in [("eu-west/c1", "eu-west"), ("us-east/c1", "us-east")] {
        assert!(
            first.contains(&format!("class=\"cell ok\" data-cell=\"{cell}\"")),
            "{cell} is shown healthy: {first}"
        );
        assert!(first.contains(&format!("data-region=\"{region}\"")));
    }
    assert!(first.contains("class=\"arrow\""), "the move is drawn");
    let card = |cell: &str| {
        let tag = first.split(&format!("data-cell=\"{cell}\"")).nth(1);
        tag.and_then(|t| t.split('>').next())
            .unwrap_or("")
            .to_string()
    };
    assert!(
        card("us-east/c1").contains("data-held=\"upgrade\""),
        "{first}"
    );
    assert!(!card("eu-west/c1").contains("data-held"), "{first}");
    assert!(first.contains("failover held"), "{first}");
    let before = progress(&first, &key).unwrap_or_else(|| panic!("{key} is listed: {first}"));
    assert!(
        eventually(Duration::from_secs(20), || async {
            api_progress(console, &key).await.is_none_or(|p| p > before)
        })
        .await
    );
    let second = rendered(console).await;
    let after = progress(&second, &key).unwrap_or(100);
    assert!(after > before, "progress moved: {before}% then {after}%");

    let report = moving.await.unwrap().unwrap();
    assert_eq!(report.final_seq, 400);
    cp.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_and_status_show_the_bytes_of_files_per_tenant() {
    let (d, cp, console) = with_console().await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conversation = create_via_edge(&mut m, &alice, vec![11]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = crate::attachments::write_file(dir.path(), "sheet.bin", 33_000, 1);
    crate::attachments::edge_files(&d.edge.endpoint(), &alice)
        .await
        .upload(
            conversation,
            &path,
            "application/octet-stream",
            None,
            &mut crate::attachments::no_progress(),
        )
        .await
        .unwrap();
    let tenant_bytes = || async {
        let status = cellmesh_tests::http::status(console).await;
        (status["files"].as_array().into_iter().flatten())
            .find(|f| f["tenant"] == 1)
            .and_then(|f| f["bytes"].as_u64())
    };
    assert!(
        eventually(Duration::from_secs(10), || async {
            tenant_bytes().await == Some(33_000)
        })
        .await,
        "status: {:?}",
        tenant_bytes().await
    );
    let page = rendered(console).await;
    assert!(
        page.contains("data-tenant=\"1\" data-bytes=\"33000\""),
        "the console lists the tenant's files: {page}"
    );
    cp.stop();
}
