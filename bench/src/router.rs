//! `cellmesh bench router`: route writes, stale lookups and linearizable
//! lookups against the RoutingService — or the same key-value workload
//! against etcd (`--etcd`), so the two can be compared on one machine.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::{self as pb, Consistency};
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::commands::{assign_tenant, register_cell};
use cellmesh_route_client::convert::key_to_pb;
use cellmesh_route_client::table::Key;
use clap::{Args, ValueEnum};
use etcd_client::GetOptions;
use hdrhistogram::Histogram;
use rand::Rng;

use crate::{Report, count_error};

#[derive(Clone, Copy, ValueEnum)]
pub enum Op {
    /// Place a new tenant (router) / put a key (etcd).
    Write,
    /// A lookup from the replica's applied state / a serializable get.
    Read,
    /// A read-index lookup / a linearizable get.
    Linearizable,
    /// A lookup in the route client's watch-fed cache (router only).
    Cached,
}

#[derive(Args)]
pub struct RouterArgs {
    /// Routing API endpoints, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:7300")]
    routers: Vec<String>,
    #[arg(
        long,
        env = "CELLMESH_CLUSTER_SECRET",
        default_value = "",
        hide_env_values = true
    )]
    secret: String,
    /// Run the workload against these etcd endpoints instead.
    #[arg(long, value_delimiter = ',')]
    etcd: Vec<String>,
    /// With --etcd: run against the routers and then etcd, and write both
    /// reports side by side.
    #[arg(long)]
    compare: bool,
    #[arg(long, value_enum, default_value = "write")]
    op: Op,
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    #[arg(long, default_value = "10s")]
    duration: humantime::Duration,
    /// Keys the read workloads choose from.
    #[arg(long, default_value_t = 1000)]
    keys: u64,
    #[arg(long)]
    json: Option<PathBuf>,
    /// Take routers and secret (and etcd, if it runs one) from a running
    /// `cellmesh dev` (its data dir).
    #[arg(long)]
    dev: Option<PathBuf>,
}

#[derive(Clone)]
enum Target {
    /// The client and the cell the bench's tenants go on.
    Router(RouteClient, String),
    Etcd(Box<etcd_client::Client>),
}

/// Tenant ids of this run start here so repeated runs never collide.
fn run_base() -> u64 {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    (ms % 1_000_000) * 1_000_000_000
}

async fn router_target(args: &RouterArgs, base: u64) -> anyhow::Result<Target> {
    let client = RouteClient::connect(args.routers.clone(), ClusterSecret::new(&args.secret))
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot reach the routers: {}",
                cellmesh_client::connect::describe(&e)
            )
        })?;
    // A deployment's tenants go on one of its cells; an empty route table
    // (a router cluster of its own) gets a placeholder cell, which a
    // control plane would fail over.
    let cell = match client.read(|t| t.cells.keys().next().cloned()) {
        Some(cell) => cell,
        None => {
            let _ = client
                .apply(register_cell("bench/c1", "bench", "http://bench.invalid"))
                .await;
            "bench/c1".to_string()
        }
    };
    // The read workloads look up tenants placed here.
    let mut last = 0;
    for k in 0..args.keys {
        if let Ok(r) = client
            .apply(assign_tenant(TenantId(base + k + 1), &cell, 0))
            .await
        {
            last = r.index;
        }
    }
    // The cached workload reads what the watch has delivered.
    client.wait_applied(last, Duration::from_secs(10)).await;
    Ok(Target::Router(client, cell))
}

async fn etcd_target(args: &RouterArgs, base: u64) -> anyhow::Result<Target> {
    let mut client = etcd_client::Client::connect(args.etcd.clone(), None).await?;
    for k in 0..args.keys {
        client
            .put(format!("/bench/{}", base + k + 1), "bench/c1", None)
            .await?;
    }
    Ok(Target::Etcd(Box::new(client)))
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Write => "write",
        Op::Read => "read",
        Op::Linearizable => "linearizable",
        Op::Cached => "cached",
    }
}

pub async fn run(mut args: RouterArgs) -> anyhow::Result<()> {
    if let Some(dir) = &args.dev {
        cellmesh_chaos::target::DevTarget::load(dir)?.fill_routing(
            &mut args.routers,
            &mut args.secret,
            &mut args.etcd,
        );
    }
    let base = run_base();
    let mut targets = Vec::new();
    if args.etcd.is_empty() || args.compare {
        targets.push(("router", router_target(&args, base).await?));
    }
    if !args.etcd.is_empty() {
        targets.push(("etcd", etcd_target(&args, base).await?));
    }
    let mut reports = serde_json::Map::new();
    for (name, target) in targets {
        let report = measure(&args, base, name, target).await?;
        report.print();
        reports.insert(name.to_string(), serde_json::to_value(&report)?);
    }
    if let Some(path) = &args.json {
        let out = if reports.len() == 1 {
            reports
                .into_iter()
                .next()
                .map(|(_, v)| v)
                .unwrap_or_default()
        } else {
            serde_json::json!({"scenario": format!("router-vs-etcd-{}", op_name(args.op)), "reports": reports})
        };
        std::fs::write(path, serde_json::to_string_pretty(&out)? + "\n")?;
    }
    Ok(())
}

