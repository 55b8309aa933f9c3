//! `cellmesh bench backup`: a cell it starts is filled with `--history-mb`
//! of messages; then, while senders keep a steady `--send-rate`, a backup
//! is taken (MB/s, and send latency during it against the same load with
//! no backup); `--incremental-pct` more history and a second backup (what
//! it uploaded, how long it took); and a restore into a new data dir
//! (MB/s). Backups go to a directory beside the cell's data, or an S3
//! bucket with `--s3-endpoint`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cellmesh_cell::backup::{BackupConfig, Backups, restore};
use cellmesh_cell::cold::TierStore;
use cellmesh_proto::v1::MessageType;
use clap::Args;
use hdrhistogram::Histogram;

use crate::{Report, count_error, send_request};
use cellmesh_client::connect::connect;

#[derive(Args)]
pub struct BackupArgs {
    /// History to fill the cell with before the first backup.
    #[arg(long, default_value_t = 200)]
    history_mb: u64,
    /// Bytes of each message body.
    #[arg(long, default_value_t = 1024)]
    body_bytes: usize,
    #[arg(long, default_value_t = 500)]
    conversations: u64,
    /// Sends per second while latency is measured (with and without a
    /// backup running).
    #[arg(long, default_value_t = 1000)]
    send_rate: u64,
    /// The backup's throttle (`backup.rate_bytes_per_sec`), MiB/s; 0: none.
    #[arg(long, default_value_t = 64)]
    rate_mb: u64,
    /// New history before the second backup, as a share of the first's.
    #[arg(long, default_value_t = 1.0)]
    incremental_pct: f64,
    #[arg(long)]
    s3_endpoint: Option<String>,
    #[arg(long, default_value = "cellmesh-bench")]
    s3_bucket: String,
    #[arg(long)]
    json: Option<PathBuf>,
}

const TENANT: u64 = 1;
const MB: f64 = 1024.0 * 1024.0;

fn backup_config(args: &BackupArgs, dir: &std::path::Path) -> BackupConfig {
    let mut config = BackupConfig {
        local_dir: dir.join("backups"),
        rate_bytes_per_sec: args.rate_mb << 20,
        ..Default::default()
    };
    if let Some(endpoint) = &args.s3_endpoint {
        config.store = TierStore::S3;
        config.s3 = crate::s3_bucket(endpoint, &args.s3_bucket);
        config.s3.prefix = format!("bench-{}", rand::random::<u32>());
    }
    config
}

pub async fn run(args: BackupArgs) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut config = crate::unlimited_cell(dir.path().join("cell"));
    config.tiering.enabled = false;
    config.backup = backup_config(&args, dir.path());
    let cell = crate::own_cell(config.clone()).await?;
    let endpoint = format!("http://{}", cell.addr);
    let conversations = crate::create_groups(&endpoint, TENANT, args.conversations).await?;
    let per_message = args.body_bytes as u64 + 64;
    let messages = (args.history_mb << 20) / per_message;
    let filled = fill(&endpoint, &conversations, messages, args.body_bytes, 0).await?;
    println!(
        "filled {messages} messages in {:.1} s",
        filled.as_secs_f64()
    );
    let store = cell.service.store().clone();
    store.compact();
    let db_bytes = crate::du(&config.data_dir.join("db"));
    let backups = Backups::open(&config.backup, &config.cell_id, &config.data_dir)?;

    let (_, idle_took, idle, _, _) = under_load(&endpoint, &conversations, &args, None).await?;
    let idle_p99 = idle.value_at_quantile(0.99) as f64 / 1000.0;
    let (first, took, during, acked, errors) =
        under_load(&endpoint, &conversations, &args, Some((&backups, &store))).await?;
    let first = first.expect("a backup");
    let backup_mb_s = first.uploaded_bytes as f64 / MB / took.as_secs_f64();
    println!(
        "backup: {} files, {:.1} MB in {:.1} s ({backup_mb_s:.1} MB/s); send p99 {:.2} ms during it, {idle_p99:.2} ms without ({:.0} s)",
        first.files.len(),
        first.uploaded_bytes as f64 / MB,
        took.as_secs_f64(),
        during.value_at_quantile(0.99) as f64 / 1000.0,
        idle_took.as_secs_f64()
    );

    let more = ((messages as f64) * args.incremental_pct / 100.0).ceil() as u64;
    fill(&endpoint, &conversations, more, args.body_bytes, messages).await?;
    let started = Instant::now();
    let second = backups.create(&store, 0, 0, now_ms()).await?;
    let incremental = started.elapsed();
    println!(
        "incremental after {more} more messages: {} of {} files, {:.1} MB uploaded in {:.2} s",
        second.uploaded_files,
        second.files.len(),
        second.uploaded_bytes as f64 / MB,
        incremental.as_secs_f64()
    );
    cell.shutdown().await?;

    let mut into = config.clone();
    into.data_dir = dir.path().join("restored");
    let started = Instant::now();
    let restored = restore::restore(&into, &config.cell_id, "", None, now_ms()).await?;
    let restore_took = started.elapsed();
    let restore_mb_s = restored.bytes as f64 / MB / restore_took.as_secs_f64();
    println!(
        "restore: {:.1} MB in {:.1} s ({restore_mb_s:.1} MB/s)",
        restored.bytes as f64 / MB,
        restore_took.as_secs_f64()
    );

    let report = Report::new("backup", acked, errors, took, &during)
        .param("history_mb", args.history_mb)
        .param("messages", messages)
        .param("db_bytes", db_bytes)
        .param(
            "store",
            if args.s3_endpoint.is_some() {
                "s3"
            } else {
                "local"
            },
        )
        .param("rate_mb", args.rate_mb)
        .param("send_rate", args.send_rate)
        .param("backup_bytes", first.uploaded_bytes)
        .param("backup_s", took.as_secs_f64())
        .param("backup_mb_per_s", backup_mb_s)
        .param("send_p99_ms_without_backup", idle_p99)
        .param("incremental_messages", more)
        .param("incremental_files", second.uploaded_files)
        .param("incremental_bytes", second.uploaded_bytes)
        .param("incremental_s", incremental.as_secs_f64())
        .param("restore_bytes", restored.bytes)
        .param("restore_s", restore_took.as_secs_f64())
        .param("restore_mb_per_s", restore_mb_s);
    report.print();
    if let Some(path) = &args.json {
        report.write_json(path)?;
    }
    Ok(())
}

