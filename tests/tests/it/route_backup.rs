//! A route-table backup (`ctl backup routes`: a router replica's Raft
//! snapshot, stored with its manifest) brings up a new router group
//! (`ctl backup restore-routes`, then a replica started with
//! `cluster.restore_from` on an empty data dir) that serves the same cells
//! and routes, nothing written after the backup, and takes new writes at
//! indices above the backup's.

use std::time::Duration;

use cellmesh_proto::ids::TenantId;
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::commands::assign_tenant;
use cellmesh_route_client::table::Key;
use cellmesh_tests::cellmesh_ok;
use cellmesh_tests::deploy::deploy;
use cellmesh_tests::router::{SECRET, router_config};

fn ctl(routers: &[String], args: &[&str]) -> serde_json::Value {
    let routers = routers.join(",");
    let base = ["ctl", "--routers", &routers, "--secret", SECRET];
    let out = cellmesh_ok(base.iter().chain(args));
    serde_json::from_slice(&out).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_table_backup_brings_up_a_new_group_with_the_same_routes() {
    let d = deploy(None).await;
    let routes = d.cluster.client().await;
    let routers = d.cluster.endpoints();
    routes
        .apply(assign_tenant(TenantId(2), "us-east/c1", 0))
        .await
        .unwrap();
    let store = tempfile::tempdir().unwrap();
    let config = store.path().join("backup.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\n[backup]\nlocal_dir = {:?}\n",
            store.path().join("data"),
            store.path().join("backups")
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let taken = ctl(
        &routers,
        &["backup", "routes", "--json", "--config", config],
    );
    let applied = taken["applied_index"].as_u64().unwrap();
    assert!(applied > 0 && taken["cells"] == 2, "{taken}");
    let before = routes.read(|t| {
        (
            t.cells.keys().cloned().collect::<Vec<_>>(),
            t.routes.clone(),
        )
    });
    // Written after the backup: not in the restored group.
    routes
        .apply(assign_tenant(TenantId(3), "us-east/c1", 0))
        .await
        .unwrap();

    let snap = store.path().join("routes.snapshot");
    let fetched = ctl(
        &routers,
        &[
            "backup",
            "restore-routes",
            "--json",
            "--config",
            config,
            "--out",
            snap.to_str().unwrap(),
        ],
    );
    assert_eq!(fetched["id"], taken["id"]);

    let dir = tempfile::tempdir().unwrap();
    let mut restored = router_config(7, "eu-west", dir.path());
    restored.cluster.restore_from = snap.display().to_string();
    let router = cellmesh_router::node::start(restored).await.unwrap();
    let endpoint = format!("http://{}", router.api_addr);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let new = loop {
        let connected =
            RouteClient::connect(vec![endpoint.clone()], ClusterSecret::new(SECRET)).await;
        if let Ok(c) = connected
            && c.apply(assign_tenant(TenantId(4), "eu-west/c1", 0))
                .await
                .is_ok()
        {
            break c;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the restored replica elects itself and takes writes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // The client's copy of the table follows the group's watch.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !new.read(|t| t.routes.contains_key(&Key::tenant(TenantId(4)))) {
        assert!(tokio::time::Instant::now() < deadline, "the write is seen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (cells, table, index) = new.read(|t| {
        (
            t.cells.keys().cloned().collect::<Vec<_>>(),
            t.routes.clone(),
            t.applied,
        )
    });
    assert_eq!(cells, before.0, "the same cells");
    assert!(
        index > applied,
        "indices go on above the backup's ({index} vs {applied})"
    );
    for (key, entry) in &before.1 {
        assert_eq!(table.get(key), Some(entry), "{key:?}");
    }
    assert!(
        !table.contains_key(&Key::tenant(TenantId(3))),
        "written after the backup"
    );
    assert_eq!(
        table.get(&Key::tenant(TenantId(4))).unwrap().cell,
        "eu-west/c1"
    );

    drop(new);
    router.stop().await;
}
