//! `cellmesh dev`: a whole multi-region deployment on this machine, as
//! separate processes of this binary supervised from here — 3 regions, a
//! router replica each (one Raft group), 2 cells each, an edge each, and the
//! control plane — with every cross-region path going through a fault proxy
//! that adds latency. It creates a demo tenant, prints endpoints, a token
//! and what to try, and writes the same to `DATA_DIR/dev.json`. The data
//! directory persists across runs; Ctrl-C stops every child cleanly.

mod demo;
pub mod issue_all;
pub mod kafka;
pub mod pki;
mod prometheus;
mod start;
mod supervisor;
mod topology;
mod traces;

use cellmesh_proto::tls::{Peer, Role, TlsConfig};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use cellmesh_cell::config::ReplicationMode;
use cellmesh_chaos::proxy::FaultProxy;
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_route_client::client::RouteClient;
use cellmesh_telemetry::trace::TraceConfig;
use clap::Args;
use rand::Rng;
use serde::{Deserialize, Serialize};

use supervisor::Supervisor;
use topology::{CELLS_PER_REGION, REGIONS, Topology};

#[derive(Args)]
pub struct DevArgs {
    /// Where every component keeps its data, configs and logs.
    #[arg(long, default_value = "data/dev")]
    data_dir: PathBuf,
    /// Ports are allocated upwards from here.
    #[arg(long, default_value_t = 7500)]
    base_port: u16,
    /// Round-trip time added between regions.
    #[arg(long, default_value = "40ms")]
    latency: humantime::Duration,
    /// Start a local etcd (the `etcd` binary) for cell leases and two
    /// control-plane replicas with leader election.
    #[arg(long)]
    etcd: bool,
    /// Use these Kafka brokers as the cells' queue instead of the embedded
    /// log; `mock` runs librdkafka's mock cluster in this process (drills
    /// can take its brokers down).
    #[arg(long)]
    kafka: Option<String>,
    /// Cells acknowledge writes once stored on a standby too
    /// (`replication.mode`: async or sync).
    #[arg(long, default_value = "async", value_parser = parse_mode)]
    replication: ReplicationMode,
    /// Tenants replicated in the other mode than `--replication`
    /// (comma-separated ids), e.g. to bench both modes in one deployment.
    #[arg(long, value_delimiter = ',')]
    other_mode_tenants: Vec<u64>,
    /// Also start a real Prometheus (the `prometheus` binary) scraping
    /// every process's `/metrics`; its URL is printed and in dev.json.
    #[arg(long)]
    prometheus: bool,
    /// Send every process's spans to this OTLP/gRPC collector
    /// (`http://host:4317`) instead of the receiver in this process that
    /// the console's waterfall reads.
    #[arg(long, value_name = "ENDPOINT")]
    otlp: Option<String>,
    /// Share of new traces sampled (sends into large groups: at least
    /// 20%).
    #[arg(long, default_value_t = 0.05)]
    trace_ratio: f64,
    /// Keep only each conversation's newest N messages hot and run the
    /// tierer every second (default: the cell defaults, 10,000 messages or
    /// 30 days, every minute).
    #[arg(long, value_name = "N")]
    hot_messages: Option<u64>,
    /// Mutual TLS on every internal link: a CA made for this run and one
    /// certificate per process in `<data dir>/tls` (the operator's is
    /// `tls/operator-admin.pem`). Clients still reach the edges in
    /// plaintext.
    #[arg(long)]
    tls: bool,
    /// The binary every component runs (default: this one), e.g. the
    /// previous release for a rolling-upgrade drill. `cellmesh ctl upgrade
    /// process` moves one component to another.
    #[arg(long, value_name = "PATH")]
    process_binary: Option<PathBuf>,
}

fn parse_mode(text: &str) -> Result<ReplicationMode, String> {
    match text {
        "async" => Ok(ReplicationMode::Async),
        "sync" => Ok(ReplicationMode::Sync),
        other => Err(format!("{other:?} is not a replication mode (async, sync)")),
    }
}

