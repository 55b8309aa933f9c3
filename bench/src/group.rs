//! `cellmesh bench group`: one group of `--members` (100,000) on a cell,
//! `--online` (1,000) of them subscribed. It reports:
//! - how long adding the members took (1,000 per `AddMembers`), and a
//!   burst of single joins: how long, and how many `MembersChanged`
//!   events it was merged into (a cell of its own only);
//! - send latency into the group at `--rate`, and the latency of the
//!   `latest_seq` hints its online members receive (send → the first hint
//!   on a device whose `latest_seq` covers it: hints are merged);
//! - `ListConversations` latency (first screen of 100) for a member of
//!   `--member-of` (500) more groups, each summary's unread count checked
//!   against the conversation's own (`GetConversation`), and nonzero: the
//!   member has read nothing;
//! - the p99 of sends into `--neighbours` 1:1 conversations on the same
//!   cell while the group is quiet and while it is hot, in turns of two
//!   seconds (see [`crate::paced`]), over all of them and as the median
//!   of each window's p99 (a stall of the machine's disk then decides one
//!   window, not the run);
//! - `ReadCount` latency for the group's newest ten messages while members
//!   mark them read one by one, each count checked against the readers so
//!   far, out of every member (and the first call's alone: it walks the
//!   group);
//! - the first screen: 16 members at a time pulling the group's newest 50
//!   messages (kept in memory), beside the same for a 1:1 neighbour (read
//!   from storage); see [`crate::first_screen`].
//!
//! Without `--endpoint` it starts its own cell in a temporary directory, on
//! a tokio runtime of its own (the bench's 1,000 devices stand for remote
//! clients: they do not run on the cell's workers).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellmesh_client::connect::{call_error, caller, connect};
use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::v1::sync_client::SyncClient;
use cellmesh_proto::v1::{
    ChangeMembersRequest, GetConversationRequest, ListConversationsRequest, MarkReadRequest,
    MessageType, ReadCountRequest, sync_push,
};
use clap::Args;
use hdrhistogram::Histogram;
use rand::Rng;
use tonic::transport::Channel;

use crate::first_screen;
use crate::paced::{Pace, Windows, send_paced};
use crate::send::Client;
use crate::{Create, Report, create, device_subscription, histogram, send_request};

#[derive(Args)]
pub struct GroupArgs {
    /// gRPC endpoint of a standalone cell (default: a cell of its own).
    #[arg(long)]
    endpoint: Option<String>,
    #[arg(long, default_value_t = 100_000)]
    members: u64,
    /// Members subscribed (users 1..=online).
    #[arg(long, default_value_t = 1_000)]
    online: u64,
    /// Sends per second into the group.
    #[arg(long, default_value_t = 20)]
    rate: u64,
    /// How long the group is hot in all, in turns of two seconds with as
    /// long quiet (the neighbours send throughout).
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Groups the listing member belongs to.
    #[arg(long, default_value_t = 500)]
    member_of: u64,
    /// 1:1 conversations on the same cell.
    #[arg(long, default_value_t = 32)]
    neighbours: u64,
    /// Sends per second into them.
    #[arg(long, default_value_t = 500)]
    neighbour_rate: u64,
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Users above the group's members: the listing member's partners and the
/// neighbours' pairs.
const OTHERS: u64 = 10_000_000;
/// The group's creator, who also lists conversations.
const CREATOR: UserId = UserId(1);
const ADD_PER_CALL: u64 = 1_000;

pub async fn run(args: GroupArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.members > JOINS + 2 && args.online <= args.members - JOINS,
        "--members above {JOINS} + 2, --online at most --members - {JOINS}"
    );
    let temp = tempfile::tempdir()?;
    let (endpoint, _cell) = match &args.endpoint {
        Some(e) => (e.clone(), None),
        None => {
            let config = crate::unlimited_cell(temp.path().to_path_buf());
            let cell = crate::CellApart::start(config).await?;
            (format!("http://{}", cell.addr), Some(cell))
        }
    };
    let tenant = TenantId(rand::rng().random_range(1_000_000..u32::MAX as u64));
    let mut client = connect(&endpoint).await?;
    let started = Instant::now();
    // The last JOINS members join one by one below.
    let group = big_group(&mut client, tenant, args.members - JOINS).await?;
    let joined = started.elapsed();
    println!(
        "group {group}: {} members added in {:.1} s",
        args.members - JOINS,
        joined.as_secs_f64()
    );
    let (burst, burst_took, burst_events) = join_burst(
        &client,
        tenant,
        group,
        args.members,
        args.endpoint.is_none(),
    )
    .await?;
    listing_member(&mut client, tenant, args.member_of).await?;
    let neighbours = neighbours(&mut client, tenant, args.neighbours).await?;

