//! `cellmesh ctl status`: the deployment at a glance — regions and their
//! cells (route status, health, what they own, sends/s, queue lag, uptime),
//! router replicas, the control-plane leader, migrations in progress
//! with their progress, and the bytes of files per tenant. `--json` prints the same as one object.

use std::path::Path;
use std::time::Duration;

use cellmesh_control_plane::status::Sampler;
use cellmesh_coord::etcd::EtcdCoordination;
use cellmesh_coord::local::LocalCoordination;
use cellmesh_coord::{CONTROL_PLANE_ELECTION, Coordination};
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_route_client::client::RouteClient;
use serde_json::{Value, json};

/// Prints the status, as JSON with `json`.
pub(super) async fn show(
    routes: &RouteClient,
    args: &super::CtlArgs,
    secret: &ClusterSecret,
    json: bool,
) -> anyhow::Result<()> {
    let coordination_dir = args.coordination_dir.as_deref();
    let status = collect(routes, &args.routers, secret, &args.etcd, coordination_dir).await;
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print(&status);
    }
    Ok(())
}

pub async fn collect(
    routes: &RouteClient,
    routers: &[String],
    secret: &ClusterSecret,
    etcd: &[String],
    coordination_dir: Option<&Path>,
) -> Value {
    let coordination: Result<(Box<dyn Coordination>, &str), String> = if !etcd.is_empty() {
        EtcdCoordination::connect(etcd)
            .await
            .map(|c| (Box::new(c) as Box<dyn Coordination>, "etcd"))
            .map_err(|e| e.to_string())
    } else if let Some(dir) = coordination_dir {
        LocalCoordination::open(dir)
            .map(|c| (Box::new(c) as Box<dyn Coordination>, "local"))
            .map_err(|e| e.to_string())
    } else {
        Err("not visible without --etcd or --coordination-dir".into())
    };
    let control_plane = match coordination {
        Ok((c, backend)) => {
            json!({"leader": c.leader(CONTROL_PLANE_ELECTION).await.ok().flatten(), "coordination": backend})
        }
        Err(e) => json!({"leader": null, "error": e}),
    };
    // Two samples a second apart give sends/s.
    let mut sampler = Sampler::new(routers.to_vec(), secret.clone());
    sampler.sample(routes, Value::Null).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    sampler.sample(routes, control_plane).await
}

pub fn print(status: &Value) {
    for (region, cells) in status["regions"].as_object().into_iter().flatten() {
        println!("region {region}");
        for c in cells.as_array().into_iter().flatten() {
            println!(
                "  {:<16} {:<9} {:<12} tenants {:<3} overrides {:<4} {:>8} sends/s  lag {:<6} up {}s",
                c["cell_id"].as_str().unwrap_or_default(),
                c["status"].as_str().unwrap_or_default(),
                c["health"].as_str().unwrap_or_default(),
                c["tenants"],
                c["overrides"],
                c["sends_per_s"],
                c["queue_lag"],
                c["uptime_ms"].as_u64().map_or(0, |ms| ms / 1000),
            );
        }
    }
    println!("routers");
    for r in status["routers"].as_array().into_iter().flatten() {
        match r.get("error") {
            Some(e) => println!(
                "  {:<28} unreachable: {e}",
                r["endpoint"].as_str().unwrap_or_default()
            ),
            None => println!(
                "  {:<28} node {} {:<10} {:<9} leader {} term {} applied {}",
                r["endpoint"].as_str().unwrap_or_default(),
                r["node_id"],
                r["region"].as_str().unwrap_or_default(),
                r["role"].as_str().unwrap_or_default(),
                r["leader"],
                r["term"],
                r["applied_index"]
            ),
        }
    }
    println!(
        "control plane leader: {}",
        status["control_plane"]["leader"]
    );
    let files = status["files"].as_array().cloned().unwrap_or_default();
    if !files.is_empty() {
        println!("files by tenant");
    }
    for f in files {
        println!("  tenant {:<8} {:>16} bytes", f["tenant"], f["bytes"]);
    }
    let migrations = status["migrations"].as_array().cloned().unwrap_or_default();
    if migrations.is_empty() {
        println!("migrations: none in progress");
    }
    for m in migrations {
        let pct = m["progress_pct"].as_u64().unwrap_or(0) as usize;
        println!(
            "  {} {} -> {} {:<8} [{}{}] {pct}%",
            m["key"].as_str().unwrap_or_default(),
            m["from"].as_str().unwrap_or_default(),
            m["to"].as_str().unwrap_or_default(),
            m["phase"].as_str().unwrap_or_default(),
            "#".repeat(pct / 5),
            ".".repeat(20 - pct / 5)
        );
    }
}