#[derive(Serialize, Deserialize)]
struct Secrets {
    cluster: String,
    token: String,
}

fn random_secret() -> String {
    let mut rng = rand::rng();
    (0..32)
        .map(|_| format!("{:x}", rng.random_range(0..16u8)))
        .collect()
}

/// The deployment's secrets, kept across runs. With `tls`, certificates
/// authenticate every internal call: like a Terraform deployment, it
/// renders no shared cluster secret.
fn secrets(data_dir: &Path, tls: bool) -> anyhow::Result<Secrets> {
    let path = data_dir.join("secrets.json");
    let mut s = match std::fs::read_to_string(&path) {
        Ok(text) => {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
            serde_json::from_str(&text)?
        }
        Err(_) => {
            let s = Secrets {
                cluster: random_secret(),
                token: random_secret(),
            };
            write_private(&path, serde_json::to_string_pretty(&s)?.as_bytes())?;
            s
        }
    };
    if tls {
        s.cluster.clear();
    }
    Ok(s)
}

/// Writes a component's config, leaving out settings at their defaults
/// (a previous release then reads it: see `to_toml_lean`).
fn write_config<T>(dir: &Path, name: &str, config: &T) -> anyhow::Result<String>
where
    T: Serialize + serde::de::DeserializeOwned + Default,
{
    let path = dir.join(format!("{name}.toml"));
    let text = cellmesh_proto::config::to_toml_lean(config)?;
    write_private(&path, text.as_bytes())?;
    Ok(path.to_string_lossy().into_owned())
}

