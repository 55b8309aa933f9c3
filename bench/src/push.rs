//! `cellmesh bench push`: D online devices (one per user) subscribe to
//! their sync queues while senders, paced at a target rate (their ticks
//! spread evenly, not in step), send into 1:1 and group conversations
//! among those users. Each body carries its send
//! time and the region it was sent from, so every push received measures
//! send→push latency. With `--dev` the devices follow through every
//! region's edge and the senders send through every region's edge in turn,
//! all with tokens; latency is also reported per (sender region, device
//! region) pair — the cross-region push path. With `--ceiling` the same
//! devices and senders use a server with nothing behind its services
//! ([`crate::push_ceiling`]): the most this machine can push.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellmesh_proto::v1::sync_client::SyncClient;
use cellmesh_proto::v1::{
    ConversationKind, CreateConversationRequest, MessageType, SyncEventKind, sync_push,
};
use clap::Args;
use hdrhistogram::Histogram;
use rand::Rng;
use tonic::transport::Channel;

use crate::push_ceiling::CeilingServer;
use crate::{Report, authed, count_error, histogram, send_request};
use cellmesh_chaos::target::DevTarget;
use cellmesh_client::connect::{call_error, caller, connect};
use cellmesh_control_plane::migration::{MigrationOptions, Migrator};

#[derive(Args)]
pub struct PushArgs {
    /// gRPC endpoint of a standalone cell.
    #[arg(long, required_unless_present_any = ["dev", "ceiling"])]
    endpoint: Option<String>,
    /// Push through a server in this process that has nothing behind its
    /// gRPC services (the ceiling of a push on this machine; see
    /// `push_ceiling`) instead of a cell.
    #[arg(long, conflicts_with_all = ["endpoint", "dev"])]
    ceiling: bool,
    /// Drive a running `cellmesh dev` (its data dir) through its edges.
    #[arg(long, conflicts_with = "endpoint")]
    dev: Option<PathBuf>,
    /// Online devices (one user each).
    #[arg(long, default_value_t = 1_000)]
    devices: u64,
    /// Target sends per second.
    #[arg(long, default_value_t = 5_000)]
    rate: u64,
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Members of each group conversation.
    #[arg(long, default_value_t = 50)]
    group_size: u64,
    /// Share of sends that go to 1:1 conversations (the rest to groups).
    #[arg(long, default_value_t = 0.5)]
    direct_share: f64,
    /// Concurrent senders.
    #[arg(long, default_value_t = 64)]
    senders: usize,
    /// HTTP/2 connections shared by the devices' streams.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    #[arg(long)]
    json: Option<PathBuf>,
    /// Tenant to run in (default: a fresh one).
    #[arg(long)]
    tenant: Option<u64>,
    /// With `--dev`: move the bench's conversations to this cell (e.g.
    /// `us-east/c1`) while their members' homes stay on the tenant's cell,
    /// so every push crosses regions from the owner to the home cell.
    #[arg(long, requires = "dev")]
    conversations_on: Option<String>,
}

struct Conv {
    id: u64,
    members: Vec<u64>,
}

fn now_us(epoch: Instant) -> u64 {
    epoch.elapsed().as_micros() as u64
}