    let epoch = Instant::now();
    let hints = Arc::new(Mutex::new(Vec::new()));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let far = far_devices()?;
    let devices = {
        let (endpoint, hints, stopped) = (endpoint.clone(), hints.clone(), stopped.clone());
        far.spawn(async move {
            subscribe(
                &endpoint,
                tenant,
                args.online,
                group,
                epoch,
                &hints,
                &stopped,
            )
            .await
        })
        .await??
    };
    tokio::time::sleep(Duration::from_secs(1)).await;

    let (turns, g) = in_turns(&client, tenant, &neighbours, group, &args, epoch).await?;
    let (sent, sent_at, errors) = (g.latency, g.starts, g.errors);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = stop.send(true);
    for d in devices {
        let _ = d.await;
    }
    far.shutdown_background();
    let hint_latency = hint_latency(&hints.lock().expect("hints"), &sent_at)?;
    let (list, mismatches) = list_latency(&endpoint, &mut client, tenant).await?;
    let (receipts, first_receipt, wrong_receipts) =
        receipt_latency(&mut client, tenant, group, &sent_at, args.members).await?;
    let hot = (group, args.members, sent_at.keys().max().copied());
    let screens = first_screen::measure(&client, tenant, hot, neighbours[0]).await?;

    let p99 = |h: &Histogram<u64>| ms(h, 0.99);
    let report = Report::new(
        "group",
        hint_latency.len(),
        errors,
        args.duration,
        &hint_latency,
    )
    .param(
        "latency_is",
        "send → the first latest_seq hint covering it on an online member's device",
    )
    .param("members", args.members)
    .param("online", args.online)
    .param("members_added_s", joined.as_secs_f64())
    .param("join_burst", JOINS)
    .param("join_burst_s", burst_took.as_secs_f64())
    .param("join_p99_ms", p99(&burst))
    .param("join_burst_events", burst_events)
    .param("group_sends", sent_at.len())
    .param("group_send_p50_ms", ms(&sent, 0.5))
    .param("group_send_p99_ms", p99(&sent))
    .param("hints_expected", sent_at.len() as u64 * args.online)
    .param("list_conversations_p50_ms", ms(&list, 0.5))
    .param("list_conversations_p99_ms", p99(&list))
    .param("member_of", args.member_of + 1)
    .param("unread_mismatches", mismatches)
    .param("read_count_p50_ms", ms(&receipts, 0.5))
    .param("read_count_p99_ms", p99(&receipts))
    .param("read_count_first_ms", first_receipt.as_secs_f64() * 1000.0)
    .param("read_count_mismatches", wrong_receipts);
    let report = turns.params(screens.params(report));
    report.print();
    if let Some(path) = &args.json {
        report.write_json(path)?;
    }
    anyhow::ensure!(
        mismatches == 0 && wrong_receipts == 0,
        "{mismatches} unread counts and {wrong_receipts} read counts were wrong"
    );
    Ok(())
}

/// Adds `users` to `group` as its creator.
fn add(tenant: TenantId, group: ConversationId, users: Vec<u64>) -> ChangeMembersRequest {
    ChangeMembersRequest {
        caller: caller(tenant.get(), CREATOR.get()),
        conversation_id: group.get(),
        user_ids: users,
    }
}

