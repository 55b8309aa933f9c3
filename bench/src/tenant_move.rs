//! `cellmesh bench tenant-move --dev DATA_DIR`: fills a fresh tenant
//! through the edge of a running `cellmesh dev` (conversations, messages,
//! members), then moves the whole tenant to another cell of its region
//! while senders keep writing to it. Reports conversations and messages
//! moved per second, the total time, the freeze window, the route-table
//! writes the move made (and the Raft log's growth meanwhile), each router
//! replica's resident memory before and after, and what the senders saw.

use cellmesh_proto::ids::TenantId;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cellmesh_control_plane::migration::tenant::TenantMoveReport;
use cellmesh_control_plane::migration::{MigrationOptions, Migrator};
use cellmesh_proto::status::{error_code, error_detail};
use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::{ConversationKind, CreateConversationRequest, ErrorCode, MessageType};
use cellmesh_route_client::table::Key;
use clap::Args;
use futures::StreamExt;
use hdrhistogram::Histogram;
use tonic::transport::Channel;

use crate::{Report, count_error, send_request};
use cellmesh_chaos::target::DevTarget;

#[derive(Args)]
pub struct TenantMoveArgs {
    /// The data dir of a running `cellmesh dev`.
    #[arg(long)]
    dev: PathBuf,
    /// The tenant to fill and move (default: a fresh id).
    #[arg(long)]
    tenant: Option<u64>,
    #[arg(long, default_value_t = 1_000)]
    conversations: u64,
    /// Messages in each conversation before the move.
    #[arg(long, default_value_t = 10)]
    messages: u64,
    /// Members of each conversation (drawn from conversations/2 users).
    #[arg(long, default_value_t = 2)]
    members: u64,
    /// Requests in flight while filling.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Copies in flight during the move.
    #[arg(long, default_value_t = 16)]
    parallel: usize,
    /// Copy rate limit, messages and events per second (0: none).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Conversations that senders keep writing to during the move.
    #[arg(long, default_value_t = 4)]
    writers: u64,
    /// Wait this long between filling and moving (e.g. for the cells'
    /// tierers to move history cold: `cellmesh dev --hot-messages N`).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    settle: Duration,
    /// Move to a cell of this region (default: the tenant's own region).
    #[arg(long)]
    to_region: Option<String>,
    /// Files uploaded into the tenant's conversations before the move.
    #[arg(long, default_value_t = 0)]
    files: u64,
    /// Size of each file, MiB.
    #[arg(long, default_value_t = 64)]
    file_mb: u64,
    /// File copy rate limit, bytes per second (0: none).
    #[arg(long, default_value_t = 0)]
    file_rate: u64,
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Resident memory of each router replica of the deployment, in KiB.
fn router_rss(dev: &DevTarget) -> BTreeMap<String, u64> {
    let info: serde_json::Value = std::fs::read_to_string(dev.dir().join("dev.json"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    let mut out = BTreeMap::new();
    for (name, pid) in info["processes"].as_object().into_iter().flatten() {
        let Some(pid) = pid.as_i64().filter(|_| name.starts_with("router-")) else {
            continue;
        };
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        out.insert(name.clone(), kib);
    }
    out
}

/// Retries `call` while it is rate limited, after the wait it asks for.
async fn patiently<T, F, Fut>(mut call: F) -> Result<T, tonic::Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    loop {
        match call().await {
            Err(e) if error_code(&e) == ErrorCode::RateLimited => {
                let wait = error_detail(&e).retry_after_ms.max(1);
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
            other => return other,
        }
    }
}

/// The members of the tenant's conversation `i` (drawn from
/// conversations/2 users).
fn members(args: &TenantMoveArgs, i: u64) -> Vec<u64> {
    let pool = (args.conversations / 2).max(args.members).max(1);
    (0..args.members)
        .map(|j| (i * args.members + j) % pool + 1)
        .collect()
}

/// Creates the tenant's conversations and fills them; their ids.
async fn fill(
    args: &TenantMoveArgs,
    dev: &Arc<DevTarget>,
    channel: &Channel,
    tenant: u64,
    run: u64,
) -> anyhow::Result<Vec<u64>> {
    let members = |i: u64| members(args, i);
    let created = futures::stream::iter(0..args.conversations)
        .map(|i| {
            let (dev, client) = (dev.clone(), MessagingClient::new(channel.clone()));
            let members = members(i);
            async move {
                let create = CreateConversationRequest {
                    kind: ConversationKind::Group as i32,
                    title: format!("bench-tenant-{i}"),
                    member_ids: members.clone(),
                    client_req_id: format!("bt-{run}-{i}"),
                    ..Default::default()
                };
                let conversation = patiently(|| {
                    let mut client = client.clone();
                    let request = dev.request_in(tenant, create.clone(), members[0], "bench");
                    async move { client.create_conversation(request).await }
                })
                .await?
                .into_inner()
                .conversation
                .map_or(0, |c| c.conversation_id);
                for n in 0..args.messages {
                    let user = members[(n % members.len() as u64) as usize];
                    let send = send_request(
                        tenant,
                        user,
                        conversation,
                        format!("bt-{run}-{i}-{n}"),
                        MessageType::Text,
                        vec![b'x'; 100],
                    );
                    patiently(|| {
                        let mut client = client.clone();
                        let request = dev.request_in(tenant, send.clone(), user, "bench");
                        async move { client.send(request).await }
                    })
                    .await?;
                }
                Ok::<_, tonic::Status>((i, conversation))
            }
        })
        .buffer_unordered(args.concurrency.max(1));
    let ids: Vec<Result<(u64, u64), tonic::Status>> = created.collect().await;
    let mut ids = ids
        .into_iter()
        .map(|r| r.map_err(|e| anyhow::anyhow!(cellmesh_client::connect::describe(&e))))
        .collect::<anyhow::Result<Vec<_>>>()?;
    // In creation order: conversation i has the members `members(i)`.
    ids.sort_unstable();
    Ok(ids.into_iter().map(|(_, c)| c).collect())
}

type Writers = Vec<tokio::task::JoinHandle<(u64, BTreeMap<String, u64>, Histogram<u64>)>>;

/// The cell the tenant moves to: another cell of `to_region`, or of the
/// region of `from`.
fn target_cell(
    routes: &cellmesh_route_client::client::RouteClient,
    from: &str,
    to_region: Option<&str>,
) -> anyhow::Result<String> {
    routes
        .read(|t| {
            let own = t.cell(from).map(|c| c.region.clone())?;
            let region = to_region.map_or(own, str::to_string);
            t.cells
                .values()
                .find(|c| c.id != from && c.region == region)
                .map(|c| c.id.clone())
        })
        .ok_or_else(|| anyhow::anyhow!("no other cell to move {from}'s tenant to"))
}

/// Senders that keep writing to the tenant's first conversations until
/// `stop`, each yielding its acks, errors and latencies.
fn start_writers(
    args: &TenantMoveArgs,
    dev: &Arc<DevTarget>,
    channel: &Channel,
    (tenant, run): (u64, u64),
    conversations: &[u64],
    stop: &Arc<AtomicBool>,
) -> Writers {
    let mut writers = Vec::new();
    for (w, &conversation) in conversations.iter().take(args.writers as usize).enumerate() {
        let (dev, stop) = (dev.clone(), stop.clone());
        let mut client = MessagingClient::new(channel.clone());
        let user = members(args, w as u64)[0];
        writers.push(tokio::spawn(async move {
            let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
            let (mut acked, mut errors) = (0u64, BTreeMap::new());
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let send = send_request(
                    tenant,
                    user,
                    conversation,
                    format!("btw-{run}-{w}-{n}"),
                    MessageType::Text,
                    vec![b'x'; 100],
                );
                let t = Instant::now();
                match client
                    .send(dev.request_in(tenant, send, user, "bench"))
                    .await
                {
                    Ok(_) => {
                        acked += 1;
                        let _ = latency.record(t.elapsed().as_micros() as u64);
                    }
                    Err(e) => count_error(&mut errors, &e),
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (acked, errors, latency)
        }));
    }
    writers
}

/// The writers' acks, errors and latencies, together.
async fn join_writers(
    writers: Writers,
) -> anyhow::Result<(u64, BTreeMap<String, u64>, Histogram<u64>)> {
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let (mut acked, mut errors) = (0u64, BTreeMap::new());
    for w in writers {
        let (a, e, l) = w.await?;
        acked += a;
        latency.add(&l)?;
        for (code, n) in e {
            *errors.entry(code).or_insert(0) += n;
        }
    }
    Ok((acked, errors, latency))
}

/// What the bench measured around the move.
struct Measured {
    report: TenantMoveReport,
    files_wait: Duration,
    raft_log_growth: u64,
    rss_before: BTreeMap<String, u64>,
    rss_after: BTreeMap<String, u64>,
}

fn to_report(args: &TenantMoveArgs, tenant: u64, m: Measured, writers: WritersSeen) -> Report {
    let (acked, errors, latency) = writers;
    let report = &m.report;
    let total = report.total.as_secs_f64().max(1e-9);
    let per_s = |n: f64| (n / total * 1000.0).round() / 1000.0;
    Report::new("tenant-move", acked, errors, report.total, &latency)
        .param("tenant", tenant)
        .param("settle_s", args.settle.as_secs())
        .param("from", report.from.clone())
        .param("to", report.to.clone())
        .param("conversations", report.conversations_moved)
        .param("user_homes", report.users_moved)
        .param("rows_copied", report.messages_moved)
        .param("bytes_copied", report.bytes_moved)
        .param("megabytes_per_s", per_s(report.bytes_moved as f64 / 1e6))
        .param(
            "conversations_per_s",
            per_s(report.conversations_moved as f64).round(),
        )
        .param("rows_per_s", per_s(report.messages_moved as f64).round())
        .param("total_s", (total * 1000.0).round() / 1000.0)
        .param("freeze_ms", report.max_freeze.as_millis() as u64)
        .param(
            "freeze_steps_ms",
            serde_json::json!(
                report
                    .freeze_steps
                    .iter()
                    .map(|(step, d)| (step.to_string(), d.as_millis() as u64))
                    .collect::<Vec<_>>()
            ),
        )
        .param("files", report.files.files)
        .param("file_bytes_copied", report.files.bytes)
        .param("files_still_copying", report.files.files_pending)
        .param("file_gb_per_s", per_s(report.files.bytes as f64 / 1e9))
        .param("files_wait_after_switch_s", m.files_wait.as_secs_f64())
        .param("route_writes", report.route_writes)
        .param("raft_log_growth", m.raft_log_growth)
        .param("router_rss_kib_before", serde_json::json!(m.rss_before))
        .param("router_rss_kib_after", serde_json::json!(m.rss_after))
        .param("latency_is", "acks of the senders writing during the move")
}

type WritersSeen = (u64, BTreeMap<String, u64>, Histogram<u64>);

pub async fn run(args: TenantMoveArgs) -> anyhow::Result<()> {
    let dev = Arc::new(DevTarget::load(&args.dev)?);
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let tenant = args.tenant.unwrap_or(1_000 + run % 100_000);
    dev.place_beside_demo(tenant).await?;
    let routes = dev.routes().await?;
    let channel = Channel::from_shared(dev.edge.clone())?.connect().await?;
    let filled_at = Instant::now();
    let conversations = fill(&args, &dev, &channel, tenant, run).await?;
    println!(
        "tenant {tenant}: {} conversations of {} messages filled in {:.1} s",
        conversations.len(),
        args.messages,
        filled_at.elapsed().as_secs_f64()
    );
    let uploads: Vec<(u64, u64)> = (conversations.iter().enumerate())
        .map(|(i, &c)| (c, members(&args, i as u64)[0]))
        .collect();
    let (file_bytes, upload_time) =
        crate::tenant_files::upload(&dev, tenant, &uploads, (args.files, args.file_mb)).await?;
    if file_bytes > 0 {
        println!(
            "tenant {tenant}: {} files, {:.2} GB uploaded in {:.1} s",
            args.files,
            file_bytes as f64 / 1e9,
            upload_time.as_secs_f64()
        );
    }
    if !args.settle.is_zero() {
        println!("waiting {:?} before the move", args.settle);
        tokio::time::sleep(args.settle).await;
    }
    let from = routes
        .resolve(&Key::tenant(TenantId(tenant)))
        .map(|r| r.entry.cell)
        .unwrap_or_default();
    let to = target_cell(&routes, &from, args.to_region.as_deref())?;

    // Senders keep writing to the tenant while it moves.
    let stop = Arc::new(AtomicBool::new(false));
    let ids = (tenant, run);
    let writers = start_writers(&args, &dev, &channel, ids, &conversations, &stop);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let rss_before = router_rss(&dev);
    let index_before = routes.applied();
    let options = MigrationOptions {
        rate: args.rate,
        file_rate: args.file_rate,
        ..MigrationOptions::default()
    };
    let migrator = Migrator::new(routes.clone(), dev.secret(), options);
    let mut last_phase = "";
    let mut switched_at = None;
    let move_started = Instant::now();
    let report = migrator
        .migrate_tenant(TenantId(tenant), &to, args.parallel, |p| {
            if p.phase == "files" {
                switched_at.get_or_insert_with(Instant::now);
            }
            if p.phase != last_phase {
                last_phase = p.phase;
                println!(
                    "  {:>6} ms {:<9} {} conversations, {} homes, {} rows copied, lag {}",
                    move_started.elapsed().as_millis(),
                    p.phase,
                    p.conversations,
                    p.users_moved,
                    p.messages,
                    p.lag
                );
            }
        })
        .await?;
    let measured = Measured {
        report,
        files_wait: switched_at.map_or(Duration::ZERO, |t| t.elapsed()),
        raft_log_growth: routes.applied().saturating_sub(index_before),
        rss_before,
        rss_after: BTreeMap::new(),
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let measured = Measured {
        rss_after: router_rss(&dev),
        ..measured
    };
    let out = to_report(&args, tenant, measured, join_writers(writers).await?);
    out.print();
    if let Some(path) = &args.json {
        out.write_json(path)?;
    }
    Ok(())
}