pub async fn run(args: PushArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.devices >= args.group_size.max(2),
        "need at least --group-size devices"
    );
    let dev = args
        .dev
        .as_deref()
        .map(DevTarget::load)
        .transpose()?
        .map(Arc::new);
    let ceiling = args.ceiling.then(CeilingServer::start).transpose()?;
    let (tenant, edges, base) = targets(&args, dev.as_deref(), ceiling.as_ref());
    anyhow::ensure!(!edges.is_empty(), "no edge to send through");
    let mut client = connect(&edges[0].1).await?;
    let users = Users {
        tenant,
        base,
        dev: dev.clone(),
    };
    let (directs, groups) = conversations(&mut client, &users, &args).await?;
    if let (Some(cell), Some(d)) = (&args.conversations_on, &dev) {
        let migrator = Migrator::new(d.routes().await?, d.secret(), MigrationOptions::default());
        for c in directs.iter().chain(groups.iter()) {
            migrator
                .migrate_conversation(TenantId(tenant), ConversationId(c.id), cell, |_| {})
                .await?;
        }
        println!(
            "moved {} conversations to {cell}",
            directs.len() + groups.len()
        );
    }
    println!(
        "{} devices, {} 1:1 and {} groups of {}; sending {}/s for {:?} through {}",
        args.devices,
        directs.len(),
        groups.len(),
        args.group_size,
        args.rate,
        args.duration,
        edges
            .iter()
            .map(|(r, _)| r.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );

    let epoch = Instant::now();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let receivers = subscribe_devices(
        &args,
        dev.as_deref(),
        (tenant, base),
        &edges,
        epoch,
        &stopped,
    )
    .await?;
    // Let the backlog of joins drain before measuring.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let mut clients = vec![client];
    for (_, endpoint) in &edges[1..] {
        clients.push(connect(endpoint).await?);
    }
    let started = Instant::now();
    let (acked, errors) = send_all(&args, clients, &users, (directs, groups), epoch).await?;
    let send_elapsed = started.elapsed();
    // Give in-flight pushes a moment, then stop the devices.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = stop.send(true);
    let (delivered, latency, pairs) = collect(receivers).await?;
    let mut report = Report::new("push", delivered, errors, send_elapsed, &latency)
        .param("devices", args.devices)
        .param("target_sends_per_s", args.rate)
        .param("sends_acked", acked)
        .param("sends_per_s", acked as f64 / send_elapsed.as_secs_f64())
        .param("group_size", args.group_size)
        .param("ceiling", ceiling.is_some())
        .param("direct_share", args.direct_share)
        .param(
            "conversations_on",
            args.conversations_on.clone().unwrap_or_default(),
        );
    if dev.is_some() {
        report = report.param("latency_ms_by_region_pair", by_region_pair(&pairs, &edges)?);
    }
    report.scenario = if ceiling.is_some() {
        "push-ceiling"
    } else {
        "push"
    }
    .into();
    println!("(acked = pushes delivered to devices; throughput = deliveries/s)");
    report.print();
    if let Some(path) = &args.json {
        report.write_json(path)?;
    }
    Ok(())
}

/// The tenant, the (region, edge) pairs to drive and the first user id:
/// the dev deployment's regions, or the one cell (or ceiling server).
fn targets(
    args: &PushArgs,
    dev: Option<&DevTarget>,
    ceiling: Option<&CeilingServer>,
) -> (u64, Vec<(String, String)>, u64) {
    match dev {
        Some(d) => (
            d.tenant,
            d.edge_by_region
                .iter()
                .map(|(r, e)| (r.clone(), e.clone()))
                .collect::<Vec<_>>(),
            DEV_USER_BASE,
        ),
        None => {
            let endpoint = match ceiling {
                Some(server) => server.endpoint.clone(),
                None => args.endpoint.clone().unwrap_or_default(),
            };
            let tenant = args
                .tenant
                .unwrap_or_else(|| rand::rng().random_range(1_000_000..u32::MAX as u64));
            (tenant, vec![("cell".to_string(), endpoint)], 0)
        }
    }
}

/// `--senders` senders spread over the edges' `clients`, writing at
/// `--rate` in all until `--duration` is over: the sends acked, and the
/// errors by code.
async fn send_all(
    args: &PushArgs,
    clients: Vec<crate::send::Client>,
    users: &Users,
    (directs, groups): (Vec<Conv>, Vec<Conv>),
    epoch: Instant,
) -> anyhow::Result<(u64, BTreeMap<String, u64>)> {
    let directs = Arc::new(directs);
    let groups = Arc::new(groups);
    let now = Instant::now();
    let deadline = now + args.duration;
    let mut senders = Vec::new();
    for (s, pace) in paces(args.rate, args.senders, now, deadline, epoch)
        .into_iter()
        .enumerate()
    {
        let region = s % clients.len();
        let (directs, groups) = (directs.clone(), groups.clone());
        let from = Sender {
            client: clients[region].clone(),
            users: users.clone(),
            index: s,
            region: region as u8,
        };
        let share = args.direct_share;
        senders.push(tokio::spawn(async move {
            send_loop(from, directs, groups, share, pace).await
        }));
    }
    let mut acked = 0;
    let mut errors = BTreeMap::new();
    for s in senders {
        let (ok, errs) = s.await?;
        acked += ok;
        for (code, n) in errs {
            *errors.entry(code).or_insert(0) += n;
        }
    }
    Ok((acked, errors))
}

type Receivers = Vec<tokio::task::JoinHandle<Received>>;
type Pairs = BTreeMap<(usize, usize), Histogram<u64>>;

