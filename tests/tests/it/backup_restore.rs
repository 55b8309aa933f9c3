//! A routed cell's backup taken as an operation of the control plane (the
//! schedule's retention kept), then the cell lost with acknowledged
//! messages after the backup: `cellmesh ctl backup restore` brings it back
//! under the same id from its config file, takes the standby's high-water
//! marks, and the restored cell's first seq is exactly above the mark plus
//! the failover margin — never one the lost cell acknowledged.

use std::time::Duration;

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::backups_client::BackupsClient;
use cellmesh_proto::v1::operations_client::OperationsClient;
use cellmesh_proto::v1::start_operation_request::Spec;
use cellmesh_proto::v1::*;
use cellmesh_tests::deploy::*;
use cellmesh_tests::router::SECRET;
use cellmesh_tests::{TestCell, cellmesh_bin};

const OWNER: &str = "eu-west/c1";

fn tuned(backups: std::path::PathBuf) -> impl Fn(&mut cellmesh_cell::CellConfig) {
    move |c: &mut cellmesh_cell::CellConfig| {
        c.backup.local_dir = backups.clone();
        c.routing.checkpoint_interval_ms = 200;
        c.rate_limit.conversation_per_sec = 1_000;
        c.rate_limit.conversation_burst = 1_000;
    }
}

fn secret<T>(message: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    ClusterSecret::new(SECRET).attach(&mut r);
    r
}

async fn backup_op(ops: &mut OperationsClient<tonic::transport::Channel>) -> OperationInfo {
    let started = ops
        .start(secret(StartOperationRequest {
            spec: Some(Spec::Backup(BackupSpec {
                cell_id: OWNER.into(),
                keep: 1,
            })),
        }))
        .await
        .unwrap()
        .into_inner();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let op = loop {
        let op = ops
            .get(secret(OperationRequest {
                id: started.id.clone(),
            }))
            .await
            .unwrap()
            .into_inner();
        let finished = op.state == OperationState::Succeeded as i32
            || op.state == OperationState::Failed as i32;
        if finished || tokio::time::Instant::now() > deadline {
            break op;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let done = op.state == OperationState::Succeeded as i32;
    assert!(
        done && op.state == OperationState::Succeeded as i32,
        "{op:?}"
    );
    op
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_cell_restored_from_its_backup_resumes_above_its_standbys_marks() {
    let shared = tempfile::tempdir().unwrap();
    let tune = tuned(shared.path().join("backups"));
    let mut d = deploy_with(None, &tune).await;
    let routes = d.cluster.client().await;
    let routers = d.cluster.endpoints();
    let mut m = messaging(&d.edge).await;
    let alice = token(1, 10);
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    for i in 0..20 {
        m.send(authed(text(conv, &format!("a-{i}")), &alice))
            .await
            .unwrap();
    }

    // Two backups as operations; the retention keeps the newest.
    let cp = fast_control_plane(routers.clone()).await;
    let mut ops = OperationsClient::connect(format!("http://{}", cp.admin.unwrap()))
        .await
        .unwrap();
    backup_op(&mut ops).await;
    let op = backup_op(&mut ops).await;
    assert!(op.message.contains("backup"), "{op:?}");
    let owner = &d.cells[0];
    let mut cell_backups = BackupsClient::connect(owner.endpoint.clone())
        .await
        .unwrap();
    let listed = cell_backups
        .list(secret(ListBackupsRequest {}))
        .await
        .unwrap()
        .into_inner()
        .backups;
    assert_eq!(listed.len(), 1, "keep = 1");
    assert!(listed[0].route_index > 0, "{listed:?}");
    cp.stop();

    // Acknowledged after the backup, checkpointed at the standby, then lost.
    let mut highest = 0;
    for i in 0..30 {
        let r = m
            .send(authed(text(conv, &format!("b-{i}")), &alice))
            .await
            .unwrap();
        highest = highest.max(r.into_inner().seq);
    }
    wait_for_checkpoint(&routes, conv, highest, Duration::from_secs(10)).await;
    let lost = d.cells.remove(0);
    let _gone = lost.stop().await;

    // Restore from the config file of the new machine.
    let new_dir = tempfile::tempdir().unwrap();
    let mut config = cellmesh_tests::test_config(new_dir.path());
    config.cell_id = OWNER.into();
    config.routing.routers = routers.clone();
    config.routing.cluster_secret = SECRET.into();
    tune(&mut config);
    let file = new_dir.path().join("cell.toml");
    std::fs::write(&file, toml::to_string(&config).unwrap()).unwrap();
    let margin = cellmesh_cell::backup::restore::margin(&config, None);
    let out = std::process::Command::new(cellmesh_bin())
        .args(["ctl", "--routers", &routers.join(","), "--secret", SECRET])
        .args(["backup", "restore", "--json", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(done["marks_from_standbys"], true, "{done}");
    assert_eq!(done["backup"], listed[0].id.as_str());

    let restored = TestCell::start_routed_with(OWNER, routers, new_dir, &tune).await;
    let _restored = restored;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let next = loop {
        match m.send(authed(text(conv, "restored"), &alice)).await {
            Ok(r) => break r.into_inner().seq,
            Err(e) if tokio::time::Instant::now() > deadline => {
                panic!("the restored cell takes no sends: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    assert_eq!(
        next,
        highest + margin + 1,
        "above the standby's mark plus the margin"
    );
    let history = history_via_edge(&mut m, &alice, conv).await;
    let tags: Vec<&str> = history.iter().map(|s| s.tag.as_str()).collect();
    let expected: Vec<String> = (0..20)
        .map(|i| format!("a-{i}"))
        .chain(["restored".to_string()])
        .collect();
    assert_eq!(tags, expected, "the backup's history and the new message");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedule_backs_up_every_cell_and_keeps_the_newest() {
    let shared = tempfile::tempdir().unwrap();
    let d = deploy_with(None, tuned(shared.path().join("backups"))).await;
    let cp =
        cellmesh_control_plane::server::start(cellmesh_control_plane::server::ControlPlaneConfig {
            routers: d.cluster.endpoints(),
            cluster_secret: SECRET.into(),
            console_listen: String::new(),
            admin_listen: "127.0.0.1:0".into(),
            backups: cellmesh_control_plane::operations::backup::BackupSchedule {
                interval_secs: 1,
                keep: 2,
            },
            ..Default::default()
        })
        .await
        .unwrap();
    let counts = |cells: &[TestCell]| {
        let endpoints: Vec<String> = cells.iter().map(|c| c.endpoint.clone()).collect();
        async move {
            let mut out = Vec::new();
            for endpoint in endpoints {
                let mut b = BackupsClient::connect(endpoint).await.unwrap();
                let list = b.list(secret(ListBackupsRequest {})).await.unwrap();
                out.push(list.into_inner().backups.len());
            }
            out
        }
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = counts(&d.cells).await;
        if now.iter().all(|&n| n >= 2) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "backups so far: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Well past two more intervals (four backups each without retention):
    // the newest two of each cell, and a third for the moment between a
    // new backup's manifest and the retention's delete.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let now = counts(&d.cells).await;
    assert!(now.iter().all(|n| (2..=3).contains(n)), "{now:?}");
    cp.stop();
}