/// Writes a file only its owner may read (mode 0600): configs hold the
/// deployment's secrets.
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    // An existing file keeps its mode through open(): set it.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(bytes)?;
    Ok(())
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let data = &args.data_dir;
    let configs = data.join("config");
    std::fs::create_dir_all(&configs)
        .with_context(|| format!("cannot create {}", configs.display()))?;
    let secrets = secrets(data, args.tls)?;
    let pki = match args.tls {
        true => Some(pki::Pki::create(&data.join("tls"))?),
        false => None,
    };
    if !args.tls {
        println!(
            "dev: WARNING: internal links run in plaintext (insecure_plaintext = true in every config); `cellmesh dev --tls` runs them over mutual TLS"
        );
    }
    let operator = install_operator(pki.as_ref())?;
    let topo = Topology {
        base: args.base_port,
    };
    let traces = traces::Traces::start(&topo, args.otlp.clone()).await?;
    let telemetry = TraceConfig {
        endpoint: traces.endpoint.clone(),
        sample_ratio: args.trace_ratio,
        ..TraceConfig::default()
    };
    telemetry.validate()?;
    let (links, proxies) = start::start_proxies(&topo, args.latency.into()).await?;

    // A partition left over from an interrupted drill does not outlive it.
    let _ = std::fs::remove_file(data.join(PARTITION_FILE));
    let mock_kafka = match args.kafka.as_deref() {
        Some("mock") => Some(kafka::MockKafka::start(data)?),
        _ => None,
    };
    let brokers = match &mock_kafka {
        Some(mock) => Some(mock.bootstrap_servers()),
        None => args.kafka.clone(),
    };
    let mut sup = Supervisor::new(data, args.process_binary.clone())?;
    let etcd_endpoints = match args.etcd {
        true => vec![start_etcd(&mut sup, data, &topo, pki.as_ref())?],
        false => Vec::new(),
    };
    let plan = start::Plan {
        args: &args,
        configs,
        secrets,
        pki,
        topo: topo.clone(),
        telemetry,
        etcd_endpoints: etcd_endpoints.clone(),
        brokers: brokers.clone(),
    };
    plan.start_routers(&mut sup)?;
    let routes = connect_routes(&topo, &plan.secrets.cluster).await?;
    println!("routers: a Raft group of {} replicas is up", REGIONS.len());
    plan.start_cells(&mut sup, mock_kafka.as_ref())?;
    wait_for(Duration::from_secs(60), "cells to register", || {
        routes.read(|t| t.cells.len()) >= REGIONS.len() * CELLS_PER_REGION
    })
    .await?;
    println!("cells: {} registered", REGIONS.len() * CELLS_PER_REGION);
    // Two control-plane replicas: they elect the active one in etcd with
    // `--etcd`, else through lock files in the data directory.
    let (consoles, admins) = plan.start_control_planes(&mut sup, &traces.query_url)?;
    let edges = plan.start_edges(&mut sup)?;

    // dev.json promises working endpoints: every edge must accept first.
    for (r, region) in REGIONS.iter().enumerate() {
        wait_listening(topo.edge_port(r), &format!("the {region} edge")).await?;
    }
    let targets = topo.metrics_targets(start::CONTROL_PLANE_REPLICAS);
    let prometheus_url = match args.prometheus {
        true => Some(prometheus::start(&mut sup, data, topo.prometheus_port(), &targets).await?),
        false => None,
    };
    let (demo, web_links) = demo(data, &routes, &topo, &plan.secrets).await?;
    let mut info = serde_json::json!({
        "edges": edges,
        "cells": (0..REGIONS.len())
            .flat_map(|r| (0..CELLS_PER_REGION).map(move |c| (r, c)))
            .map(|(r, c)| (topo.cell_id(r, c), topo.cell(r, c)))
            .collect::<BTreeMap<_, _>>(),
        "routers": (0..REGIONS.len()).map(|r| topo.router_api(r)).collect::<Vec<_>>(),
        "control_plane": {"replicas": start::CONTROL_PLANE_REPLICAS, "coordination": if args.etcd { "etcd" } else { "local" },
            "consoles": consoles, "admin": admins},
        "console_url": consoles[0],
        "metrics": targets
            .iter()
            .map(|t| (t.name.clone(), format!("http://{}/metrics", t.address)))
            .collect::<BTreeMap<_, _>>(),
        "prometheus_url": prometheus_url,
        "traces": {"otlp": traces.endpoint, "query_url": traces.query_url, "sample_ratio": args.trace_ratio},
        "cluster_secret": plan.secrets.cluster,
        "tls": operator.enabled().then(|| serde_json::json!({
            "ca_file": operator.ca_file, "cert_file": operator.cert_file, "key_file": operator.key_file,
        })),
        "etcd": etcd_endpoints,
        "kafka": if mock_kafka.is_some() { Some("mock".to_string()) } else { brokers.clone() },
        "latency_ms": Duration::from(args.latency).as_millis() as u64,
        "web_url": web_link(&topo.edge(0), &demo["token"]),
        "web_links": web_links,
        "demo": demo,
        "processes": sup.pids().into_iter().collect::<BTreeMap<_, _>>(),
    });
    write_info(data, &info)?;
    print_summary(&info, data);

    supervise(data, (&links, &proxies), mock_kafka, sup, &mut info).await?;
    drop(proxies);
    println!("dev: stopped; data kept in {}", data.display());
    Ok(())
}

/// The operator's TLS config (`tls/operator-admin.pem`), installed for
/// this process's own calls (none without `--tls`).
fn install_operator(pki: Option<&pki::Pki>) -> anyhow::Result<TlsConfig> {
    let operator = match pki {
        Some(pki) => pki.issue(&Peer::new(Role::Operator, "admin"))?,
        None => TlsConfig::default(),
    };
    cellmesh_proto::tls::install(&operator).map_err(anyhow::Error::msg)?;
    Ok(operator)
}

