//! `cellmesh dev`: a whole multi-region deployment on this machine, as
//! separate processes of this binary supervised from here — 3 regions, a
//! router replica each (one Raft group), 2 cells each, an edge each, and the
//! control plane — with every cross-region path going through a fault proxy
//! that adds latency. It creates a demo tenant, prints endpoints, a token
//! and what to try, and writes the same to `DATA_DIR/dev.json`. The data
//! directory persists across runs; Ctrl-C stops every child cleanly.

mod demo;
pub mod kafka;
pub mod pki;
mod prometheus;
mod supervisor;
mod topology;
mod traces;

use cellmesh_proto::tls::{Peer, Role, TlsConfig};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use cellmesh_cell::CellConfig;
use cellmesh_cell::config::QueueBackend;
use cellmesh_cell::config::ReplicationMode;
use cellmesh_chaos::proxy::FaultProxy;
use cellmesh_control_plane::server::{ControlPlaneConfig, CoordinationBackend};
use cellmesh_edge::EdgeConfig;
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_route_client::client::RouteClient;
use cellmesh_router::config::{MemberConfig, RouterConfig};
use cellmesh_telemetry::trace::TraceConfig;
use clap::Args;
use rand::Rng;
use serde::{Deserialize, Serialize};

use supervisor::{Spec, Supervisor};
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

fn secrets(data_dir: &Path) -> anyhow::Result<Secrets> {
    let path = data_dir.join("secrets.json");
    if let Ok(text) = std::fs::read_to_string(&path) {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        return Ok(serde_json::from_str(&text)?);
    }
    let s = Secrets {
        cluster: random_secret(),
        token: random_secret(),
    };
    write_private(&path, serde_json::to_string_pretty(&s)?.as_bytes())?;
    Ok(s)
}