/// Subscribes every bench device through the edges in turn, each stream
/// followed by a [`receive`] task until `stopped`.
async fn subscribe_devices(
    args: &PushArgs,
    dev: Option<&DevTarget>,
    (tenant, base): (u64, u64),
    edges: &[(String, String)],
    epoch: Instant,
    stopped: &tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Receivers> {
    // Each device streams through one edge: (channel, its region's index).
    let mut channels = Vec::new();
    for (region, (_, endpoint)) in edges.iter().enumerate() {
        for _ in 0..args.connections.max(1) {
            channels.push((
                Channel::from_shared(endpoint.clone())?.connect().await?,
                region,
            ));
        }
    }
    let mut receivers = Vec::new();
    for user in base + 1..=base + args.devices {
        let (channel, region) = channels[user as usize % channels.len()].clone();
        let mut sync = SyncClient::new(channel);
        let request = crate::device_subscription(tenant, user);
        let stream = sync
            .subscribe(authed(dev, user, request))
            .await
            .map_err(call_error)?
            .into_inner();
        receivers.push(tokio::spawn(receive(
            stream,
            region,
            edges.len(),
            epoch,
            stopped.clone(),
        )));
    }
    Ok(receivers)
}

/// Deliveries, their latency, and latency per (sender region, device
/// region), once every device has stopped.
async fn collect(receivers: Receivers) -> anyhow::Result<(u64, Histogram<u64>, Pairs)> {
    let mut latency = histogram();
    let mut pairs = Pairs::new();
    let mut delivered = 0;
    for r in receivers {
        if let Ok(received) = r.await {
            delivered += received.count;
            for &(from, us) in &received.samples {
                let us = u64::from(us).max(1);
                let _ = latency.record(us);
                let _ = pairs
                    .entry((usize::from(from), received.region))
                    .or_insert_with(histogram)
                    .record(us);
            }
        }
    }
    Ok((delivered, latency, pairs))
}

/// Prints and returns the latency of each (sender region, device region).
fn by_region_pair(pairs: &Pairs, edges: &[(String, String)]) -> anyhow::Result<serde_json::Value> {
    println!("send -> push latency by sender region -> device region (ms):");
    let mut by_pair = serde_json::Map::new();
    for ((from, to), h) in pairs {
        let l = crate::report::Latency::from_micros(h);
        let name = format!("{} -> {}", edges[*from].0, edges[*to].0);
        println!(
            "  {name:<24} p50 {:>7.2}  p95 {:>7.2}  p99 {:>7.2}  max {:>7.2}  ({} pushes)",
            l.p50,
            l.p95,
            l.p99,
            l.max,
            h.len()
        );
        let mut entry = serde_json::to_value(&l)?;
        entry["pushes"] = h.len().into();
        by_pair.insert(name, entry);
    }
    Ok(serde_json::Value::Object(by_pair))
}

/// Bench devices' users in a dev deployment start above this (clear of the
/// demo users and of `bench send`'s).
const DEV_USER_BASE: u64 = 200_000;

/// Who the bench acts as: users `base + 1 ..= base + devices` of `tenant`,
/// with tokens when driving a dev deployment.
#[derive(Clone)]
struct Users {
    tenant: u64,
    base: u64,
    dev: Option<Arc<DevTarget>>,
}

impl Users {
    fn request<T>(&self, user: u64, message: T) -> tonic::Request<T> {
        authed(self.dev.as_deref(), user, message)
    }
}

async fn conversations(
    client: &mut crate::send::Client,
    users: &Users,
    args: &PushArgs,
) -> anyhow::Result<(Vec<Conv>, Vec<Conv>)> {
    let base = users.base;
    let mut directs = Vec::new();
    for a in (base + 1..base + args.devices).step_by(2) {
        let id = create(client, users, a, ConversationKind::Direct, vec![a + 1]).await?;
        directs.push(Conv {
            id,
            members: vec![a, a + 1],
        });
    }
    let mut groups = Vec::new();
    let mut first = base + 1;
    while first + args.group_size - 1 <= base + args.devices {
        let members: Vec<u64> = (first..first + args.group_size).collect();
        let id = create(
            client,
            users,
            first,
            ConversationKind::Group,
            members[1..].to_vec(),
        )
        .await?;
        groups.push(Conv { id, members });
        first += args.group_size;
    }
    Ok((directs, groups))
}

async fn create(
    client: &mut crate::send::Client,
    users: &Users,
    creator: u64,
    kind: ConversationKind,
    members: Vec<u64>,
) -> anyhow::Result<u64> {
    let r = client
        .create_conversation(users.request(
            creator,
            CreateConversationRequest {
                caller: caller(users.tenant, creator),
                kind: kind as i32,
                title: String::new(),
                member_ids: members,
                client_req_id: String::new(),
            },
        ))
        .await
        .map_err(call_error)?
        .into_inner();
    Ok(r.conversation.map(|c| c.conversation_id).unwrap_or(0))
}

/// One sending task: its client (an edge of one region), who it acts as.
struct Sender {
    client: crate::send::Client,
    users: Users,
    index: usize,
    /// The index of the region whose edge it sends through.
    region: u8,
}

/// The paces of `senders` senders sending `rate` sends/s in all from
/// `now`: their first ticks spread evenly over one period, since senders
/// that ticked in step would send in bursts of `senders` at once.
fn paces(rate: u64, senders: usize, now: Instant, deadline: Instant, epoch: Instant) -> Vec<Pace> {
    let count = senders.max(1);
    let per_sender = (rate as f64 / count as f64).max(0.001);
    let every = Duration::from_secs_f64(1.0 / per_sender);
    (0..count)
        .map(|s| Pace {
            every,
            first: now + every.mul_f64(s as f64 / count as f64),
            deadline,
            epoch,
        })
        .collect()
}

/// A sending task's pace: one send `every` from `first` until the
/// deadline.
struct Pace {
    every: Duration,
    first: Instant,
    deadline: Instant,
    epoch: Instant,
}

async fn send_loop(
    mut from: Sender,
    directs: Arc<Vec<Conv>>,
    groups: Arc<Vec<Conv>>,
    direct_share: f64,
    pace: Pace,
) -> (u64, BTreeMap<String, u64>) {
    // Request ids unique across runs (a dev tenant outlives a run).
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut tick = tokio::time::interval_at(pace.first.into(), pace.every);
    let (mut ok, mut errors, mut n) = (0, BTreeMap::new(), 0u64);
    while Instant::now() < pace.deadline {
        tick.tick().await;
        let (conv, user) = {
            let mut rng = rand::rng();
            let pool =
                if groups.is_empty() || (!directs.is_empty() && rng.random_bool(direct_share)) {
                    &directs
                } else {
                    &groups
                };
            let c = &pool[rng.random_range(0..pool.len())];
            (c.id, c.members[rng.random_range(0..c.members.len())])
        };
        n += 1;
        // The send time, then the sender's region.
        let mut body = now_us(pace.epoch).to_be_bytes().to_vec();
        body.push(from.region);
        let id = format!("p{run}-{}-{n}", from.index);
        let tenant = from.users.tenant;
        let request = send_request(tenant, user, conv, id, MessageType::Custom, body);
        match from.client.send(from.users.request(user, request)).await {
            Ok(_) => ok += 1,
            Err(status) => count_error(&mut errors, &status),
        }
    }
    (ok, errors)
}

/// What one device received: its region, and each push's latency (µs)
/// with its sender's region. Kept as plain samples (a histogram per device
/// would be 170 KB, and recording into 10,000 of them is a cache miss per
/// push on the load generator's cores).
struct Received {
    region: usize,
    count: u64,
    samples: Vec<(u8, u32)>,
}

async fn receive(
    mut stream: tonic::Streaming<cellmesh_proto::v1::SyncPush>,
    region: usize,
    regions: usize,
    epoch: Instant,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Received {
    let mut received = Received {
        region,
        count: 0,
        samples: Vec::new(),
    };
    let stopped = stop.changed();
    tokio::pin!(stopped);
    loop {
        let push = tokio::select! {
            // In order: no random draw per push on the load generator.
            biased;
            _ = &mut stopped => break,
            push = stream.message() => push,
        };
        let Ok(Some(push)) = push else {
            break;
        };
        if let Some(sync_push::Push::Event(e)) = push.push
            && e.kind == SyncEventKind::Message as i32
            && let Some(m) = e.message
            && m.body.len() == 9
            && let Ok(sent) = <[u8; 8]>::try_from(&m.body[..8])
        {
            received.count += 1;
            let from = m.body[8].min(regions.saturating_sub(1) as u8);
            let latency = now_us(epoch).saturating_sub(u64::from_be_bytes(sent));
            received
                .samples
                .push((from, u32::try_from(latency).unwrap_or(u32::MAX)));
        }
    }
    received
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn senders_start_spread_over_one_period_at_the_rate_asked() {
        let now = Instant::now();
        let paces = paces(3_200, 64, now, now + Duration::from_secs(1), now);
        assert_eq!(paces.len(), 64);
        // 50 sends/s each: one every 20 ms.
        let every = paces[0].every;
        assert_eq!(every, Duration::from_millis(20));
        let mut offsets: Vec<Duration> = paces.iter().map(|p| p.first - now).collect();
        offsets.dedup();
        assert_eq!(offsets.len(), 64, "no two senders tick together");
        for pair in offsets.windows(2) {
            let gap = pair[1] - pair[0];
            assert!(
                gap.abs_diff(every / 64) < Duration::from_micros(2),
                "{gap:?}"
            );
        }
        assert!(offsets[63] < every);
    }
}