/// A group of the creator with users 2..=members, added 1,000 per call.
async fn big_group(
    client: &mut Client,
    tenant: TenantId,
    members: u64,
) -> anyhow::Result<ConversationId> {
    let hot = Create::group(vec![2], "hot group".into());
    let group = create(client, tenant, CREATOR, hot).await?;
    let mut next = 3;
    while next <= members {
        let upto = (next + ADD_PER_CALL - 1).min(members);
        let users = (next..=upto).collect();
        client
            .add_members(add(tenant, group, users))
            .await
            .map_err(call_error)?;
        next = upto + 1;
    }
    Ok(group)
}

/// The neighbours send throughout `2 × --duration`, the group only in
/// every other window: the neighbours' latencies while the group is quiet
/// and while it is hot, and what the group's sends saw.
async fn in_turns(
    client: &Client,
    tenant: TenantId,
    neighbours: &[(ConversationId, UserId)],
    group: ConversationId,
    args: &GroupArgs,
    epoch: Instant,
) -> anyhow::Result<(Turns, crate::paced::Sent)> {
    let windows = Windows {
        from_us: epoch.elapsed().as_micros() as u64,
        each: WINDOW,
    };
    let pace = |rate: u64, only| Pace {
        every: Duration::from_secs_f64(1.0 / rate.max(1) as f64),
        duration: args.duration * 2,
        epoch,
        only,
    };
    let throughout = send_paced(client, tenant, neighbours, pace(args.neighbour_rate, None));
    // User 2 sends: user 1, who lists, has every one unread.
    let into_group = [(group, UserId(2))];
    let group_sends = send_paced(client, tenant, &into_group, pace(args.rate, Some(windows)));
    let (throughout, into_group) = tokio::try_join!(throughout, group_sends)?;
    let (alone, beside) = windows.split(&throughout.samples)?;
    let medians = windows.median_of_windows(&throughout.samples, 0.99)?;
    Ok((
        Turns {
            alone,
            beside,
            medians,
        },
        into_group,
    ))
}

/// The neighbours' latencies in the quiet windows and in the hot ones,
/// and the median over windows of each window's p99 (quiet, hot).
struct Turns {
    alone: Histogram<u64>,
    beside: Histogram<u64>,
    medians: (f64, f64),
}

impl Turns {
    fn params(&self, report: Report) -> Report {
        let p99 = |h: &Histogram<u64>| ms(h, 0.99);
        report
            .param("neighbour_p99_ms_alone", p99(&self.alone))
            .param("neighbour_p99_ms_beside_the_group", p99(&self.beside))
            .param("neighbour_p99_ms_alone_median_of_windows", self.medians.0)
            .param("neighbour_p99_ms_beside_median_of_windows", self.medians.1)
            .param("neighbour_sends_beside", self.beside.len())
            .param("neighbour_sends_alone", self.alone.len())
            .param("hot_and_quiet_windows_s", WINDOW.as_secs_f64())
    }
}

/// How long the group is hot, then quiet, in turns, while the
/// neighbours send.
const WINDOW: Duration = Duration::from_secs(2);

/// Joins in the burst.
const JOINS: u64 = 1_000;

/// The last `JOINS` of `members` join `group` one per call, 64 calls at
/// a time: each call's latency (µs), the burst's length and, in a cell of
/// this process (`own_cell`), the `MembersChanged` events it was merged
/// into.
async fn join_burst(
    client: &Client,
    tenant: TenantId,
    group: ConversationId,
    members: u64,
    own_cell: bool,
) -> anyhow::Result<(Histogram<u64>, Duration, Option<u64>)> {
    let events = || cellmesh_cell::metrics::metrics().member_change_events.get();
    let events_before = events();
    let mut latency = histogram();
    let started = Instant::now();
    let mut joins = tokio::task::JoinSet::new();
    for user in members - JOINS + 1..=members {
        if joins.len() >= 64
            && let Some(done) = joins.join_next().await
        {
            latency.record(done??)?;
        }
        let mut c = client.clone();
        joins.spawn(async move {
            let at = Instant::now();
            c.add_members(add(tenant, group, vec![user]))
                .await
                .map_err(call_error)?;
            anyhow::Ok((at.elapsed().as_micros() as u64).max(1))
        });
    }
    while let Some(done) = joins.join_next().await {
        latency.record(done??)?;
    }
    let took = started.elapsed();
    let merged = own_cell.then(|| events() - events_before);
    println!(
        "a burst of {JOINS} joins, one user each, 64 at a time: {:.2} s, p99 {:.1} ms, {} MembersChanged events",
        took.as_secs_f64(),
        ms(&latency, 0.99),
        merged.map_or("?".to_string(), |e| e.to_string())
    );
    Ok((latency, took, merged))
}