fn write_config<T: Serialize>(dir: &Path, name: &str, config: &T) -> anyhow::Result<String> {
    let path = dir.join(format!("{name}.toml"));
    write_private(&path, toml::to_string(config)?.as_bytes())?;
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
    let secrets = secrets(data)?;
    let pki = match args.tls {
        true => Some(pki::Pki::create(&data.join("tls"))?),
        false => None,
    };
    let tls = |role: Role, id: &str| -> anyhow::Result<TlsConfig> {
        match &pki {
            Some(pki) => pki.issue(&Peer::new(role, id)),
            None => Ok(TlsConfig::default()),
        }
    };
    if !args.tls {
        println!(
            "dev: WARNING: internal links run in plaintext (insecure_plaintext = true in every config); `cellmesh dev --tls` runs them over mutual TLS"
        );
    }
    let operator = tls(Role::Operator, "admin")?;
    cellmesh_proto::tls::install(&operator).map_err(anyhow::Error::msg)?;
    let topo = Topology {
        base: args.base_port,
    };
    let one_way = Duration::from(args.latency) / 2;
    let traces = traces::Traces::start(&topo, args.otlp.clone()).await?;
    let telemetry = TraceConfig {
        endpoint: traces.endpoint.clone(),
        sample_ratio: args.trace_ratio,
        ..TraceConfig::default()
    };
    telemetry.validate()?;

    // Cross-region paths: one proxy per (region, remote component).
    let mut proxies = Vec::new();
    let links = topo.links();
    for link in &links {
        let upstream = link
            .target
            .trim_start_matches("http://")
            .parse()
            .context("link target")?;
        let proxy = FaultProxy::start(format!("127.0.0.1:{}", link.port).parse()?, upstream)
            .await
            .with_context(|| {
                format!(
                    "cannot listen on port {} (is another `cellmesh dev` running?)",
                    link.port
                )
            })?;
        proxy.set_latency(one_way, one_way / 10);
        proxies.push(proxy);
    }

    // A partition left over from an interrupted drill does not outlive it.
    let _ = std::fs::remove_file(data.join(PARTITION_FILE));
    let mut mock_kafka = match args.kafka.as_deref() {
        Some("mock") => Some(kafka::MockKafka::start(data)?),
        _ => None,
    };
    let brokers = match &mock_kafka {
        Some(mock) => Some(mock.bootstrap_servers()),
        None => args.kafka.clone(),
    };
    let mut sup = Supervisor::new(data)?;
    let etcd_endpoints = if args.etcd {
        let (client, peer) = topo.etcd_ports();
        start_etcd(&mut sup, data, client, peer)?;
        vec![format!("http://127.0.0.1:{client}")]
    } else {
        Vec::new()
    };

    // Routers: one Raft group across the regions.
    let members: Vec<MemberConfig> = (0..REGIONS.len())
        .map(|r| MemberConfig {
            node_id: r as u64 + 1,
            region: REGIONS[r].into(),
            raft_addr: topo.router_raft(r),
            api_addr: topo.router_api(r),
        })
        .collect();
    for (r, region) in REGIONS.iter().enumerate() {
        let mut config = RouterConfig {
            node_id: r as u64 + 1,
            region: region.to_string(),
            data_dir: data.join(format!("router-{region}")),
            api_listen: format!("127.0.0.1:{}", topo.router_api_port(r)).parse()?,
            raft_listen: format!("127.0.0.1:{}", topo.router_raft_port(r)).parse()?,
            cluster_secret: secrets.cluster.clone(),
            links: topo.links_from(r),
            metrics_listen: format!("127.0.0.1:{}", topo.router_metrics_port(r)),
            telemetry: telemetry.clone(),
            ..RouterConfig::default()
        };
        config.cluster.bootstrap = r == 0;
        config.cluster.members = members.clone();
        config.tls = tls(Role::Router, &(r + 1).to_string())?;
        config.insecure_plaintext = !args.tls;
        let path = write_config(&configs, &format!("router-{region}"), &config)?;
        sup.start(Spec {
            name: format!("router-{region}"),
            args: vec!["router".into(), "--config".into(), path],
        })?;
    }
    let routes = connect_routes(&topo, &secrets.cluster).await?;
    println!("routers: a Raft group of {} replicas is up", REGIONS.len());

    for (r, region) in REGIONS.iter().enumerate() {
        for c in 0..CELLS_PER_REGION {
            let id = topo.cell_id(r, c);
            let mut config = CellConfig {
                cell_id: id.clone(),
                listen: format!("127.0.0.1:{}", topo.cell_port(r, c)).parse()?,
                data_dir: data.join(id.replace('/', "-")),
                instance_id: (r * CELLS_PER_REGION + c) as u16 + 1,
                metrics_listen: format!("127.0.0.1:{}", topo.cell_metrics_port(r, c)),
                telemetry: telemetry.clone(),
                ..CellConfig::default()
            };
            config.routing.routers = topo.routers_from(r);
            config.routing.cluster_secret = secrets.cluster.clone();
            config.routing.links = topo.links_from(r);
            config.routing.etcd_endpoints = etcd_endpoints.clone();
            // The control plane's records (without etcd): retention's deletions.
            config.routing.coordination_dir = data.join("coordination").display().to_string();
            // One directory stands for the object store all cells share, so
            // moves hand cold history over by its manifest.
            config.tiering.local_dir = data.join("cold");
            // Files live in their region's store (one directory per region,
            // shared by its cells, each serving it on its own signed URLs):
            // a move within the region hands over refs only.
            config.attachments.local_dir = data.join("files").join(REGIONS[r]);
            for other in REGIONS.iter().filter(|o| **o != REGIONS[r]) {
                let files = cellmesh_cell::attachments::RegionFiles {
                    local_dir: data.join("files").join(other),
                    ..Default::default()
                };
                config.attachments.regions.insert(other.to_string(), files);
            }
            config.attachments.http_listen = format!("127.0.0.1:{}", topo.cell_files_port(r, c));
            if let Some(n) = args.hot_messages {
                config.tiering.hot_messages_per_conversation = n;
                config.tiering.interval_ms = 1_000;
            }
            config.replication.mode = args.replication;
            config.tls = tls(Role::Cell, &id)?;
            config.insecure_plaintext = !args.tls;
            let other = match args.replication {
                ReplicationMode::Async => ReplicationMode::Sync,
                ReplicationMode::Sync => ReplicationMode::Async,
            };
            for tenant in &args.other_mode_tenants {
                config.replication.tenants.insert(tenant.to_string(), other);
            }
            if let Some(brokers) = &brokers {
                config.queue.backend = QueueBackend::Kafka;
                config.queue.kafka.brokers = brokers.clone();
                config.queue.kafka.topic = format!("cellmesh-{}", id.replace('/', "-"));
                if let Some(mock) = &mock_kafka {
                    config.queue.kafka.session_timeout_ms = 6_000;
                    mock.create_topic(&config.queue.kafka.topic, config.queue.partitions)?;
                }
            }
            let path = write_config(&configs, &id.replace('/', "-"), &config)?;
            sup.start(Spec {
                name: id.replace('/', "-"),
                args: vec!["cell".into(), "--config".into(), path],
            })?;
        }
        let _ = region;
    }
    wait_for(Duration::from_secs(60), "cells to register", || {
        routes.read(|t| t.cells.len()) >= REGIONS.len() * CELLS_PER_REGION
    })
    .await?;
    println!("cells: {} registered", REGIONS.len() * CELLS_PER_REGION);

    // Two control-plane replicas: they elect the active one in etcd with
    // `--etcd`, else through lock files in the data directory.
    let replicas = 2;
    let mut consoles = Vec::new();
    let mut admins = Vec::new();
    for i in 0..replicas {
        let mut config = ControlPlaneConfig {
            routers: topo.routers_from(0),
            cluster_secret: secrets.cluster.clone(),
            ..ControlPlaneConfig::default()
        };
        config.coordination.name = format!("control-plane-{}", i + 1);
        // Both replicas live in eu-west: they probe other regions' cells
        // across the same links as everything else.
        config.links = topo.links_from(0);
        config.console_listen = format!("127.0.0.1:{}", topo.console_port(i));
        consoles.push(format!("http://{}/", config.console_listen));
        config.admin_listen = format!("127.0.0.1:{}", topo.admin_port(i));
        admins.push(format!("http://{}", config.admin_listen));
        config.metrics_listen = format!("127.0.0.1:{}", topo.control_plane_metrics_port(i));
        config.telemetry = telemetry.clone();
        config.traces_url = traces.query_url.clone().unwrap_or_default();
        config.tls = tls(Role::ControlPlane, &(i + 1).to_string())?;
        config.insecure_plaintext = !args.tls;
        if args.etcd {
            config.coordination.backend = CoordinationBackend::Etcd;
            config.coordination.etcd_endpoints = etcd_endpoints.clone();
        } else {
            config.coordination.backend = CoordinationBackend::Local;
            config.coordination.dir = data.join("coordination").display().to_string();
        }
        let path = write_config(&configs, &format!("control-plane-{}", i + 1), &config)?;
        sup.start(Spec {
            name: format!("control-plane-{}", i + 1),
            args: vec!["control-plane".into(), "--config".into(), path],
        })?;
    }

    let mut edges = BTreeMap::new();
    for (r, region) in REGIONS.iter().enumerate() {
        let config = EdgeConfig {
            listen: format!("127.0.0.1:{}", topo.edge_port(r)).parse()?,
            region: region.to_string(),
            routers: topo.routers_from(r),
            cluster_secret: secrets.cluster.clone(),
            token_secret: secrets.token.clone(),
            links: topo.links_from(r),
            metrics_listen: format!("127.0.0.1:{}", topo.edge_metrics_port(r)),
            telemetry: telemetry.clone(),
            tls: tls(Role::Edge, region)?,
            insecure_plaintext: !args.tls,
            // The web chat app at every edge's own origin.
            web_app: true,
            ..EdgeConfig::default()
        };
        let path = write_config(&configs, &format!("edge-{region}"), &config)?;
        sup.start(Spec {
            name: format!("edge-{region}"),
            args: vec!["edge".into(), "--config".into(), path],
        })?;
        edges.insert(region.to_string(), topo.edge(r));
    }

    // dev.json promises working endpoints: every edge must accept first.
    for (r, region) in REGIONS.iter().enumerate() {
        wait_listening(topo.edge_port(r), &format!("the {region} edge")).await?;
    }
    let targets = topo.metrics_targets(replicas);
    let prometheus_url = if args.prometheus {
        let url = prometheus::start(&mut sup, data, topo.prometheus_port(), &targets)?;
        wait_listening(topo.prometheus_port(), "Prometheus").await?;
        Some(url)
    } else {
        None
    };
    let demo = demo::prepare(data, &routes, &topo, &secrets.cluster, &secrets.token)
        .await?
        .to_json();
    // A signed-in link to the web app at the eu-west edge per demo user.
    let web_links = demo["tokens"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(user, token)| (user.clone(), web_link(&topo.edge(0), token)))
        .collect::<BTreeMap<_, _>>();
    let mut info = serde_json::json!({
        "edges": edges,
        "cells": (0..REGIONS.len())
            .flat_map(|r| (0..CELLS_PER_REGION).map(move |c| (r, c)))
            .map(|(r, c)| (topo.cell_id(r, c), topo.cell(r, c)))
            .collect::<BTreeMap<_, _>>(),
        "routers": (0..REGIONS.len()).map(|r| topo.router_api(r)).collect::<Vec<_>>(),
        "control_plane": {"replicas": replicas, "coordination": if args.etcd { "etcd" } else { "local" },
            "consoles": consoles, "admin": admins},
        "console_url": consoles[0],
        "metrics": targets
            .iter()
            .map(|t| (t.name.clone(), format!("http://{}/metrics", t.address)))
            .collect::<BTreeMap<_, _>>(),
        "prometheus_url": prometheus_url,
        "traces": {"otlp": traces.endpoint, "query_url": traces.query_url, "sample_ratio": args.trace_ratio},
        "cluster_secret": secrets.cluster,
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
    std::fs::write(
        data.join("dev.json"),
        serde_json::to_string_pretty(&info)? + "\n",
    )?;
    print_summary(&info, data);

    let shutdown = cellmesh_proto::server::shutdown_signal();
    tokio::pin!(shutdown);
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let mut partitioned = Vec::new();
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tick.tick() => {
                apply_partition(data, &links, &proxies, &mut partitioned);
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
                    let _ = std::fs::write(data.join("dev.json"), serde_json::to_string_pretty(&info)? + "\n");
                }
            }
        }
    }
    println!("dev: stopping every component");
    tokio::task::spawn_blocking(move || sup.stop_all(Duration::from_secs(15))).await?;
    drop(proxies);
    println!("dev: stopped; data kept in {}", data.display());
    Ok(())
}

pub use cellmesh_chaos::target::PARTITION_FILE;

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

fn start_etcd(sup: &mut Supervisor, data: &Path, client: u16, peer: u16) -> anyhow::Result<()> {
    let dir = data.join("etcd");
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    sup.start_command(
        "etcd",
        "etcd",
        vec![
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
        ],
    )
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
