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
use cellmesh_route_client::table::{CellInfo, Key, RouteState, RouteTable, Scope};
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
        let table = routes.read(TableView::of);
        let mut calls = Vec::new();
        for cell in &table.cells {
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
            let (tenants, overrides) = table.owned.get(&cell.id).copied().unwrap_or_default();
            regions.entry(cell.region.clone()).or_default().push(json!({
                "cell_id": cell.id,
                "region": cell.region,
                "address": cell.address,
                "status": format!("{:?}", cell.status),
                "health": if now.is_some() { "serving" } else { "unreachable" },
                "tenants": tenants,
                "overrides": overrides,
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

/// What the status needs of the route table, taken in one pass under the
/// cache's read lock: a copy of the whole table each second cost a
/// control plane more than anything else it does while routes are
/// written fast, and grows with the table.
struct TableView {
    cells: Vec<CellInfo>,
    /// Per cell: the tenants and the overrides it owns.
    owned: HashMap<String, (usize, usize)>,
    /// Entries on their way to another cell.
    moving: Vec<Moving>,
    applied: u64,
}

struct Moving {
    key: Key,
    from: String,
    to: String,
    phase: String,
}

impl TableView {
    fn of(table: &RouteTable) -> Self {
        let mut owned: HashMap<String, (usize, usize)> = HashMap::new();
        let mut moving = Vec::new();
        for entry in table.routes.values() {
            let counts = match owned.get_mut(&entry.cell) {
                Some(counts) => counts,
                None => owned.entry(entry.cell.clone()).or_default(),
            };
            match entry.key.scope {
                Scope::Tenant => counts.0 += 1,
                _ => counts.1 += 1,
            }
            let (to, phase) = match &entry.state {
                RouteState::Migrating { to, phase } => (to.clone(), format!("{phase:?}")),
                RouteState::Frozen { to } => (to.clone(), "Frozen".into()),
                RouteState::Active => continue,
            };
            moving.push(Moving {
                key: entry.key,
                from: entry.cell.clone(),
                to,
                phase,
            });
        }
        Self {
            cells: table.cells.values().cloned().collect(),
            owned,
            moving,
            applied: table.applied,
        }
    }

    fn address(&self, id: &str) -> String {
        (self.cells.iter().find(|c| c.id == id))
            .map(|c| c.address.clone())
            .unwrap_or_default()
    }
}

/// Entries on their way to another cell, with how far the target has
/// caught up (conversations: target's latest seq over the source's).
async fn migrations(table: &TableView, secret: &ClusterSecret) -> Vec<Value> {
    let mut out = Vec::new();
    for m in &table.moving {
        let progress = match m.key.scope {
            Scope::Conversation(c) => {
                let source = latest_seq(&table.address(&m.from), secret, ConversationId(c)).await;
                let target = latest_seq(&table.address(&m.to), secret, ConversationId(c)).await;
                match (source, target) {
                    (Some(s), Some(t)) if s > 0 => Some(((t * 100) / s).min(100)),
                    _ => None,
                }
            }
            _ => None,
        };
        out.push(json!({"key": m.key.to_string(), "from": m.from, "to": m.to,
            "phase": m.phase, "progress_pct": progress}));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellmesh_proto::ids::TenantId;
    use cellmesh_route_client::table::{Entry, Phase};

    fn entry(key: Key, cell: &str, state: RouteState) -> Entry {
        Entry {
            key,
            cell: cell.into(),
            epoch: 3,
            state,
            seq_floor: 0,
            floor_margin: 0,
            failed_from: None,
            regions: Vec::new(),
        }
    }

    #[test]
    fn the_view_counts_what_each_cell_owns_and_lists_what_moves() {
        let mut table = RouteTable {
            applied: 41,
            ..Default::default()
        };
        let conv = |t, c| Key::conversation(TenantId(t), ConversationId(c));
        let entries = [
            entry(Key::tenant(TenantId(1)), "eu/c1", RouteState::Active),
            entry(Key::tenant(TenantId(2)), "eu/c1", RouteState::Active),
            entry(Key::tenant(TenantId(3)), "us/c1", RouteState::Active),
            entry(conv(1, 7), "us/c1", RouteState::Active),
            entry(
                conv(1, 8),
                "eu/c1",
                RouteState::Migrating {
                    to: "us/c1".into(),
                    phase: Phase::CatchUp,
                },
            ),
            entry(
                conv(2, 9),
                "us/c1",
                RouteState::Frozen { to: "eu/c1".into() },
            ),
        ];
        for e in entries {
            table.routes.insert(e.key, e);
        }
        let view = TableView::of(&table);
        assert_eq!(view.applied, 41);
        assert_eq!(view.owned["eu/c1"], (2, 1));
        assert_eq!(view.owned["us/c1"], (1, 2));
        let moving: Vec<_> = (view.moving.iter())
            .map(|m| (m.key, m.from.as_str(), m.to.as_str(), m.phase.as_str()))
            .collect();
        assert_eq!(
            moving,
            [
                (conv(1, 8), "eu/c1", "us/c1", "CatchUp"),
                (conv(2, 9), "us/c1", "eu/c1", "Frozen"),
            ]
        );
    }
}
