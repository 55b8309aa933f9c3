//! The deployment at a glance, as one JSON object: regions and their cells
//! (route status, live health, what they own, sends/s, queue lag, uptime),
//! router replicas, the control-plane leader, migrations in progress with
//! their progress, and the bytes of files each tenant keeps. `cellmesh ctl status` prints it; the console serves it.
//!
//! A [`Sampler`] remembers each cell's previous counters, so sends/s is the
//! rate between two samples.

use cellmesh_proto::ids::ConversationId;
use cellmesh_proto::tls::Dial;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1 as pb;
use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
use cellmesh_proto::v1::{CellStats, DigestRequest, StatsRequest};
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::table::{RouteState, RouteTable, Scope};
use serde_json::{Value, json};
use tonic::transport::Channel;

async fn peer(address: &str) -> Option<CellPeerClient<Channel>> {
    let channel = cellmesh_proto::tls::endpoint(address.to_string())
        .ok()?
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(2))
        .dial()
        .await
        .ok()?;
    Some(CellPeerClient::new(channel))
}

/// A cell's counters, or `None` when it does not answer.
pub async fn stats(address: String, secret: ClusterSecret) -> Option<CellStats> {
    let mut client = peer(&address).await?;
    let mut r = tonic::Request::new(StatsRequest {});
    secret.attach(&mut r);
    client.stats(r).await.ok().map(|r| r.into_inner())
}

async fn latest_seq(
    address: &str,
    secret: &ClusterSecret,
    conversation: ConversationId,
) -> Option<u64> {
    let mut client = peer(address).await?;
    let mut r = tonic::Request::new(DigestRequest {
        conversation_id: conversation.get(),
        ..Default::default()
    });
    secret.attach(&mut r);
    client
        .conversation_digest(r)
        .await
        .ok()
        .map(|r| r.into_inner().latest_seq)
}

/// One router replica's view of the Raft group.
pub async fn router_status(
    endpoint: &str,
    secret: &ClusterSecret,
) -> Result<pb::RouterStatus, tonic::Status> {
    let channel = cellmesh_proto::tls::endpoint(endpoint.to_string())
        .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(2))
        .dial()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut client = pb::routing_client::RoutingClient::new(channel);
    let mut request = tonic::Request::new(pb::RouterStatusRequest {});
    secret.attach(&mut request);
    Ok(client.status(request).await?.into_inner())
}

pub struct Sampler {
    routers: Vec<String>,
    secret: ClusterSecret,
    previous: HashMap<String, (Instant, CellStats)>,
    /// The charts of each cell's metrics and each operation's progress.
    pub panels: crate::panels::Panels,
}

impl Sampler {
    pub fn new(routers: Vec<String>, secret: ClusterSecret) -> Self {
        Self {
            routers,
            secret,
            previous: HashMap::new(),
            panels: Default::default(),
        }
    }

    /// The status now; `control_plane` is whatever the caller knows about
    /// the control plane's leader.
    pub async fn sample(&mut self, routes: &RouteClient, control_plane: Value) -> Value {
        let table = routes.read(|t| t.clone());
        let mut calls = Vec::new();
        for cell in table.cells.values() {
            let call = tokio::spawn(stats(cell.address.clone(), self.secret.clone()));
            calls.push((cell.clone(), call));
        }
        let mut regions: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        let mut files: BTreeMap<u64, u64> = BTreeMap::new();
        let mut answers = Vec::new();
        for (cell, call) in calls {
            answers.push((cell, call.await.ok().flatten()));
        }
        let scraped = answers
            .iter()
            .filter_map(|(cell, stats)| {
                let address = &stats.as_ref()?.metrics_address;
                (!address.is_empty()).then(|| (cell.id.clone(), address.clone()))
            })
            .collect();
        let mut charts = self.panels.sample_cells(scraped).await;
        for (cell, now) in answers {
            let rate = match (self.previous.get(&cell.id), &now) {
                (Some((at, a)), Some(b)) if b.sends >= a.sends && b.uptime_ms >= a.uptime_ms => {
                    let secs = at.elapsed().as_secs_f64();
                    if secs > 0.0 {
                        (b.sends - a.sends) as f64 / secs
                    } else {
                        0.0
                    }
                }
                _ => 0.0,
            };
            for f in now.iter().flat_map(|s| &s.files) {
                *files.entry(f.tenant_id).or_default() += f.bytes;
            }
            match &now {
                Some(s) => {
                    self.previous
                        .insert(cell.id.clone(), (Instant::now(), s.clone()));
                }
                None => {
                    self.previous.remove(&cell.id);
                }
            }
            let owned = |scope: fn(&Scope) -> bool| {
                table
                    .routes
                    .values()
                    .filter(|e| e.cell == cell.id && scope(&e.key.scope))
                    .count()
            };
            regions.entry(cell.region.clone()).or_default().push(json!({
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
                "file_bytes": now.as_ref().map(|s| s.files.iter().map(|f| f.bytes).sum::<u64>()),
                "metrics": charts.remove(&cell.id).unwrap_or(Value::Null),
            }));
        }
        let mut replicas = Vec::new();
        for endpoint in &self.routers {
            replicas.push(match router_status(endpoint, &self.secret).await {
                Ok(s) => json!({"endpoint": endpoint, "node_id": s.node_id, "region": s.region, "role": s.role,
                    "leader": s.current_leader, "term": s.term, "applied_index": s.applied_index}),
                Err(e) => json!({"endpoint": endpoint, "error": e.message()}),
            });
        }
        json!({
            "regions": regions,
            "routers": replicas,
            "control_plane": control_plane,
            "migrations": migrations(&table, &self.secret).await,
            "route_table_index": table.applied,
            // Bytes of files per tenant over the cells that answered.
            "files": files.iter().map(|(t, b)| json!({"tenant": t, "bytes": b})).collect::<Vec<_>>(),
        })
    }
}

/// Entries on their way to another cell, with how far the target has
/// caught up (conversations: target's latest seq over the source's).
async fn migrations(table: &RouteTable, secret: &ClusterSecret) -> Vec<Value> {
    let address = |id: &str| {
        table
            .cell(id)
            .map(|c| c.address.clone())
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for entry in table.routes.values() {
        let (to, phase) = match &entry.state {
            RouteState::Migrating { to, phase } => (to.clone(), format!("{phase:?}")),
            RouteState::Frozen { to } => (to.clone(), "Frozen".into()),
            RouteState::Active => continue,
        };
        let progress = match entry.key.scope {
            Scope::Conversation(c) => {
                let source = latest_seq(&address(&entry.cell), secret, ConversationId(c)).await;
                let target = latest_seq(&address(&to), secret, ConversationId(c)).await;
                match (source, target) {
                    (Some(s), Some(t)) if s > 0 => Some(((t * 100) / s).min(100)),
                    _ => None,
                }
            }
            _ => None,
        };
        out.push(
            json!({"key": entry.key.to_string(), "from": entry.cell, "to": to,
            "phase": phase, "progress_pct": progress}),
        );
    }
    out
}
