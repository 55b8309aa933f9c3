//! Releases and the cluster version over a running deployment: every
//! process reports the release it runs (routers in their status, cells,
//! edges and the control plane to the routers), `cellmesh ctl upgrade
//! status` lists them, health checks name it, a new cluster starts at this
//! release, `finalize` to a release nobody runs yet is refused naming
//! every laggard, and a cell of a release older than the cluster version
//! cannot register.

use std::process::Command;
use std::time::Duration;

use cellmesh_proto::reason::Reason;
use cellmesh_proto::version::BINARY;
use cellmesh_route_client::commands::register_cell_at;
use cellmesh_tests::deploy::deploy;
use cellmesh_tests::router::SECRET;
use cellmesh_tests::{cellmesh_bin, eventually};
use serde_json::Value;

fn ctl(routers: &[String], args: &[&str]) -> std::process::Output {
    Command::new(cellmesh_bin())
        .args([
            "ctl",
            "--routers",
            &routers.join(","),
            "--secret",
            SECRET,
            "upgrade",
        ])
        .args(args)
        .output()
        .expect("cellmesh ctl runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_process_reports_its_release_and_finalize_waits_for_all() {
    let d = deploy(None).await;
    let routes = d.cluster.client().await;
    let routers = d.cluster.endpoints();

    // Two cells and the edge report within a period.
    let reported = eventually(Duration::from_secs(20), || {
        let routes = routes.clone();
        async move {
            let p = routes.processes().await;
            let of = |role: &str| {
                p.iter()
                    .filter(|p| p.report.as_ref().unwrap().role == role)
                    .count()
            };
            of("cell") == 2 && of("edge") == 1
        }
    })
    .await;
    assert!(
        reported,
        "cells and edge reported: {:?}",
        routes.processes().await
    );

    let out = ctl(&routers, &["status", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        status["cluster_version"], BINARY,
        "a new cluster starts at its release"
    );
    let processes = status["processes"].as_array().unwrap();
    let names: Vec<String> = processes
        .iter()
        .map(|p| {
            format!(
                "{} {} {}",
                p["role"].as_str().unwrap(),
                p["name"].as_str().unwrap(),
                p["version"].as_str().unwrap()
            )
        })
        .collect();
    for want in ["cell eu-west/c1", "cell us-east/c1", "router node 1"] {
        assert!(
            names.iter().any(|n| n == &format!("{want} {BINARY}")),
            "{want} at {BINARY} in {names:?}"
        );
    }
    assert!(names.iter().any(|n| n.starts_with("edge ")), "{names:?}");

    // Health checks name the release too (cells and routers).
    for endpoint in [d.cells[0].endpoint.clone(), routers[0].clone()] {
        let channel = tonic::transport::Channel::from_shared(endpoint.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut request = tonic::Request::new(tonic_health::pb::HealthCheckRequest::default());
        cellmesh_proto::secret::ClusterSecret::new(SECRET).attach(&mut request);
        let answer = tonic_health::pb::health_client::HealthClient::new(channel)
            .check(request)
            .await
            .unwrap();
        let named = answer.metadata().get(cellmesh_proto::version::HEADER);
        assert_eq!(
            named.and_then(|v| v.to_str().ok()),
            Some(BINARY),
            "{endpoint}'s health check names its release"
        );
    }

    // Nobody runs 0.99.0: refused, naming every process.
    let out = ctl(&routers, &["finalize", "--version", "0.99.0"]);
    assert!(!out.status.success(), "finalize to a release nobody runs");
    let said = String::from_utf8_lossy(&out.stderr);
    for laggard in [
        "cell eu-west/c1 runs",
        "cell us-east/c1 runs",
        "router node 1 runs",
        "edge ",
    ] {
        assert!(said.contains(laggard), "{laggard:?} in {said}");
    }
    assert_eq!(
        routes.read(|t| t.cluster_version.clone()),
        BINARY,
        "unchanged"
    );
    // The release everyone runs: accepted (and idempotent).
    let out = ctl(&routers, &["finalize"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = ctl(&routers, &["finalize", "--version", "0.1.0"]);
    assert!(
        !out.status.success(),
        "the cluster version is never lowered"
    );

    // A cell of an earlier release cannot join a finalized cluster.
    let refused = routes
        .apply(register_cell_at(
            "eu-west/c9",
            "eu-west",
            "http://127.0.0.1:1",
            "0.1.9",
            0,
        ))
        .await
        .unwrap_err();
    let detail = cellmesh_proto::status::error_detail(&refused);
    assert_eq!(detail.reason, Reason::VersionBehind, "{refused:?}");
}