/// Until Ctrl-C: applies the partition file to the proxies, the mock
/// Kafka's fault file to its brokers, restarts processes that exit, and
/// keeps dev.json's pids current. Then stops every process, and the mock
/// Kafka once no cell is left to use it.
async fn supervise(
    data: &Path,
    (links, proxies): (&[topology::Link], &[FaultProxy]),
    mut mock_kafka: Option<kafka::MockKafka>,
    mut sup: Supervisor,
    info: &mut serde_json::Value,
) -> anyhow::Result<()> {
    let shutdown = cellmesh_proto::server::shutdown_signal();
    tokio::pin!(shutdown);
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let mut partitioned = Vec::new();
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tick.tick() => {
                apply_partition(data, links, proxies, &mut partitioned);
                if let Some(mock) = &mut mock_kafka {
                    mock.apply(data);
                }
                let report = sup.check();
                for line in &report {
                    println!("dev: {line}");
                }
                if !report.is_empty() {
                    // Keep dev.json's pids current for tools that signal them.
                    info["processes"] = serde_json::json!(sup.pids().into_iter().collect::<BTreeMap<_, _>>());
                    let _ = write_info(data, info);
                }
            }
        }
    }
    println!("dev: stopping every component");
    tokio::task::spawn_blocking(move || sup.stop_all(Duration::from_secs(15))).await?;
    drop(mock_kafka);
    Ok(())
}

/// The demo tenant (see [`demo::prepare`]) as JSON, and a signed-in link to
/// the web app at the eu-west edge per demo user.
async fn demo(
    data: &Path,
    routes: &RouteClient,
    topo: &Topology,
    secrets: &Secrets,
) -> anyhow::Result<(serde_json::Value, BTreeMap<String, String>)> {
    let demo = demo::prepare(data, routes, topo, &secrets.cluster, &secrets.token)
        .await?
        .to_json();
    let web_links = demo["tokens"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(user, token)| (user.clone(), web_link(&topo.edge(0), token)))
        .collect();
    Ok((demo, web_links))
}

pub use cellmesh_chaos::target::PARTITION_FILE;

/// Writes `dev.json` whole or not at all (a temporary file renamed over
/// it): the tools and drills that read it while a restarted component's
/// pid is written never see it empty or half written.
fn write_info(data: &Path, info: &serde_json::Value) -> anyhow::Result<()> {
    let path = data.join("dev.json");
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(info)? + "\n")?;
    std::fs::rename(tmp, path)?;
    Ok(())
}

fn apply_partition(
    data: &Path,
    links: &[topology::Link],
    proxies: &[FaultProxy],
    current: &mut Vec<String>,
) {
    let wanted: Vec<String> = std::fs::read_to_string(data.join(PARTITION_FILE))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| serde_json::from_value(v["regions"].clone()).ok())
        .unwrap_or_default();
    if wanted == *current {
        return;
    }
    for (link, proxy) in links.iter().zip(proxies) {
        let cut = [link.from_region, link.to_region]
            .iter()
            .any(|r| wanted.iter().any(|w| w == REGIONS[*r]));
        if cut {
            proxy.partition(true, true);
            proxy.cut();
        } else {
            proxy.heal();
        }
    }
    println!("dev: partitioned regions now {wanted:?}");
    *current = wanted;
}

/// A local etcd on the topology's ports; its client URL. With `pki`
/// (`--tls`), it serves clients over mutual TLS with a certificate of its
/// own (`etcd-dev`, naming 127.0.0.1) and takes only clients the CA signed.
fn start_etcd(
    sup: &mut Supervisor,
    data: &Path,
    topo: &Topology,
    pki: Option<&pki::Pki>,
) -> anyhow::Result<String> {
    let (client, peer) = topo.etcd_ports();
    let dir = data.join("etcd");
    let scheme = if pki.is_some() { "https" } else { "http" };
    let client_url = format!("{scheme}://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let tls = match pki {
        Some(pki) => cellmesh_coord::etcd::server_tls_args(
            &pki.issue_server("etcd-dev", &["127.0.0.1".to_string()])?,
        ),
        None => Vec::new(),
    };
    sup.start_command(
        "etcd",
        "etcd",
        tls.into_iter()
            .chain([
                "--name".into(),
                "dev".into(),
                "--data-dir".into(),
                dir.to_string_lossy().into_owned(),
                "--listen-client-urls".into(),
                client_url.clone(),
                "--advertise-client-urls".into(),
                client_url,
                "--listen-peer-urls".into(),
                peer_url.clone(),
                "--initial-advertise-peer-urls".into(),
                peer_url.clone(),
                "--initial-cluster".into(),
                format!("dev={peer_url}"),
            ])
            .collect(),
    )?;
    Ok(format!("{scheme}://127.0.0.1:{client}"))
}

