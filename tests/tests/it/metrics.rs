//! Metrics end to end: `cellmesh dev --prometheus` runs a real Prometheus
//! over every process; each process's `/metrics` passes `promtool check
//! metrics`, the send rate Prometheus computes from the edges' RPC
//! counters matches the rate a steady sender saw acknowledged, and the
//! console's per-cell charts show the load.

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::*;
use cellmesh_tests::browser::rendered;
use cellmesh_tests::deploy::authed;
use cellmesh_tests::dev::{port_base, start_dev, wait_info};
use cellmesh_tests::http;
use serde_json::Value;
use std::io::Write;
use std::net::SocketAddr;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// `host:port` of an `http://host:port/...` URL.
fn addr_of(url: &str) -> SocketAddr {
    let rest = url.trim_start_matches("http://");
    rest.split('/').next().unwrap().parse().unwrap()
}

fn promtool_check(name: &str, text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; the set-up installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool rejects {name}'s metrics:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn encode_query(query: &str) -> String {
    query
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The single value of an instant PromQL query at `at_ms`.
async fn prom_value(prometheus: SocketAddr, query: &str, at_ms: u64) -> Option<f64> {
    let path = format!(
        "/api/v1/query?query={}&time={:.3}",
        encode_query(query),
        at_ms as f64 / 1000.0
    );
    let (code, body) = http::get(prometheus, &path).await.ok()?;
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).ok()?;
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

/// A route write's phases on the Raft leader.
const LEADER_PHASES: [&str; 3] = [
    "cellmesh_route_write_queued",
    "cellmesh_route_write_committed",
    "cellmesh_raft_append_rpc",
];

/// A fan-out batch's phases on the owner cell's processor.
const FANOUT_PHASES: [&str; 3] = ["apply", "commit", "announce"];

/// The sum of a metric's samples (with `filter` in its labels) in a
/// Prometheus text exposition.
fn sample_sum(text: &str, metric: &str, filter: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(metric) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The latest value the console's `chart` of `cell` shows.
fn chart_latest(dom: &str, cell: &str, chart: &str) -> Option<f64> {
    let boxed = &dom[dom.find(&format!("data-cell=\"{cell}\""))?..];
    let boxed = &boxed[..boxed[1..].find("data-cell=").map_or(boxed.len(), |i| i + 1)];
    let chart = &boxed[boxed.find(&format!("data-chart=\"{chart}\""))?..];
    let at = chart.find("data-latest=\"")? + "data-latest=\"".len();
    chart[at..].split('"').next()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_expose_valid_metrics_and_prometheus_sees_the_send_rate() {
    let dir = tempfile::tempdir().unwrap();
    let mut dev = start_dev(dir.path(), port_base(), &["--prometheus"]);
    let info = wait_info(dir.path(), dev.child()).await;
    let prometheus = addr_of(info["prometheus_url"].as_str().expect("prometheus_url"));
    let demo = &info["demo"];
    let conv = demo["conversations"][0]["id"].as_u64().unwrap();
    let alice = demo["tokens"]["1"].as_str().unwrap().to_string();
    let edge = info["edges"]["eu-west"].as_str().unwrap().to_string();
    let owner = demo["conversations"][0]["owner"]
        .as_str()
        .unwrap()
        .to_string();
    let mut send = MessagingClient::connect(edge).await.unwrap();

    // A steady sender, 25 sends a second for 30 s; when each was acked.
    let started = unix_ms();
    let sender = tokio::spawn(async move {
        let mut acked = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_millis(40));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut i = 0;
        while unix_ms() < started + 30_000 {
            tick.tick().await;
            i += 1;
            let request = SendRequest {
                conversation_id: conv,
                client_req_id: format!("metrics-{i}"),
                r#type: MessageType::Text as i32,
                body: format!("metric {i}").into_bytes(),
                ..Default::default()
            };
            if send.send(authed(request, &alice)).await.is_ok() {
                acked.push(unix_ms());
            }
        }
        acked
    });

    // Under load, the console charts the owner cell's sends and acks.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let console = addr_of(info["console_url"].as_str().unwrap());
    let dom = rendered(console).await;
    for chart in ["sends_per_s", "ack_p99_ms", "fanout_lag_p99_ms"] {
        let latest = chart_latest(&dom, &owner, chart);
        assert!(
            latest.is_some_and(|v| v > 0.0),
            "{owner}'s {chart} chart shows {latest:?}"
        );
    }

    let acked = sender.await.unwrap();
    assert!(acked.len() > 300, "only {} sends acked", acked.len());

    // Every process's exposition is valid, and the counters saw the sends.
    let mut committed = 0.0;
    let mut edge_sends = 0.0;
    // Route writes seen by the leader's phases, and its replication RPCs.
    let mut route_write_phases = [0.0; LEADER_PHASES.len()];
    let mut fanout_phases = [0.0; FANOUT_PHASES.len()];
    let metrics = info["metrics"].as_object().unwrap();
    assert_eq!(metrics.len(), 14, "{metrics:?}");
    for (name, url) in metrics {
        let (code, text) = http::get(addr_of(url.as_str().unwrap()), "/metrics")
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(code, 200, "{name}: {text}");
        assert!(text.contains("process_resident_memory_bytes"), "{name}");
        let build = format!("version=\"{}\"", env!("CARGO_PKG_VERSION"));
        assert_eq!(
            sample_sum(&text, "cellmesh_build_info", &build),
            1.0,
            "{name}"
        );
        promtool_check(name, &text);
        committed += sample_sum(&text, "cellmesh_messages_committed_total", "");
        for (seen, phase) in fanout_phases.iter_mut().zip(FANOUT_PHASES) {
            let label = format!("phase=\"{phase}\"");
            *seen += sample_sum(&text, "cellmesh_fanout_phase_seconds_count", &label);
        }
        edge_sends += sample_sum(
            &text,
            "cellmesh_rpc_server_requests_total",
            "method=\"cellmesh.v1.Messaging/Send\",code=\"OK\"",
        );
        if name.starts_with("router-") {
            assert!(
                sample_sum(&text, "cellmesh_raft_applied_index", "") > 0.0,
                "{name}"
            );
            // Each replica syncs its log and applies; the leader's writes
            // show each phase.
            for phase in ["cellmesh_raft_log_sync", "cellmesh_raft_apply"] {
                let count = sample_sum(&text, &format!("{phase}_seconds_count"), "");
                assert!(count > 0.0, "{name}: {phase}");
            }
            for (seen, phase) in route_write_phases.iter_mut().zip(LEADER_PHASES) {
                *seen += sample_sum(&text, &format!("{phase}_seconds_count"), "");
            }
        } else {
            // Everything else keeps a copy of the route table.
            assert!(
                sample_sum(&text, "cellmesh_route_client_applied_index", "") > 0.0,
                "{name}"
            );
        }
    }
    assert!(
        route_write_phases.iter().all(|count| *count > 0.0),
        "{LEADER_PHASES:?}: {route_write_phases:?}"
    );
    // The owner cells' fan-out batches were planned, committed and announced.
    assert!(
        fanout_phases.iter().all(|count| *count > 0.0),
        "{FANOUT_PHASES:?}: {fanout_phases:?}"
    );
    // Each send is one edge call and one owner-cell call (plus the demo's).
    assert!(
        committed >= acked.len() as f64,
        "{committed} < {}",
        acked.len()
    );
    assert!(edge_sends >= 2.0 * acked.len() as f64, "{edge_sends}");

    // Prometheus's rate over a window inside the sending matches the acks.
    let at = started + 28_000;
    let window_s = 20;
    let seen = acked
        .iter()
        .filter(|t| **t > at - window_s * 1000 && **t <= at)
        .count() as f64
        / window_s as f64;
    let query = format!(
        "sum(rate(cellmesh_rpc_server_requests_total{{role=\"edge\",method=\"cellmesh.v1.Messaging/Send\",code=\"OK\"}}[{window_s}s]))"
    );
    let deadline = unix_ms() + 20_000;
    let rate = loop {
        if let Some(rate) = prom_value(prometheus, &query, at).await {
            break rate;
        }
        assert!(
            unix_ms() < deadline,
            "Prometheus has no samples for {query}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        (rate - seen).abs() <= 0.2 * seen,
        "Prometheus says {rate:.1} sends/s, the sender saw {seen:.1}/s"
    );
}
