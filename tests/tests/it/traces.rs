//! Traces end to end: one send through `cellmesh dev`, from the eu-west
//! edge into a conversation owned by us-east/c1 with a member whose home
//! is ap-south/c1 (and live there on a device), is one trace across four
//! processes in three regions: the edge's call, the owner's send, commit,
//! fan-out (after the relay's publish, on Kafka), the forward to each home cell, their deliveries and
//! the push to the device, each span's parent in the same trace. Once with
//! the embedded queue into an OTLP receiver in this test, once across the
//! Kafka queue (mock cluster) into dev's own receiver, read back over its
//! query API and drawn by the console as a waterfall.

use std::collections::{BTreeSet, HashMap};
use std::process::Command;
use std::time::{Duration, Instant};

use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::sync_client::SyncClient;
use cellmesh_proto::v1::*;
use cellmesh_telemetry::scrape::fetch;
use cellmesh_telemetry::trace::receiver::{Receiver, SpanRecord, TraceSummary};
use cellmesh_tests::browser::rendered;
use cellmesh_tests::deploy::{authed, text};
use cellmesh_tests::dev::{port_base, start_dev, wait_info};
use cellmesh_tests::sync::next_push;
use serde_json::Value;

/// Where a test reads the deployment's spans.
enum Spans {
    InTest(Receiver),
    Dev(String),
}