async fn connect_routes(topo: &Topology, secret: &str) -> anyhow::Result<RouteClient> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(client) =
            RouteClient::connect(topo.routers_from(0), ClusterSecret::new(secret)).await
            && let Ok(mut api) = client.routing()
        {
            let mut r = tonic::Request::new(cellmesh_proto::v1::RouterStatusRequest {});
            client.attach_secret(&mut r);
            if api
                .status(r)
                .await
                .is_ok_and(|s| s.into_inner().current_leader != 0)
            {
                return Ok(client);
            }
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!(
                "the routers did not elect a leader within 60 s (see the logs directory)"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until something accepts TCP connections on a loopback port.
async fn wait_listening(port: u16, what: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("timed out waiting for {what} on port {port} (see the logs directory)");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

async fn wait_for(limit: Duration, what: &str, mut ok: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    while !ok() {
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("timed out waiting for {what} (see the logs directory)");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The web app at `edge`, signed in with `token` (kept in the fragment,
/// which the browser never sends to a server).
fn web_link(edge: &str, token: &serde_json::Value) -> String {
    format!("{edge}/#token={}", token.as_str().unwrap_or_default())
}

fn print_summary(info: &serde_json::Value, data: &Path) {
    println!();
    println!(
        "cellmesh dev is running ({}; Ctrl-C stops it)",
        data.display()
    );
    for (region, url) in info["edges"].as_object().into_iter().flatten() {
        println!("  edge {region:<9} {}", url.as_str().unwrap_or_default());
    }
    println!("  routers        {}", info["routers"]);
    println!(
        "  console        {}",
        info["console_url"].as_str().unwrap_or_default()
    );
    if let Some(url) = info["prometheus_url"].as_str() {
        println!("  prometheus     {url}");
    }
    println!(
        "  traces         {} (sampled {})",
        info["traces"]["otlp"].as_str().unwrap_or_default(),
        info["traces"]["sample_ratio"]
    );
    let demo = &info["demo"];
    println!("  demo tenant    {}", demo["tenant"]);
    println!(
        "  token (user 1) {}",
        demo["token"].as_str().unwrap_or_default()
    );
    println!(
        "  web app        {} (user 1; web_links in dev.json for the others)",
        info["web_url"].as_str().unwrap_or_default()
    );
    println!();
    println!("Try:");
    let edge = info["edges"]["eu-west"].as_str().unwrap_or_default();
    for c in demo["conversations"].as_array().into_iter().flatten() {
        println!(
            "  conversation {} \"{}\" lives on {}",
            c["id"],
            c["title"].as_str().unwrap_or_default(),
            c["owner"].as_str().unwrap_or_default()
        );
    }
    println!(
        "  export CELLMESH_TOKEN={}",
        demo["token"].as_str().unwrap_or_default()
    );
    println!("  cellmesh chat --endpoint {edge} list");
    println!("  cellmesh chat --endpoint {edge} send -c CONVERSATION hello");
    println!(
        "  CELLMESH_CLUSTER_SECRET={} cellmesh ctl --routers {} cells",
        info["cluster_secret"].as_str().unwrap_or_default(),
        info["routers"][0].as_str().unwrap_or_default()
    );
    println!("Everything above is in {}/dev.json.", data.display());
}