type Loaded = (
    Option<cellmesh_cell::backup::Manifest>,
    Duration,
    Histogram<u64>,
    u64,
    BTreeMap<String, u64>,
);

/// Steady sends while a backup runs (or for 10 s without one): the
/// backup, how long it took, and the sends' latency, count and errors.
async fn under_load(
    endpoint: &str,
    conversations: &[u64],
    args: &BackupArgs,
    backup: Option<(&Backups, &Arc<cellmesh_cell::storage::Store>)>,
) -> anyhow::Result<Loaded> {
    let stop = Arc::new(AtomicBool::new(false));
    let senders = steady(
        endpoint.to_string(),
        conversations.to_vec(),
        args.send_rate,
        args.body_bytes,
        stop.clone(),
    );
    let started = Instant::now();
    let taken = match backup {
        Some((backups, store)) => Some(backups.create(store, 0, 0, now_ms()).await?),
        None => {
            tokio::time::sleep(Duration::from_secs(10)).await;
            None
        }
    };
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (histogram, acked, errors) = senders.await?;
    Ok((taken, took, histogram, acked, errors))
}

fn now_ms() -> u64 {
    cellmesh_operations::now_ms()
}

fn body(n: u64, size: usize) -> Vec<u8> {
    // Incompressible enough to be honest about bytes on disk.
    let mut state = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..size)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            b'a' + (state % 26) as u8
        })
        .collect()
}

/// Sends `count` messages (ids from `first`) round-robin over the
/// conversations, 32 at a time; how long it took.
async fn fill(
    endpoint: &str,
    conversations: &[u64],
    count: u64,
    size: usize,
    first: u64,
) -> anyhow::Result<Duration> {
    let client = connect(endpoint).await?;
    let started = Instant::now();
    let workers = 32u64;
    let mut tasks = Vec::new();
    for w in 0..workers {
        let (mut client, conversations) = (client.clone(), conversations.to_vec());
        tasks.push(tokio::spawn(async move {
            let mut n = first + w;
            while n < first + count {
                let conv = conversations[(n % conversations.len() as u64) as usize];
                let req = send_request(
                    TENANT,
                    1,
                    conv,
                    format!("fill-{n}"),
                    MessageType::Text,
                    body(n, size),
                );
                client.send(req).await?;
                n += workers;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(started.elapsed())
}

type Measured = (Histogram<u64>, u64, BTreeMap<String, u64>);

/// Sends at `rate` per second (16 senders) until `stop`: ack latency.
fn steady(
    endpoint: String,
    conversations: Vec<u64>,
    rate: u64,
    size: usize,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Measured> {
    tokio::spawn(async move {
        let client = connect(&endpoint).await.expect("the bench cell answers");
        let senders = 16u64;
        let every = Duration::from_secs_f64(senders as f64 / rate.max(1) as f64);
        let mut tasks = Vec::new();
        for s in 0..senders {
            let (mut client, conversations, stop) =
                (client.clone(), conversations.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut histogram = Histogram::<u64>::new(3).expect("histogram");
                let (mut acked, mut errors) = (0u64, BTreeMap::new());
                let mut tick = tokio::time::interval(every);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    n += 1;
                    let conv =
                        conversations[((n * senders + s) % conversations.len() as u64) as usize];
                    let req = send_request(
                        TENANT,
                        2,
                        conv,
                        format!("steady-{}-{s}-{n}", rand::random::<u32>()),
                        MessageType::Text,
                        body(n, size),
                    );
                    let t = Instant::now();
                    match client.send(req).await {
                        Ok(_) => {
                            let _ = histogram.record(t.elapsed().as_micros() as u64);
                            acked += 1;
                        }
                        Err(status) => count_error(&mut errors, &status),
                    }
                }
                (histogram, acked, errors)
            }));
        }
        let mut total = Histogram::<u64>::new(3).expect("histogram");
        let (mut acked, mut errors) = (0, BTreeMap::new());
        for task in tasks {
            let (h, a, e) = task.await.expect("a sender");
            total.add(h).expect("histograms of one shape");
            acked += a;
            for (code, n) in e {
                *errors.entry(code).or_insert(0) += n;
            }
        }
        (total, acked, errors)
    })
}
