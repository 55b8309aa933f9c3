//! Coordination against a real etcd: lease registrations disappear with
//! their holder, one control-plane replica leads and a second takes over
//! when it dies, and cells register themselves under a lease.

use std::time::Duration;

use cellmesh_control_plane::server::{ControlPlaneConfig, CoordinationBackend, CoordinationConfig};
use cellmesh_coord::etcd::EtcdCoordination;
use cellmesh_coord::{CELLS_PREFIX, CONTROL_PLANE_ELECTION, Coordination};
use cellmesh_tests::etcd::Etcd;
use cellmesh_tests::router::{RouterCluster, SECRET};
use cellmesh_tests::{eventually, test_config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_leases_and_elections_follow_their_holders() {
    let etcd = Etcd::start().await;
    let c = EtcdCoordination::connect(std::slice::from_ref(&etcd.endpoint))
        .await
        .unwrap();
    let ttl = Duration::from_secs(2);
    let lease = c
        .register("cellmesh/cells/eu/c1", "http://a", ttl)
        .await
        .unwrap();
    assert_eq!(
        c.list(CELLS_PREFIX)
            .await
            .unwrap()
            .get("cellmesh/cells/eu/c1")
            .map(String::as_str),
        Some("http://a")
    );
    drop(lease);
    assert!(
        eventually(Duration::from_secs(5), || async {
            c.list(CELLS_PREFIX).await.unwrap().is_empty()
        })
        .await,
        "a dropped registration is revoked"
    );
    assert_eq!(c.leader("nobody-yet").await.unwrap(), None);
    let first = c.campaign("e", "one", ttl).await.unwrap();
    assert_eq!(c.leader("e").await.unwrap().as_deref(), Some("one"));
    let c2 = EtcdCoordination::connect(std::slice::from_ref(&etcd.endpoint))
        .await
        .unwrap();
    let second =
        tokio::spawn(async move { c2.campaign("e", "two", ttl).await.map(|l| l.is_lost()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!second.is_finished(), "one leader at a time");
    drop(first);
    let lost = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!lost);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_control_plane_takes_over_and_cells_register_under_leases() {
    let etcd = Etcd::start().await;
    let cluster = RouterCluster::start(1, |_| {}).await;
    let config = |name: &str| ControlPlaneConfig {
        routers: cluster.endpoints(),
        cluster_secret: SECRET.into(),
        coordination: CoordinationConfig {
            backend: CoordinationBackend::Etcd,
            etcd_endpoints: vec![etcd.endpoint.clone()],
            name: name.into(),
            lease_ttl_ms: 2000,
            ..CoordinationConfig::default()
        },
        console_listen: "127.0.0.1:0".into(),
        admin_listen: "127.0.0.1:0".into(),
        ..ControlPlaneConfig::default()
    };
    let active = cellmesh_control_plane::server::start(config("cp-1"))
        .await
        .unwrap();
    assert!(eventually(Duration::from_secs(10), || async { active.is_leader() }).await);
    let standby = cellmesh_control_plane::server::start(config("cp-2"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!standby.is_leader(), "two active control planes");
    let c = EtcdCoordination::connect(std::slice::from_ref(&etcd.endpoint))
        .await
        .unwrap();
    assert_eq!(
        c.leader(CONTROL_PLANE_ELECTION).await.unwrap().as_deref(),
        Some("cp-1")
    );
    active.stop();
    assert!(
        eventually(Duration::from_secs(10), || async { standby.is_leader() }).await,
        "the standby took over"
    );
    assert_eq!(
        c.leader(CONTROL_PLANE_ELECTION).await.unwrap().as_deref(),
        Some("cp-2")
    );
    // The standby's console shows the new leader.
    let console = standby.console.expect("the console is on");
    assert!(
        eventually(Duration::from_secs(10), || async {
            cellmesh_tests::http::status(console).await["control_plane"]["leader"] == "cp-2"
        })
        .await,
        "{}",
        cellmesh_tests::http::status(console).await
    );

    // A routed cell with etcd endpoints registers itself while it serves.
    let dir = tempfile::tempdir().unwrap();
    let mut cell_config = test_config(dir.path());
    cell_config.cell_id = "eu-west/c7".into();
    cell_config.routing.routers = cluster.endpoints();
    cell_config.routing.cluster_secret = SECRET.into();
    cell_config.routing.etcd_endpoints = vec![etcd.endpoint.clone()];
    let placement = cellmesh_cell::Placement::routed(&cell_config)
        .await
        .unwrap();
    let cell = cellmesh_cell::start_placed(
        cell_config,
        placement,
        std::sync::Arc::new(cellmesh_cell::clock::SystemClock),
    )
    .await
    .unwrap();
    let registered = c.list(CELLS_PREFIX).await.unwrap();
    assert!(
        registered.contains_key("cellmesh/cells/eu-west/c7"),
        "{registered:?}"
    );
    cell.shutdown().await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            c.list(CELLS_PREFIX).await.unwrap().is_empty()
        })
        .await,
        "the registration ends with the cell"
    );
    standby.stop();
}

/// A record written by compare-and-put changes only from the value the
/// writer read: the second of two writers that read the same value loses,
/// on every backend.
async fn compare_and_put_refuses_a_stale_writer(c: &dyn Coordination) {
    let key = "cellmesh/operations/op-cas";
    assert!(c.compare_and_put(key, None, "v1").await.unwrap());
    assert!(
        !c.compare_and_put(key, None, "other").await.unwrap(),
        "the key exists now"
    );
    assert!(c.compare_and_put(key, Some("v1"), "v2").await.unwrap());
    assert!(
        !c.compare_and_put(key, Some("v1"), "stale").await.unwrap(),
        "a writer that read v1 must not overwrite v2"
    );
    let records = c.records("cellmesh/operations/").await.unwrap();
    assert_eq!(records.get(key).map(String::as_str), Some("v2"));
    c.put(key, "v3").await.unwrap();
    assert!(c.compare_and_put(key, Some("v3"), "v4").await.unwrap());
    // A delete, as a put, holds only against the value read.
    assert!(
        !c.compare_and_delete(key, "v3").await.unwrap(),
        "a pruner that read v3 must not delete v4"
    );
    assert!(
        !c.compare_and_delete("cellmesh/operations/none", "v4")
            .await
            .unwrap()
    );
    assert!(c.compare_and_delete(key, "v4").await.unwrap());
    assert!(c.records("cellmesh/operations/").await.unwrap().is_empty());
}

#[tokio::test]
async fn compare_and_put_holds_on_etcd_lock_files_and_in_process() {
    let etcd = Etcd::start().await;
    let on_etcd = EtcdCoordination::connect(std::slice::from_ref(&etcd.endpoint))
        .await
        .unwrap();
    compare_and_put_refuses_a_stale_writer(&on_etcd).await;
    let dir = tempfile::tempdir().unwrap();
    let local = cellmesh_coord::local::LocalCoordination::open(dir.path()).unwrap();
    compare_and_put_refuses_a_stale_writer(&local).await;
    compare_and_put_refuses_a_stale_writer(
        &cellmesh_coord::embedded::EmbeddedCoordination::default(),
    )
    .await;
}

/// etcd over mutual TLS, as Terraform deploys it: a process with `[tls]`
/// reaches `https://` endpoints presenting its own certificate and
/// registers under a lease; a client without a certificate, or with one
/// the CA revoked, gets nothing; and `https://` endpoints without `[tls]`
/// are refused before any connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_over_mutual_tls_takes_only_certified_clients() {
    use cellmesh_deployment::dev::pki::Pki;
    use cellmesh_proto::tls::{Peer, Role};
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path()).unwrap();
    let revoked = pki.issue(&Peer::new(Role::Edge, "eu-west")).unwrap();
    pki.revoke(std::path::Path::new(&revoked.cert_file))
        .unwrap();
    let tls = cellmesh_tests::etcd::EtcdTls {
        server: pki
            .issue_server("etcd-1", &["127.0.0.1".to_string()])
            .unwrap(),
        client: pki.issue(&Peer::new(Role::Cell, "eu-west/c1")).unwrap(),
    };
    let etcd = Etcd::start_tls(&tls).await;
    let endpoints = std::slice::from_ref(&etcd.endpoint);
    let refused = EtcdCoordination::connect(endpoints).await.err();
    assert!(
        refused.is_some_and(|e| e.to_string().contains("need [tls]")),
        "https:// endpoints without [tls]"
    );
    let anonymous = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_tls(
            etcd_client::TlsOptions::new()
                .domain_name(cellmesh_proto::tls::SERVER_NAME)
                .ca_certificate(etcd_client::Certificate::from_pem(
                    std::fs::read(&tls.client.ca_file).unwrap(),
                )),
        );
    for options in [anonymous, cellmesh_tests::etcd::client_options(&revoked)] {
        let answered = match etcd_client::Client::connect(endpoints, Some(options)).await {
            Ok(mut client) => client.status().await.is_ok(),
            Err(_) => false,
        };
        assert!(
            !answered,
            "etcd answered a client without a valid certificate"
        );
    }
    cellmesh_proto::tls::install(&tls.client).unwrap();
    let c = EtcdCoordination::connect(endpoints).await.unwrap();
    let _lease = c
        .register(
            "cellmesh/cells/eu-west/c1",
            "http://a",
            Duration::from_secs(2),
        )
        .await
        .unwrap();
    assert_eq!(c.list(CELLS_PREFIX).await.unwrap().len(), 1);
}
