//! `cellmesh bench pull`: history pages from the hot tier or the cold one.
//! Starts its own cell over a temp dir, fills C conversations with M
//! messages each, and with `--tier cold` moves all but each conversation's
//! newest `--hot-tail` messages to cold segments (a local directory, or an
//! S3 bucket with `--s3-endpoint`); then readers pull pages at random
//! positions below the hot tail. Reports page latency percentiles and the
//! cell's disk before and after tiering.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cellmesh_cell::cold::TierStore;
use cellmesh_proto::v1::{Direction, MessageType, PullRequest};
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use rand::Rng;

use crate::{Report, count_error, send_request};
use cellmesh_client::connect::{caller, connect};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Tier {
    Hot,
    Cold,
}

#[derive(Args)]
pub struct PullArgs {
    #[arg(long, value_enum, default_value = "hot")]
    tier: Tier,
    #[arg(long, default_value_t = 200)]
    conversations: u64,
    /// Messages per conversation.
    #[arg(long, default_value_t = 500)]
    messages: u64,
    /// Messages that stay hot per conversation with `--tier cold`.
    #[arg(long, default_value_t = 50)]
    hot_tail: u64,
    /// Messages per page.
    #[arg(long, default_value_t = 50)]
    page: u32,
    #[arg(long, default_value_t = 8)]
    readers: usize,
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Decoded segments the cell keeps in memory (0: every cold page
    /// fetches its segment).
    #[arg(long, default_value_t = 0)]
    cache_segments: usize,
    /// An S3 endpoint for the cold tier (e.g. a local moto_server);
    /// without it, a directory beside the cell's data.
    #[arg(long)]
    s3_endpoint: Option<String>,
    #[arg(long, default_value = "cellmesh-bench")]
    s3_bucket: String,
    #[arg(long)]
    json: Option<PathBuf>,
}

const TENANT: u64 = 1;

pub async fn run(args: PullArgs) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut config = cellmesh_cell::CellConfig {
        listen: "127.0.0.1:0".parse()?,
        data_dir: dir.path().to_path_buf(),
        ..Default::default()
    };
    config.rate_limit.user_per_sec = 1_000_000;
    config.rate_limit.user_burst = 1_000_000;
    let t = &mut config.tiering;
    t.enabled = true;
    t.interval_ms = 86_400_000;
    t.hot_messages_per_conversation = args.hot_tail;
    t.cache_segments = args.cache_segments;
    if let Some(endpoint) = &args.s3_endpoint {
        t.store = TierStore::S3;
        t.s3 = crate::s3_bucket(endpoint, &args.s3_bucket);
    }
    let store = if args.s3_endpoint.is_some() {
        "s3"
    } else {
        "local"
    };
    let cell = crate::own_cell(config).await?;
    let endpoint = format!("http://{}", cell.addr);
    let conversations = fill(&endpoint, &args).await?;
    let db = dir.path().join("db");
    cell.service.store().compact();
    let disk_before = crate::du(&db);
    let hot_before = cell.service.store().message_bytes();
    let mut tier_secs = 0.0;
    if args.tier == Tier::Cold {
        let started = Instant::now();
        let report = cell.service.tier_once().await?;
        tier_secs = started.elapsed().as_secs_f64();
        println!(
            "tiered {} messages into {} segments in {tier_secs:.1} s",
            report.messages_tiered, report.segments_written
        );
        cell.service.store().compact();
    }
    let disk_after = crate::du(&db);
    let hot_after = cell.service.store().message_bytes();
    let cold_bytes = crate::du(&dir.path().join("cold"));

