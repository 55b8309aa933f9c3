//! The console's per-cell and per-operation charts: each sample, the
//! sampler scrapes every cell's `/metrics` (the address the cell reports in
//! its stats) and turns the change since the previous scrape into sends/s,
//! ack p99 (the `Messaging/Send` RPC), fan-out lag p99 and queue lag; and it
//! records each running operation's progress. The last
//! [`HISTORY`] points of each are kept and served with the status.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use cellmesh_telemetry::scrape::{Samples, fetch, quantile_between};
use serde_json::{Value, json};

/// Points kept per chart: five minutes at the console's one sample a second.
pub const HISTORY: usize = 300;

const SEND: [(&str, &str); 1] = [("method", "cellmesh.v1.Messaging/Send")];

#[derive(Default)]
struct Series {
    last: Option<(Instant, Samples)>,
    points: VecDeque<Value>,
}

/// What the charts remember between samples.
#[derive(Default)]
pub struct Panels {
    cells: HashMap<String, Series>,
    operations: HashMap<String, VecDeque<Value>>,
}

fn push(points: &mut VecDeque<Value>, point: Value) {
    if points.len() == HISTORY {
        points.pop_front();
    }
    points.push_back(point);
}

fn ms(seconds: Option<f64>) -> Value {
    seconds.map_or(Value::Null, |s| json!((s * 10_000.0).round() / 10.0))
}

/// The figures between two scrapes of one cell.
pub fn point(now_ms: u64, before: &Samples, after: &Samples, secs: f64) -> Value {
    let committed = "cellmesh_messages_committed_total";
    let rate = (after.sum(committed, &[]) - before.sum(committed, &[])).max(0.0) / secs;
    let ack = "cellmesh_rpc_server_duration_seconds";
    let fanout = "cellmesh_fanout_lag_seconds";
    let between = |name, filter: &[(&str, &str)]| {
        quantile_between(
            0.99,
            &before.buckets(name, filter),
            &after.buckets(name, filter),
        )
    };
    json!({
        "t": now_ms,
        "sends_per_s": (rate * 10.0).round() / 10.0,
        "ack_p99_ms": ms(between(ack, &SEND)),
        "fanout_lag_p99_ms": ms(between(fanout, &[])),
        "queue_lag_ms": ms(Some(after.sum("cellmesh_queue_lag_seconds", &[]))),
        "outbox_lag": after.sum("cellmesh_outbox_lag_events", &[]),
    })
}

impl Panels {
    /// Scrapes `cells` (id → metrics address) at once and records a point
    /// for each that answered twice in a row; the charts by cell id.
    pub async fn sample_cells(&mut self, cells: Vec<(String, String)>) -> HashMap<String, Value> {
        let scrapes: Vec<_> = cells
            .into_iter()
            .map(|(id, address)| {
                let url = format!("http://{address}/metrics");
                (
                    id,
                    tokio::spawn(async move { fetch(&url, Duration::from_secs(1)).await }),
                )
            })
            .collect();
        let now_ms = crate::operations::now_ms();
        let mut charts = HashMap::new();
        let mut seen = Vec::new();
        for (id, scrape) in scrapes {
            seen.push(id.clone());
            let series = self.cells.entry(id.clone()).or_default();
            let Ok(Ok(text)) = scrape.await else {
                series.last = None;
                continue;
            };
            let samples = Samples::parse(&text);
            if let Some((at, before)) = &series.last {
                let secs = at.elapsed().as_secs_f64().max(0.001);
                push(&mut series.points, point(now_ms, before, &samples, secs));
            }
            series.last = Some((Instant::now(), samples));
            charts.insert(id, json!(series.points));
        }
        self.cells.retain(|id, _| seen.contains(id));
        charts
    }

    /// Adds to each operation of `operations` (the status's list) the
    /// history of its progress while it ran.
    pub fn track_operations(&mut self, operations: &mut Value) {
        let Some(list) = operations.as_array_mut() else {
            return;
        };
        let now_ms = crate::operations::now_ms();
        let mut listed = Vec::new();
        for op in list.iter_mut() {
            let Some(id) = op["id"].as_str().map(str::to_string) else {
                continue;
            };
            listed.push(id.clone());
            let points = self.operations.entry(id).or_default();
            if op["state"] == "running" {
                let (done, total) = (
                    op["done"].as_u64().unwrap_or(0),
                    op["total"].as_u64().unwrap_or(0),
                );
                let pct = (done * 100).checked_div(total).unwrap_or(0).min(100);
                push(
                    points,
                    json!({"t": now_ms, "pct": pct, "rows": op["rows"], "phase": op["phase"]}),
                );
            }
            op["history"] = json!(points);
        }
        self.operations.retain(|id, _| listed.contains(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_is_the_change_between_two_scrapes() {
        let before = Samples::parse(
            "cellmesh_messages_committed_total 100\n\
             cellmesh_rpc_server_duration_seconds_bucket{method=\"cellmesh.v1.Messaging/Send\",le=\"0.01\"} 100\n\
             cellmesh_rpc_server_duration_seconds_bucket{method=\"cellmesh.v1.Messaging/Send\",le=\"0.02\"} 100\n\
             cellmesh_rpc_server_duration_seconds_bucket{method=\"cellmesh.v1.Messaging/Send\",le=\"+Inf\"} 100\n",
        );
        let after = Samples::parse(
            "cellmesh_messages_committed_total 300\n\
             cellmesh_rpc_server_duration_seconds_bucket{method=\"cellmesh.v1.Messaging/Send\",le=\"0.01\"} 100\n\
             cellmesh_rpc_server_duration_seconds_bucket{method=\"cellmesh.v1.Messaging/Send\",le=\"0.02\"} 300\n\
             cellmesh_rpc_server_duration_seconds_bucket{method=\"cellmesh.v1.Messaging/Send\",le=\"+Inf\"} 300\n\
             cellmesh_queue_lag_seconds 0.0125\n",
        );
        let p = point(7, &before, &after, 2.0);
        assert_eq!(p["sends_per_s"], 100.0);
        // All 200 new calls took 10–20 ms: p99 interpolates to 19.9 ms.
        assert_eq!(p["ack_p99_ms"], 19.9);
        assert_eq!(p["fanout_lag_p99_ms"], Value::Null);
        assert_eq!(p["queue_lag_ms"], 12.5);
    }

    #[test]
    fn running_operations_gain_a_history() {
        let mut panels = Panels::default();
        let mut ops = json!([{"id": "op-1", "state": "running", "done": 5, "total": 10, "rows": 50, "phase": "copy"},
                             {"id": "op-2", "state": "succeeded", "done": 1, "total": 1}]);
        panels.track_operations(&mut ops);
        panels.track_operations(&mut ops);
        assert_eq!(ops[0]["history"].as_array().unwrap().len(), 2);
        assert_eq!(ops[0]["history"][1]["pct"], 50);
        assert_eq!(ops[1]["history"].as_array().unwrap().len(), 0);
    }
}
