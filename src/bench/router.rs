//! `cellmesh bench router`: route writes, stale lookups and linearizable
//! lookups against the RoutingService — or the same key-value workload
//! against etcd (`--etcd`), so the two can be compared on one machine.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::{self as pb, Consistency};
use cellmesh_router::client::RouteClient;
use cellmesh_router::commands::{assign_tenant, register_cell};
use cellmesh_router::grpc::convert::key_to_pb;
use cellmesh_router::table::Key;
use clap::{Args, ValueEnum};
use etcd_client::GetOptions;
use hdrhistogram::Histogram;
use rand::Rng;

use super::{Report, count_error};

#[derive(Clone, Copy, ValueEnum)]
pub enum Op {
    /// Place a new tenant (router) / put a key (etcd).
    Write,
    /// A lookup from the replica's applied state / a serializable get.
    Read,
    /// A read-index lookup / a linearizable get.
    Linearizable,
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
}

#[derive(Clone)]
enum Target {
    Router(RouteClient),
    Etcd(Box<etcd_client::Client>),
}

/// Tenant ids of this run start here so repeated runs never collide.
fn run_base() -> u64 {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    (ms % 1_000_000) * 1_000_000_000
}

pub async fn run(args: RouterArgs) -> anyhow::Result<()> {
    let base = run_base();
    let (target, name) = if args.etcd.is_empty() {
        let client = RouteClient::connect(args.routers.clone(), ClusterSecret::new(&args.secret))
            .await
            .map_err(|e| {
                anyhow::anyhow!("cannot reach the routers: {}", crate::client::describe(&e))
            })?;
        let _ = client
            .apply(register_cell("bench/c1", "bench", "http://bench.invalid"))
            .await;
        // The read workloads look up tenants placed here.
        for k in 0..args.keys {
            let _ = client
                .apply(assign_tenant(base + k + 1, "bench/c1", 0))
                .await;
        }
        (Target::Router(client), "router")
    } else {
        let mut client = etcd_client::Client::connect(args.etcd.clone(), None).await?;
        for k in 0..args.keys {
            client
                .put(format!("/bench/{}", base + k + 1), "bench/c1", None)
                .await?;
        }
        (Target::Etcd(Box::new(client)), "etcd")
    };
    let deadline = Instant::now() + Duration::from(args.duration);
    let started = Instant::now();
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
                let ok = one(&target, op, write_id, read_id, &mut errors).await;
                if ok {
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
    let op = match args.op {
        Op::Write => "write",
        Op::Read => "read",
        Op::Linearizable => "linearizable",
    };
    let report = Report::new(
        &format!("{name}-{op}"),
        acked,
        errors,
        started.elapsed(),
        &latency,
    )
    .param("target", name)
    .param("op", op)
    .param("concurrency", args.concurrency)
    .param("keys", args.keys);
    report.print();
    if let Some(path) = &args.json {
        report.write_json(path)?;
    }
    Ok(())
}

async fn one(
    target: &Target,
    op: Op,
    write_id: u64,
    read_id: u64,
    errors: &mut BTreeMap<String, u64>,
) -> bool {
    match target {
        Target::Router(client) => {
            let result = match op {
                Op::Write => client
                    .apply(assign_tenant(write_id, "bench/c1", 0))
                    .await
                    .map(|_| ()),
                Op::Read | Op::Linearizable => {
                    let consistency = if matches!(op, Op::Read) {
                        Consistency::Stale
                    } else {
                        Consistency::Linearizable
                    };
                    match client.routing() {
                        Ok(mut c) => {
                            let mut r = tonic::Request::new(pb::ResolveRequest {
                                key: Some(key_to_pb(&Key::conversation(read_id, 1))),
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
                Op::Linearizable => kv.get(format!("/bench/{read_id}"), None).await.map(|_| ()),
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