impl Spans {
    /// The spans of the trace that holds a span of `req_id`, once it has
    /// spans from every service of `services`.
    async fn of_request(&self, req_id: &str, services: &[&str]) -> Vec<SpanRecord> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = Vec::new();
        while Instant::now() < deadline {
            if let Some(spans) = self.find(req_id).await {
                let have: BTreeSet<&str> = spans.iter().map(|s| s.service.as_str()).collect();
                if services.iter().all(|s| have.contains(s)) {
                    // The last batches may still be on their way.
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    return self.find(req_id).await.unwrap();
                }
                last = spans;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        panic!(
            "no trace of {req_id} across {services:?}; last seen: {last:#?}; the store holds {:#?}",
            self.held().await
        );
    }

    /// What the store holds, one line per span, the latest started trace
    /// first (at most 300 lines: for a failure's message).
    async fn held(&self) -> Vec<String> {
        let traces: Vec<Vec<SpanRecord>> = match self {
            Spans::InTest(receiver) => receiver
                .summaries()
                .iter()
                .map(|t| receiver.trace(&t.trace_id))
                .collect(),
            Spans::Dev(url) => {
                let mut traces = Vec::new();
                let list = fetch(&format!("{url}/traces"), Duration::from_secs(5)).await;
                let list: Vec<TraceSummary> =
                    serde_json::from_str(&list.unwrap_or_default()).unwrap_or_default();
                for t in list {
                    let url = format!("{url}/traces/{}", t.trace_id);
                    if let Ok(spans) = fetch(&url, Duration::from_secs(5)).await {
                        traces.push(serde_json::from_str(&spans).unwrap_or_default());
                    }
                }
                traces
            }
        };
        traces
            .iter()
            .flatten()
            .map(|s| {
                format!(
                    "{} {} <- {} {}:{} {:?}",
                    &s.trace_id[..8],
                    s.span_id,
                    s.parent_span_id,
                    s.service,
                    s.name,
                    s.attributes
                )
            })
            .take(300)
            .collect()
    }

    async fn find(&self, req_id: &str) -> Option<Vec<SpanRecord>> {
        let mine = |s: &SpanRecord| s.attributes.get("req_id").map(String::as_str) == Some(req_id);
        match self {
            Spans::InTest(receiver) => {
                let id = receiver.all_spans().into_iter().find(mine)?.trace_id;
                Some(receiver.trace(&id))
            }
            Spans::Dev(url) => {
                let list = fetch(&format!("{url}/traces"), Duration::from_secs(5))
                    .await
                    .ok()?;
                let list: Vec<TraceSummary> = serde_json::from_str(&list).unwrap();
                for summary in list.iter().filter(|t| t.root.ends_with("Messaging/Send")) {
                    let url = format!("{url}/traces/{}", summary.trace_id);
                    let spans = fetch(&url, Duration::from_secs(5)).await.ok()?;
                    let spans: Vec<SpanRecord> = serde_json::from_str(&spans).unwrap();
                    if spans.iter().any(mine) {
                        return Some(spans);
                    }
                }
                None
            }
        }
    }
}

const EDGE: &str = "edge/eu-west";
const OWNER: &str = "cell/us-east/c1";
const SENDER_HOME: &str = "cell/eu-west/c1";
const MEMBER_HOME: &str = "cell/ap-south/c1";

/// Runs the send through the running deployment `info` describes (from
/// its data dir `dir`) and returns its trace's spans.
async fn traced_send(dir: &std::path::Path, info: &Value, spans: &Spans) -> Vec<SpanRecord> {
    let demo = &info["demo"];
    let conversation = demo["conversations"][0]["id"].as_u64().unwrap();
    assert_eq!(demo["conversations"][0]["owner"], "us-east/c1");
    // Member 4's home moves to the third region.
    let moved = Command::new(cellmesh_tests::cellmesh_bin())
        .args(["ctl", "--dev"])
        .arg(dir)
        .args([
            "migrate",
            "user",
            "--tenant",
            "1",
            "--user",
            "4",
            "--to",
            "ap-south/c1",
        ])
        .output()
        .unwrap();
    assert!(
        moved.status.success(),
        "{}",
        String::from_utf8_lossy(&moved.stderr)
    );

    // A device of member 4, live on its region's edge.
    let token = |user: &str| demo["tokens"][user].as_str().unwrap().to_string();
    let south = info["edges"]["ap-south"].as_str().unwrap().to_string();
    let mut sync = SyncClient::connect(south).await.unwrap();
    let subscribe = SubscribeRequest {
        caller: None,
        from_pts: 0,
        queue_id: 0,
    };
    let mut device = sync
        .subscribe(authed(subscribe, &token("4")))
        .await
        .unwrap()
        .into_inner();
    while next_push(&mut device, Duration::from_millis(500))
        .await
        .is_some()
    {}

    let edge = info["edges"]["eu-west"].as_str().unwrap().to_string();
    let mut client = MessagingClient::connect(edge).await.unwrap();
    let req_id = format!("traced-{}", std::process::id());
    let sent = client
        .send(authed(text(conversation, &req_id), &token("1")))
        .await
        .expect("the send is acknowledged")
        .into_inner();
    let pushed = async {
        loop {
            match next_push(&mut device, Duration::from_secs(20)).await {
                Some(push) if format!("{push:?}").contains(&format!("msg_id: {}", sent.msg_id)) => {
                    return true;
                }
                Some(_) => continue,
                None => return false,
            }
        }
    };
    assert!(pushed.await, "member 4's device gets the message");
    let trace = spans
        .of_request(&req_id, &[EDGE, OWNER, SENDER_HOME, MEMBER_HOME])
        .await;
    let kafka = !info["kafka"].is_null();
    check(&trace, &req_id, conversation, sent.seq, kafka);
    trace
}

fn check(trace: &[SpanRecord], req_id: &str, conversation: u64, seq: u64, kafka: bool) {
    let by_id: HashMap<&str, &SpanRecord> = trace.iter().map(|s| (s.span_id.as_str(), s)).collect();
    let id = &trace[0].trace_id;
    assert!(trace.iter().all(|s| &s.trace_id == id), "one trace");
    // One root (the edge's call); every other span's parent is in the trace.
    let roots: Vec<&SpanRecord> = trace
        .iter()
        .filter(|s| s.parent_span_id.is_empty())
        .collect();
    assert_eq!(roots.len(), 1, "one root: {roots:#?}");
    let root = roots[0];
    assert_eq!(
        (root.service.as_str(), root.name.as_str()),
        (EDGE, "cellmesh.v1.Messaging/Send")
    );
    for s in trace.iter().filter(|s| !s.parent_span_id.is_empty()) {
        assert!(
            by_id.contains_key(s.parent_span_id.as_str()),
            "{} of {} has its parent in the trace",
            s.name,
            s.service
        );
        let parent = by_id[s.parent_span_id.as_str()];
        assert!(
            parent.start_unix_nano <= s.start_unix_nano,
            "{} starts after its parent {}",
            s.name,
            parent.name
        );
    }
    let conv = conversation.to_string();
    for (k, v) in [
        ("conv_id", conv.as_str()),
        ("req_id", req_id),
        ("user_id", "1"),
        ("tenant", "1"),
    ] {
        assert_eq!(
            root.attributes.get(k).map(String::as_str),
            Some(v),
            "the edge's span has {k}"
        );
    }
    // The path, each stage the child of the one before.
    let ancestry = |s: &SpanRecord| {
        let mut names = Vec::new();
        let mut at = by_id.get(s.parent_span_id.as_str());
        while let Some(p) = at {
            names.push(format!("{}:{}", p.service, p.name));
            at = by_id.get(p.parent_span_id.as_str());
        }
        names
    };
    let find = |service: &str, name: &str| {
        trace
            .iter()
            .filter(|s| s.service == service && s.name == name)
            .collect::<Vec<_>>()
    };
    let owner_send = find(OWNER, "cellmesh.v1.Messaging/Send");
    assert_eq!(owner_send.len(), 1);
    assert_eq!(
        owner_send[0].parent_span_id, root.span_id,
        "the owner's call is the edge's child"
    );
    assert_eq!(
        owner_send[0].attributes.get("req_id").map(String::as_str),
        Some(req_id)
    );
    let commit = find(OWNER, "commit");
    assert_eq!(commit.len(), 1);
    assert!(commit[0].attributes["batch"].parse::<u64>().unwrap() >= 1);
    assert!(commit[0].attributes.contains_key("fsync_ms"));
    let send = find(OWNER, "send");
    assert_eq!(send[0].attributes.get("seq"), Some(&seq.to_string()));
    let fanout = find(OWNER, "fanout");
    assert_eq!(fanout.len(), 1);
    assert_eq!(
        fanout[0].attributes.get("members").map(String::as_str),
        Some("4")
    );
    // On Kafka the relay's publish sits between the send and the fan-out;
    // the embedded queue is the outbox, read in place.
    let path = ancestry(fanout[0]);
    assert!(
        path.contains(&format!("{OWNER}:cellmesh.v1.Messaging/Send")),
        "{path:?}"
    );
    assert_eq!(
        path.contains(&format!("{OWNER}:relay")),
        kafka,
        "kafka: {kafka}, {path:?}"
    );
    for home in [SENDER_HOME, MEMBER_HOME] {
        let delivered = find(home, "deliver");
        assert!(!delivered.is_empty(), "{home} delivers");
        let path = ancestry(delivered[0]);
        assert!(
            path.contains(&format!("{OWNER}:forward")),
            "{home}: {path:?}"
        );
        assert!(
            path.contains(&format!("{OWNER}:fanout")),
            "{home}: {path:?}"
        );
        assert_eq!(
            path.last().unwrap(),
            &format!("{EDGE}:cellmesh.v1.Messaging/Send")
        );
        let cell = &delivered[0].resource;
        assert_eq!(
            cell.get("cellmesh.cell").map(String::as_str),
            Some(&home["cell/".len()..])
        );
        assert!(cell.contains_key("cloud.region"));
    }
    let pushes = find(MEMBER_HOME, "push");
    assert!(
        pushes
            .iter()
            .any(|p| p.attributes.get("user_id").map(String::as_str) == Some("4")),
        "the push to member 4's device: {pushes:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_send_is_one_trace_across_four_processes_and_three_regions() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::new(20_000);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let _server = receiver.serve(listener);
    let mut dev = start_dev(
        dir.path(),
        port_base(),
        &["--trace-ratio", "1", "--otlp", &endpoint],
    );
    let info = wait_info(dir.path(), dev.child()).await;
    assert_eq!(info["traces"]["otlp"], endpoint.as_str());
    let spans = Spans::InTest(receiver.clone());
    traced_send(dir.path(), &info, &spans).await;

    // A drill against the deployment is a trace too: its faults are spans.
    let drill = tokio::process::Command::new(cellmesh_tests::cellmesh_bin())
        .args([
            "chaos",
            "run",
            "cell-kill",
            "--duration",
            "8s",
            "--seed",
            "1",
            "--dev",
        ])
        .arg(dir.path())
        .output()
        .await
        .unwrap();
    let all = receiver.all_spans();
    let root = all
        .iter()
        .find(|s| s.name == "drill" && s.parent_span_id.is_empty())
        .unwrap_or_else(|| panic!("no drill trace; the drill said {drill:?}"));
    assert_eq!(root.service, "chaos");
    let faults = receiver
        .trace(&root.trace_id)
        .into_iter()
        .filter(|s| s.name == "fault" && s.parent_span_id == root.span_id)
        .count();
    assert!(
        faults >= 1,
        "the drill's faults are its spans: {drill:?}; the receiver holds {:#?}",
        Spans::InTest(receiver.clone()).held().await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_crosses_kafka_and_the_console_draws_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut dev = start_dev(
        dir.path(),
        port_base(),
        &["--trace-ratio", "1", "--kafka", "mock"],
    );
    let info = wait_info(dir.path(), dev.child()).await;
    assert_eq!(info["kafka"], "mock");
    let query = info["traces"]["query_url"].as_str().unwrap().to_string();
    let trace = traced_send(dir.path(), &info, &Spans::Dev(query)).await;

    // The console draws the newest traced send: this one.
    let console = info["console_url"].as_str().unwrap();
    let console = console
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let dom = rendered(console).await;
        let drawn = dom.contains(&format!("data-trace=\"{}\"", trace[0].trace_id));
        if drawn {
            for service in [EDGE, OWNER, SENDER_HOME, MEMBER_HOME] {
                assert!(
                    dom.contains(&format!("data-service=\"{service}\"")),
                    "{service} in the waterfall"
                );
            }
            assert!(dom.contains("class=\"bar\""));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the console never drew the trace:\n{dom}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
