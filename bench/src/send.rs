//! `cellmesh bench send`: N concurrent clients send into a set of group
//! conversations, each send with a unique client_req_id, and every ack's
//! latency goes into an HDR histogram.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::{ConversationKind, CreateConversationRequest, MessageType};
use clap::Args;
use hdrhistogram::Histogram;
use rand::Rng;
use tonic::transport::Channel;

use crate::{Report, authed_in, count_error, error_code, send_request};
use cellmesh_client::connect::{call_error, caller, connect};

#[derive(Args)]
pub struct SendArgs {
    /// gRPC endpoint of a standalone cell.
    #[arg(long, required_unless_present = "dev")]
    endpoint: Option<String>,
    /// Send through the edge of a running `cellmesh dev` (its data dir),
    /// as users of its demo tenant with tokens.
    #[arg(long, conflicts_with = "endpoint")]
    dev: Option<PathBuf>,
    /// Concurrent in-flight sends.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// How long to send, e.g. `30s`.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Write the figures here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Conversations to spread the sends over.
    #[arg(long, default_value_t = 256)]
    conversations: u64,
    /// Members per conversation (each one a sender).
    #[arg(long, default_value_t = 8)]
    members: u64,
    #[arg(long, default_value_t = 200)]
    body_bytes: usize,
    /// HTTP/2 connections the clients share.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Tenant to create the conversations in (default: a fresh one; with
    /// `--dev`, the demo tenant). With `--dev`, another tenant is placed on
    /// the demo tenant's cell (e.g. one the cells replicate in another
    /// mode, see `scripts/bench-replication.sh`).
    #[arg(long)]
    tenant: Option<u64>,
    /// The JSON `bench storage` wrote on this machine: the run also
    /// reports its throughput as a share of that ceiling.
    #[arg(long)]
    ceiling: Option<PathBuf>,
}

pub type Client = MessagingClient<Channel>;

struct Conv {
    id: u64,
    first_user: u64,
}

pub async fn run(args: SendArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.concurrency > 0, "--concurrency must be at least 1");
    anyhow::ensure!(
        args.conversations > 0 && args.members > 0,
        "need conversations and members"
    );
    let dev = args
        .dev
        .as_deref()
        .map(cellmesh_chaos::target::DevTarget::load)
        .transpose()?
        .map(std::sync::Arc::new);
    let (endpoint, tenant) = match &dev {
        Some(d) => {
            let tenant = args.tenant.unwrap_or(d.tenant);
            if tenant != d.tenant {
                d.place_beside_demo(tenant).await?;
            }
            (d.edge.clone(), tenant)
        }
        None => (
            args.endpoint.clone().unwrap_or_default(),
            args.tenant
                .unwrap_or_else(|| rand::rng().random_range(1_000_000..u32::MAX as u64)),
        ),
    };
    let mut clients = Vec::new();
    for _ in 0..args.connections.max(1) {
        clients.push(connect(&endpoint).await?);
    }
    let conversations =
        create_conversations(&mut clients[0], tenant, &args, dev.as_deref()).await?;
    println!(
        "created {} conversations in tenant {tenant}; sending for {:?} at concurrency {}",
        conversations.len(),
        args.duration,
        args.concurrency
    );

    let start = Instant::now();
    let load = std::sync::Arc::new(Load {
        tenant,
        convs: conversations,
        members: args.members,
        body_bytes: args.body_bytes,
        deadline: start + args.duration,
        dev,
    });
    let mut workers = Vec::new();
    for w in 0..args.concurrency {
        let client = clients[w % clients.len()].clone();
        let load = load.clone();
        workers.push(tokio::spawn(async move { worker(client, w, load).await }));
    }
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut acked = 0;
    let mut errors = BTreeMap::new();
    for w in workers {
        let out = w.await?;
        latency.add(&out.latency)?;
        acked += out.acked;
        for (code, n) in out.errors {
            *errors.entry(code).or_insert(0) += n;
        }
    }
    let report = Report::new("send", acked, errors, start.elapsed(), &latency)
        .param("concurrency", args.concurrency)
        .param("conversations", args.conversations)
        .param("members", args.members)
        .param("body_bytes", args.body_bytes)
        .param("connections", args.connections)
        .param("tenant", tenant)
        .against_ceiling(args.ceiling.as_deref())?;
    report.print();
    if let Some(path) = &args.json {
        report.write_json(path)?;
    }
    Ok(())
}

/// Bench users start here in a dev deployment (clear of the demo users).
const DEV_USER_BASE: u64 = 100_000;

async fn create_conversations(
    client: &mut MessagingClient<Channel>,
    tenant: u64,
    args: &SendArgs,
    dev: Option<&cellmesh_chaos::target::DevTarget>,
) -> anyhow::Result<Vec<Conv>> {
    let base = if dev.is_some() { DEV_USER_BASE } else { 0 };
    let mut out = Vec::new();
    for i in 0..args.conversations {
        let first_user = base + 1 + i * args.members;
        let members = (first_user + 1..first_user + args.members).collect();
        let kind = if args.members == 2 {
            ConversationKind::Direct
        } else {
            ConversationKind::Group
        };
        let request = CreateConversationRequest {
            caller: caller(tenant, first_user),
            kind: kind as i32,
            title: format!("bench {i}"),
            member_ids: members,
            client_req_id: format!("bench-create-{i}"),
        };
        // A tenant just placed reaches the edges through their route watch.
        let patience = Instant::now() + Duration::from_secs(10);
        let created = loop {
            match client
                .create_conversation(authed_in(dev, tenant, first_user, request.clone()))
                .await
            {
                Ok(created) => break created.into_inner(),
                Err(e) if error_code(&e).is_retryable() && Instant::now() < patience => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => {
                    return Err(call_error(e)).context("creating bench conversations");
                }
            }
        };
        let id = created.conversation.map(|c| c.conversation_id).unwrap_or(0);
        out.push(Conv { id, first_user });
    }
    Ok(out)
}

struct WorkerResult {
    acked: u64,
    errors: BTreeMap<String, u64>,
    latency: Histogram<u64>,
}

/// What every worker sends, and until when.
struct Load {
    tenant: u64,
    convs: Vec<Conv>,
    members: u64,
    body_bytes: usize,
    deadline: Instant,
    dev: Option<std::sync::Arc<cellmesh_chaos::target::DevTarget>>,
}

async fn worker(
    mut client: MessagingClient<Channel>,
    worker: usize,
    load: std::sync::Arc<Load>,
) -> WorkerResult {
    let Load {
        tenant,
        ref convs,
        members,
        body_bytes,
        deadline,
        ref dev,
    } = *load;
    // Request ids unique across runs (a dev tenant outlives a run).
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut out = WorkerResult {
        acked: 0,
        errors: BTreeMap::new(),
        latency: Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds"),
    };
    let body = vec![b'x'; body_bytes.max(1)];
    let mut n = 0u64;
    while Instant::now() < deadline {
        let (conv, sender) = {
            let mut rng = rand::rng();
            let c = &convs[rng.random_range(0..convs.len())];
            (c.id, c.first_user + rng.random_range(0..members))
        };
        n += 1;
        let id = format!("b{run}-{worker}-{n}");
        let request = send_request(tenant, sender, conv, id, MessageType::Text, body.clone());
        let started = Instant::now();
        match client
            .send(authed_in(dev.as_deref(), tenant, sender, request))
            .await
        {
            Ok(_) => {
                out.acked += 1;
                let _ = out.latency.record(started.elapsed().as_micros() as u64);
            }
            Err(status) => count_error(&mut out.errors, &status),
        }
    }
    out
}