/// The creator in `n` more groups of three, each with one message from
/// another member: the creator's unread is 1 in each.
async fn listing_member(client: &mut Client, tenant: TenantId, n: u64) -> anyhow::Result<()> {
    for i in 0..n {
        let other = OTHERS + 2 * i;
        let group = Create::group(vec![other, other + 1], format!("g{i}"));
        let id = create(client, tenant, CREATOR, group).await?;
        let req = send_request(
            tenant.get(),
            other,
            id.get(),
            format!("g{i}-1"),
            MessageType::Text,
            b"hi".to_vec(),
        );
        client.send(req).await.map_err(call_error)?;
    }
    Ok(())
}

/// `n` 1:1 conversations of users no group holds: (conversation, sender).
async fn neighbours(
    client: &mut Client,
    tenant: TenantId,
    n: u64,
) -> anyhow::Result<Vec<(ConversationId, UserId)>> {
    let mut out = Vec::new();
    for i in 0..n {
        let user = UserId(OTHERS * 2 + 2 * i);
        let direct = Create::direct(UserId(user.get() + 1), format!("n{i}"));
        out.push((create(client, tenant, user, direct).await?, user));
    }
    Ok(out)
}

/// A runtime for the online devices, which stand for clients on other
/// machines: one worker at the lowest OS priority, so that decoding their
/// pushes takes only cores nothing else wants (the cell and the measured
/// senders go first).
fn far_devices() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("far-devices")
        .on_thread_start(|| {
            // SAFETY: setpriority on this thread's own id; no memory is shared.
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
            }
        })
        .enable_all()
        .build()?)
}

/// (device, latest_seq, µs since the epoch) of every hint received.
type Hints = Arc<Mutex<Vec<(u64, u64, u64)>>>;

/// Users 1..=online subscribed; each records the hints of `group`.
async fn subscribe(
    endpoint: &str,
    tenant: TenantId,
    online: u64,
    group: ConversationId,
    epoch: Instant,
    hints: &Hints,
    stopped: &tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut channels = Vec::new();
    for _ in 0..8 {
        channels.push(
            Channel::from_shared(endpoint.to_string())?
                .connect()
                .await?,
        );
    }
    let mut tasks = Vec::new();
    for user in 1..=online {
        let mut sync = SyncClient::new(channels[user as usize % channels.len()].clone());
        let mut stream = sync
            .subscribe(device_subscription(tenant.get(), user))
            .await
            .map_err(call_error)?
            .into_inner();
        let (hints, mut stop) = (hints.clone(), stopped.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let push = tokio::select! {
                    _ = stop.changed() => return,
                    push = stream.message() => push,
                };
                let Ok(Some(push)) = push else { return };
                if let Some(sync_push::Push::Hint(h)) = push.push
                    && h.conversation_id == group.get()
                {
                    let at = epoch.elapsed().as_micros() as u64;
                    hints.lock().expect("hints").push((user, h.latest_seq, at));
                }
            }
        }));
    }
    Ok(tasks)
}

