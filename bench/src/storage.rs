//! `cellmesh bench storage`: the ceiling of a send on this machine. N
//! writers commit exactly the records a send writes (message, conversation
//! seq, request id, read position, outbox event) through the cell's own
//! store — same column families, options, group commit and fsync — and
//! then the records its fan-out writes (one sync event and one
//! conversation-list entry per member, and the queue position) through the
//! fan-out lane, with no gRPC, no queue reads and no processor. What a send
//! benchmark reaches is best read as a share of this.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellmesh_cell::UserKey;
use cellmesh_cell::queue::embedded::OUTBOX_PARTITION;
use cellmesh_cell::storage::{IdemKey, IdemKind, Mutation, Store};
use cellmesh_proto::storage::v1::{
    ConvListEntry, ConversationSeq, IdempotencyRecord, MessageRecord, OutboxEvent, OutboxKind,
    SyncRecord,
};
use cellmesh_proto::v1::{MessageState, MessageType, SyncEventKind};
use clap::Args;
use hdrhistogram::Histogram;

use crate::Report;

#[derive(Args)]
pub struct StorageArgs {
    /// Concurrent writers (as `bench send --concurrency`).
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// How long to write, e.g. `30s`.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Conversations the writes go to.
    #[arg(long, default_value_t = 256)]
    conversations: u64,
    /// Members per conversation: the sync events and list entries per send.
    #[arg(long, default_value_t = 8)]
    members: u64,
    #[arg(long, default_value_t = 200)]
    body_bytes: usize,
    /// Where the database goes (default: a temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Write the figures here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

const TENANT: u64 = 1;
const GROUP: &str = "processor";

pub async fn run(args: StorageArgs) -> anyhow::Result<()> {
    let temp = tempfile::tempdir()?;
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| temp.path().to_path_buf());
    let config = cellmesh_cell::CellConfig::default();
    let store = Store::open(&dir.join("db"), &config.storage)?;
    println!(
        "writing a send and its fan-out ({} members) from {} writers for {:?}, fsync {}",
        args.members,
        args.concurrency,
        args.duration,
        if config.storage.sync_wal { "on" } else { "off" }
    );
    let start = Instant::now();
    let deadline = start + args.duration;
    let mut writers = Vec::new();
    for w in 0..args.concurrency {
        let (store, args) = (store.clone(), Load::of(&args));
        writers.push(tokio::spawn(async move {
            writer(store, w as u64, args, deadline).await
        }));
    }
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut acked = 0;
    for w in writers {
        let (n, h) = w.await??;
        acked += n;
        latency.add(&h)?;
    }
    let elapsed = start.elapsed();
    let stats = store.stats();
    let batches = stats.batches.load(std::sync::atomic::Ordering::Relaxed);
    let report = Report::new("storage", acked, BTreeMap::new(), elapsed, &latency)
        .param("concurrency", args.concurrency)
        .param("conversations", args.conversations)
        .param("members", args.members)
        .param("body_bytes", args.body_bytes)
        .param("write_batches", batches)
        .param(
            "keys_per_send",
            stats.keys.load(std::sync::atomic::Ordering::Relaxed) as f64 / acked.max(1) as f64,
        );
    report.print();
    if let Some(path) = &args.json {
        report.write_json(path)?;
    }
    store.close();
    Ok(())
}

#[derive(Clone, Copy)]
struct Load {
    conversations: u64,
    members: u64,
    body_bytes: usize,
}

impl Load {
    fn of(args: &StorageArgs) -> Self {
        Self {
            conversations: args.conversations.max(1),
            members: args.members.max(1),
            body_bytes: args.body_bytes,
        }
    }
}

/// Writes sends and their fan-outs until `deadline`: how many, and the
/// latency of each (both commits).
async fn writer(
    store: Arc<Store>,
    w: u64,
    load: Load,
    deadline: Instant,
) -> anyhow::Result<(u64, Histogram<u64>)> {
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut n = 0u64;
    // Each writer owns its conversations' seqs (as the cell's per
    // conversation lock makes one sender at a time).
    let mut seqs = BTreeMap::new();
    let body = vec![b'x'; load.body_bytes];
    while Instant::now() < deadline {
        n += 1;
        let conversation = 1 + (w + n * 64) % load.conversations;
        let seq = seqs.entry(conversation).or_insert(0u64);
        *seq += 1;
        let seq = *seq + w * 1_000_000_000;
        let sender = conversation * 100 + n % load.members;
        let started = Instant::now();
        store
            .commit(send(conversation, seq, sender, w, n, &body))
            .await?;
        store
            .commit_fan_out(fan_out(conversation, seq, load.members, n))
            .await?;
        latency.record(started.elapsed().as_micros().max(1) as u64)?;
    }
    Ok((n, latency))
}

/// The records of one send, as `message::send` writes them.
fn send(conversation: u64, seq: u64, sender: u64, w: u64, n: u64, body: &[u8]) -> Mutation {
    let now = now_ms();
    let msg_id = (now << 20) | (w << 10) | (n & 1023);
    let request = format!("w{w}-{n}");
    let mut m = Mutation::new();
    m.put_message(
        ConversationId(conversation),
        seq,
        &MessageRecord {
            msg_id,
            sender_id: sender,
            r#type: MessageType::Text as i32,
            body: body.to_vec(),
            server_ts_ms: now,
            state: MessageState::Normal as i32,
            client_req_id: request.clone(),
            ..Default::default()
        },
    );
    m.put_conv_seq(
        ConversationId(conversation),
        &ConversationSeq {
            latest_seq: seq,
            ..Default::default()
        },
    );
    let key = IdemKey {
        tenant: TenantId(TENANT),
        user: UserId(sender),
        kind: IdemKind::Send,
        client_req_id: request.clone(),
    };
    m.put_idempotency(
        &key,
        &IdempotencyRecord {
            conversation_id: conversation,
            msg_id,
            seq,
            server_ts_ms: now,
            expires_at_ms: now + 86_400_000,
        },
    );
    m.raise_read_seq(ConversationId(conversation), UserId(sender), seq);
    m.emit(&OutboxEvent {
        kind: OutboxKind::Message as i32,
        tenant_id: TENANT,
        conversation_id: conversation,
        seq,
        msg_id,
        user_id: sender,
        server_ts_ms: now,
        client_req_id: request,
        ..Default::default()
    });
    m
}

/// The records the processor writes for one send into a group of
/// `members`: a sync event and a list entry each, and the queue position.
fn fan_out(conversation: u64, seq: u64, members: u64, n: u64) -> Mutation {
    let now = now_ms();
    let mut m = Mutation::new();
    for member in 0..members {
        let user = UserKey::new(TenantId(TENANT), UserId(conversation * 100 + member));
        let pts = seq;
        m.put_sync(
            user,
            pts,
            &SyncRecord {
                kind: SyncEventKind::Message as i32,
                conversation_id: conversation,
                seq,
                server_ts_ms: now,
                ..Default::default()
            },
        );
        m.put_conv_list(
            user,
            ConversationId(conversation),
            &ConvListEntry {
                last_seq: seq,
                updated_at_ms: now,
                last_message_pts: pts,
                last_event_id: n,
                ..Default::default()
            },
        );
    }
    m.put_queue_offset(GROUP, OUTBOX_PARTITION, n);
    m
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