/// Lookups from the route client's in-process cache, on plain threads.
fn cached(client: &RouteClient, args: &RouterArgs, base: u64) -> (u64, Histogram<u64>) {
    let deadline = Instant::now() + Duration::from(args.duration);
    let threads: Vec<_> = (0..args.concurrency)
        .map(|_| {
            let client = client.clone();
            let keys = args.keys;
            std::thread::spawn(move || {
                let mut latency =
                    Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
                let mut n = 0u64;
                let mut rng = rand::rng();
                while Instant::now() < deadline {
                    // Timed per 1,000 lookups; recorded in nanoseconds each.
                    let t = Instant::now();
                    for _ in 0..1000 {
                        let key = Key::conversation(
                            TenantId(base + 1 + rng.random_range(0..keys)),
                            ConversationId(1),
                        );
                        std::hint::black_box(client.resolve(&key));
                    }
                    let _ = latency.record((t.elapsed().as_nanos() / 1000).max(1) as u64);
                    n += 1000;
                }
                (n, latency)
            })
        })
        .collect();
    let mut total = 0;
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
    for t in threads {
        let (n, l) = t.join().expect("bench thread");
        total += n;
        let _ = latency.add(l);
    }
    (total, latency)
}

async fn measure(
    args: &RouterArgs,
    base: u64,
    name: &str,
    target: Target,
) -> anyhow::Result<Report> {
    let op = op_name(args.op);
    let started = Instant::now();
    if let (Op::Cached, Target::Router(client, _)) = (args.op, &target) {
        let (acked, latency) = cached(client, args, base);
        // Latency here is nanoseconds per lookup (the report's unit is µs).
        return Ok(Report::new(
            &format!("{name}-{op}"),
            acked,
            BTreeMap::new(),
            started.elapsed(),
            &latency,
        )
        .param("target", name)
        .param("op", op)
        .param("latency_unit", "ns (cached lookups are sub-microsecond)")
        .param("concurrency", args.concurrency)
        .param("keys", args.keys));
    }
    anyhow::ensure!(
        !matches!(args.op, Op::Cached),
        "--op cached measures the route client only"
    );
    let deadline = Instant::now() + Duration::from(args.duration);
    let mut workers = Vec::new();
    for w in 0..args.concurrency {
        let target = target.clone();
        let (op, keys) = (args.op, args.keys);
        workers.push(tokio::spawn(async move {
            let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
            let mut errors = BTreeMap::new();
            let mut acked = 0u64;
            let mut n = 0u64;
            while Instant::now() < deadline {
                n += 1;
                let write_id = base + keys + 1 + (w as u64) * 100_000_000 + n;
                let read_id = base + 1 + rand::rng().random_range(0..keys);
                let t = Instant::now();
                if one(&target, op, write_id, read_id, &mut errors).await {
                    acked += 1;
                    let _ = latency.record(t.elapsed().as_micros() as u64);
                }
            }
            (acked, errors, latency)
        }));
    }
    let mut acked = 0;
    let mut errors = BTreeMap::new();
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for w in workers {
        let (a, e, l) = w.await?;
        acked += a;
        for (k, v) in e {
            *errors.entry(k).or_insert(0) += v;
        }
        latency.add(l)?;
    }
    Ok(Report::new(
        &format!("{name}-{op}"),
        acked,
        errors,
        started.elapsed(),
        &latency,
    )
    .param("target", name)
    .param("op", op)
    .param("concurrency", args.concurrency)
    .param("keys", args.keys))
}

async fn one(
    target: &Target,
    op: Op,
    write_id: u64,
    read_id: u64,
    errors: &mut BTreeMap<String, u64>,
) -> bool {
    match target {
        Target::Router(client, cell) => {
            let result = match op {
                Op::Write => client
                    .apply(assign_tenant(TenantId(write_id), cell, 0))
                    .await
                    .map(|_| ()),
                Op::Cached => {
                    return client
                        .resolve(&Key::conversation(TenantId(read_id), ConversationId(1)))
                        .is_some();
                }
                Op::Read | Op::Linearizable => {
                    let consistency = if matches!(op, Op::Read) {
                        Consistency::Stale
                    } else {
                        Consistency::Linearizable
                    };
                    match client.routing() {
                        Ok(mut c) => {
                            let mut r = tonic::Request::new(pb::ResolveRequest {
                                key: Some(key_to_pb(&Key::conversation(
                                    TenantId(read_id),
                                    ConversationId(1),
                                ))),
                                consistency: consistency as i32,
                            });
                            client.attach_secret(&mut r);
                            c.resolve(r).await.map(|_| ())
                        }
                        Err(e) => Err(e),
                    }
                }
            };
            match result {
                Ok(()) => true,
                Err(status) => {
                    count_error(errors, &status);
                    false
                }
            }
        }
        Target::Etcd(client) => {
            let mut kv = client.kv_client();
            let result = match op {
                Op::Write => kv
                    .put(format!("/bench/{write_id}"), "bench/c1", None)
                    .await
                    .map(|_| ()),
                Op::Read => kv
                    .get(
                        format!("/bench/{read_id}"),
                        Some(GetOptions::new().with_serializable()),
                    )
                    .await
                    .map(|_| ()),
                Op::Linearizable | Op::Cached => {
                    kv.get(format!("/bench/{read_id}"), None).await.map(|_| ())
                }
            };
            match result {
                Ok(()) => true,
                Err(e) => {
                    *errors.entry(format!("ETCD: {e}")).or_insert(0) += 1;
                    false
                }
            }
        }
    }
}