/// Send → hint latency (µs) of every hint of an acknowledged send.
fn hint_latency(
    hints: &[(u64, u64, u64)],
    sent: &HashMap<u64, u64>,
) -> anyhow::Result<Histogram<u64>> {
    let mut h = histogram();
    let mut seqs: Vec<u64> = sent.keys().copied().collect();
    seqs.sort_unstable();
    let mut covered: HashMap<u64, u64> = HashMap::new();
    // A hint covers every send up to its latest_seq (hints are merged):
    // each send's latency on a device is to the first hint covering it.
    for (device, latest, at) in hints {
        let below = covered.entry(*device).or_default();
        if *latest <= *below {
            continue;
        }
        let from = seqs.partition_point(|s| s <= below);
        let to = seqs.partition_point(|s| s <= latest);
        for seq in &seqs[from..to] {
            h.record(at.saturating_sub(sent[seq]).max(1))?;
        }
        *below = *latest;
    }
    Ok(h)
}

/// `ListConversations` (first screen of 100) as the creator, 200 times:
/// latency (µs), and how many summaries of the last listing disagreed with
/// the conversation's own unread count (`GetConversation`) or had none
/// (the creator has read nothing another member sent).
async fn list_latency(
    endpoint: &str,
    client: &mut Client,
    tenant: TenantId,
) -> anyhow::Result<(Histogram<u64>, u64)> {
    let caller = || caller(tenant.get(), CREATOR.get());
    let mut sync = SyncClient::new(
        Channel::from_shared(endpoint.to_string())?
            .connect()
            .await?,
    );
    let mut h = histogram();
    let request = || ListConversationsRequest {
        caller: caller(),
        limit: 100,
        ids_only: false,
    };
    let mut last = Vec::new();
    for _ in 0..200 {
        let at = Instant::now();
        last = sync
            .list_conversations(request())
            .await
            .map_err(call_error)?
            .into_inner()
            .conversations;
        h.record((at.elapsed().as_micros() as u64).max(1))?;
    }
    let mut wrong = 0;
    for summary in &last {
        let id = summary
            .conversation
            .as_ref()
            .map_or(0, |c| c.conversation_id);
        let own = client
            .get_conversation(GetConversationRequest {
                caller: caller(),
                conversation_id: id,
                members_after: 0,
                member_limit: 1,
            })
            .await
            .map_err(call_error)?
            .into_inner();
        if own.unread != summary.unread || summary.unread == 0 {
            wrong += 1;
        }
    }
    Ok((h, wrong))
}

/// A quantile of `h` (µs) in ms.
pub(crate) fn ms(h: &Histogram<u64>, quantile: f64) -> f64 {
    h.value_at_quantile(quantile) as f64 / 1000.0
}

/// `ReadCount` for the newest ten of `sent` (seqs sent by one member, read
/// by nobody else) 100 times, one more member marking them all read before
/// each but the first: the latency, the first call's (it walks the group),
/// and how many answers were not the expected readers out of `members`.
async fn receipt_latency(
    client: &mut Client,
    tenant: TenantId,
    group: ConversationId,
    sent: &HashMap<u64, u64>,
    members: u64,
) -> anyhow::Result<(Histogram<u64>, Duration, u64)> {
    let mut seqs: Vec<u64> = sent.keys().copied().collect();
    seqs.sort_unstable();
    seqs.drain(..seqs.len().saturating_sub(10));
    let newest = seqs.last().copied().unwrap_or(0);
    let mut h = histogram();
    let mut first = Duration::ZERO;
    let mut wrong = 0;
    for readers in 1..=100u32 {
        if readers > 1 {
            // Members 3, 4, … (2 sent them) read everything.
            let reader = u64::from(readers) + 1;
            client
                .mark_read(MarkReadRequest {
                    caller: caller(tenant.get(), reader),
                    conversation_id: group.get(),
                    read_seq: newest,
                })
                .await
                .map_err(call_error)?;
        }
        let at = Instant::now();
        let counts = client
            .read_count(ReadCountRequest {
                caller: caller(tenant.get(), CREATOR.get()),
                conversation_id: group.get(),
                seqs: seqs.clone(),
            })
            .await
            .map_err(call_error)?
            .into_inner();
        let took = at.elapsed();
        h.record((took.as_micros() as u64).max(1))?;
        if readers == 1 {
            first = took;
        }
        if u64::from(counts.member_count) != members || counts.read.iter().any(|r| *r != readers) {
            wrong += 1;
        }
    }
    Ok((h, first, wrong))
}