    let below = match args.tier {
        Tier::Hot => args.messages,
        Tier::Cold => args.messages - args.hot_tail.min(args.messages),
    };
    let (histogram, pages, errors, elapsed) = read(&endpoint, &conversations, below, &args).await?;
    cell.shutdown().await?;
    let report = Report::new("pull", pages, errors, elapsed, &histogram)
        .param(
            "tier",
            if args.tier == Tier::Hot {
                "hot"
            } else {
                "cold"
            },
        )
        .param("store", store)
        .param("conversations", args.conversations)
        .param("messages", args.messages)
        .param("page", args.page)
        .param("readers", args.readers as u64)
        .param("cache_segments", args.cache_segments as u64)
        .param("rocksdb_bytes_before_tiering", disk_before)
        .param("rocksdb_bytes_after_tiering", disk_after)
        .param("message_sst_bytes_before_tiering", hot_before)
        .param("message_sst_bytes_after_tiering", hot_after)
        .param("cold_dir_bytes", cold_bytes)
        .param("tiering_s", tier_secs);
    report.print();
    if let Some(path) = &args.json {
        report.write_json(path)?;
    }
    Ok(())
}

/// Creates the conversations and sends their messages (16 at a time).
async fn fill(endpoint: &str, args: &PullArgs) -> anyhow::Result<Vec<u64>> {
    let client = connect(endpoint).await?;
    let conversations = crate::create_groups(endpoint, TENANT, args.conversations).await?;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for chunk in conversations.chunks(conversations.len().div_ceil(16).max(1)) {
        let (mut client, chunk, messages) = (client.clone(), chunk.to_vec(), args.messages);
        tasks.push(tokio::spawn(async move {
            for conv in chunk {
                for n in 0..messages {
                    let noise: String = {
                        let mut rng = rand::rng();
                        (0..120)
                            .map(|_| rng.random_range(b'a'..=b'z') as char)
                            .collect()
                    };
                    let body = format!("message {n} of conversation {conv}: {noise}");
                    let req = send_request(
                        TENANT,
                        1,
                        conv,
                        format!("{conv}-{n}"),
                        MessageType::Text,
                        body.into_bytes(),
                    );
                    client.send(req).await?;
                }
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    println!(
        "filled {} conversations x {} messages in {:.1} s",
        args.conversations,
        args.messages,
        started.elapsed().as_secs_f64()
    );
    Ok(conversations)
}

type Measured = (Histogram<u64>, u64, BTreeMap<String, u64>, Duration);

/// Readers pull pages starting at random seqs below `below` until the
/// duration ends.
async fn read(
    endpoint: &str,
    conversations: &[u64],
    below: u64,
    args: &PullArgs,
) -> anyhow::Result<Measured> {
    let client = connect(endpoint).await?;
    let deadline = Instant::now() + args.duration;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.readers {
        let (mut client, conversations, page) = (client.clone(), conversations.to_vec(), args.page);
        tasks.push(tokio::spawn(async move {
            let mut histogram = Histogram::<u64>::new(3).expect("histogram");
            let (mut pages, mut errors) = (0u64, BTreeMap::new());
            while Instant::now() < deadline {
                let (conv, since) = {
                    let mut rng = rand::rng();
                    let conv = conversations[rng.random_range(0..conversations.len())];
                    (
                        conv,
                        rng.random_range(0..below.saturating_sub(u64::from(page)).max(1)),
                    )
                };
                let t = Instant::now();
                let pulled = client
                    .pull(PullRequest {
                        caller: caller(TENANT, 2),
                        conversation_id: conv,
                        since_seq: since,
                        direction: Direction::Forward as i32,
                        limit: page,
                    })
                    .await;
                match pulled {
                    Ok(_) => {
                        let _ = histogram.record(t.elapsed().as_micros() as u64);
                        pages += 1;
                    }
                    Err(status) => count_error(&mut errors, &status),
                }
            }
            (histogram, pages, errors)
        }));
    }
    let mut histogram = Histogram::<u64>::new(3)?;
    let (mut pages, mut errors) = (0, BTreeMap::new());
    for task in tasks {
        let (h, p, e) = task.await?;
        histogram.add(h)?;
        pages += p;
        for (k, v) in e {
            *errors.entry(k).or_insert(0) += v;
        }
    }
    Ok((histogram, pages, errors, started.elapsed()))
}
