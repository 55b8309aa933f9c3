//! `cellmesh ctl status`: the deployment at a glance — regions and their
//! cells (route status, health, what they own, sends/s, queue lag, uptime),
//! router replicas, the control-plane leader and migrations in progress
//! with their progress. `--json` prints the same as one object.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cellmesh_control_plane::coord::etcd::EtcdCoordination;
use cellmesh_control_plane::coord::{CONTROL_PLANE_ELECTION, Coordination};
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
use cellmesh_proto::v1::{CellStats, DigestRequest, StatsRequest};
use cellmesh_router::client::RouteClient;
use cellmesh_router::table::{RouteState, Scope};
use serde_json::{Value, json};
use tonic::transport::Channel;

async fn peer(address: &str) -> Option<CellPeerClient<Channel>> {
    let channel = Channel::from_shared(address.to_string())
        .ok()?
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .ok()?;
    Some(CellPeerClient::new(channel))
}

async fn stats(address: &str, secret: &ClusterSecret) -> Option<CellStats> {
    let mut client = peer(address).await?;
    let mut r = tonic::Request::new(StatsRequest {});
    secret.attach(&mut r);
    client.stats(r).await.ok().map(|r| r.into_inner())
}

async fn latest_seq(address: &str, secret: &ClusterSecret, conversation: u64) -> Option<u64> {
    let mut client = peer(address).await?;
    let mut r = tonic::Request::new(DigestRequest {
        conversation_id: conversation,
        through_seq: 0,
    });
    secret.attach(&mut r);
    client
        .conversation_digest(r)
        .await
        .ok()
        .map(|r| r.into_inner().latest_seq)
}

pub async fn collect(
    routes: &RouteClient,
    routers: &[String],
    secret: &ClusterSecret,
    etcd: &[String],
) -> Value {
    let table = routes.read(|t| t.clone());
    // Two samples a second apart give sends/s.
    let mut first = BTreeMap::new();
    for cell in table.cells.values() {
        first.insert(cell.id.clone(), stats(&cell.address, secret).await);
    }
    let sampled = Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut cells = Vec::new();
    for cell in table.cells.values() {
        let now = stats(&cell.address, secret).await;
        let rate = match (first.get(&cell.id).cloned().flatten(), &now) {
            (Some(a), Some(b)) if b.sends >= a.sends && b.uptime_ms >= a.uptime_ms => {
                (b.sends - a.sends) as f64 / sampled.elapsed().as_secs_f64()
            }
            _ => 0.0,
        };
        let owned = |scope: fn(&Scope) -> bool| {
            table
                .routes
                .values()
                .filter(|e| e.cell == cell.id && scope(&e.key.scope))
                .count()
        };
        cells.push(json!({
            "cell_id": cell.id,
            "region": cell.region,
            "address": cell.address,
            "status": format!("{:?}", cell.status),
            "health": if now.is_some() { "serving" } else { "unreachable" },
            "tenants": owned(|s| matches!(s, Scope::Tenant)),
            "overrides": owned(|s| !matches!(s, Scope::Tenant)),
            "sends_per_s": (rate * 10.0).round() / 10.0,
            "queue_lag": now.as_ref().map(|s| s.queue_lag),
            "uptime_ms": now.as_ref().map(|s| s.uptime_ms),
        }));
    }
    let mut replicas = Vec::new();
    for endpoint in routers {
        replicas.push(match crate::ctl::router_status(endpoint, secret).await {
            Ok(s) => json!({"endpoint": endpoint, "node_id": s.node_id, "region": s.region, "role": s.role,
                "leader": s.current_leader, "term": s.term, "applied_index": s.applied_index}),
            Err(e) => json!({"endpoint": endpoint, "error": e.to_string()}),
        });
    }
    let control_plane = if etcd.is_empty() {
        json!({"leader": null, "coordination": "embedded (not visible from here)"})
    } else {
        match EtcdCoordination::connect(etcd).await {
            Ok(c) => {
                json!({"leader": c.leader(CONTROL_PLANE_ELECTION).await.ok().flatten(), "coordination": "etcd"})
            }
            Err(e) => json!({"leader": null, "error": e.to_string()}),
        }
    };
    let mut migrations = Vec::new();
    for entry in table
        .routes
        .values()
        .filter(|e| e.state != RouteState::Active)
    {
        let (to, state) = match &entry.state {
            RouteState::Migrating { to, phase } => (to.clone(), format!("{phase:?}")),
            RouteState::Frozen { to } => (to.clone(), "Frozen".into()),
            RouteState::Active => continue,
        };
        let progress = match entry.key.scope {
            Scope::Conversation(c) => {
                let address = |id: &str| {
                    table
                        .cell(id)
                        .map(|c| c.address.clone())
                        .unwrap_or_default()
                };
                let source = latest_seq(&address(&entry.cell), secret, c).await;
                let target = latest_seq(&address(&to), secret, c).await;
                match (source, target) {
                    (Some(s), Some(t)) if s > 0 => Some(((t * 100) / s).min(100)),
                    _ => None,
                }
            }
            _ => None,
        };
        migrations.push(json!({"key": entry.key.to_string(), "from": entry.cell, "to": to, "phase": state, "progress_pct": progress}));
    }
    let mut regions: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for c in cells {
        regions
            .entry(c["region"].as_str().unwrap_or_default().to_string())
            .or_default()
            .push(c);
    }
    json!({
        "regions": regions,
        "routers": replicas,
        "control_plane": control_plane,
        "migrations": migrations,
        "route_table_index": table.applied,
    })
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
