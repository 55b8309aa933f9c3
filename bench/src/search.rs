//! `cellmesh bench search`: full-text search on a cell it starts. Fills N
//! messages (English and Chinese words) into 1,000 conversations through
//! gRPC while the indexer runs, and reports: the send rate and how long
//! after the last ack the index held everything (so whether indexing keeps
//! up with sends), index bytes per message, member-scoped query latency for
//! a user in 10 conversations and one in 1,000, and the time from a
//! message's ack to its first appearance in results. The report's own
//! throughput and latency are those of the 1,000-conversation queries.

use cellmesh_proto::ids::TenantId;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cellmesh_proto::v1::{ConversationKind, CreateConversationRequest, MessageType, SearchRequest};
use clap::Args;
use hdrhistogram::Histogram;
use rand::Rng;
use rand::seq::IndexedRandom;

use crate::{Report, send_request};
use cellmesh_client::connect::{caller, connect};

#[derive(Args)]
pub struct SearchArgs {
    /// Messages to index.
    #[arg(long, default_value_t = 200_000)]
    messages: u64,
    #[arg(long, default_value_t = 1_000)]
    conversations: u64,
    /// Concurrent senders while filling.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Queries per user measured.
    #[arg(long, default_value_t = 500)]
    queries: u64,
    /// Analyzer of the tenant: standard or zh.
    #[arg(long, default_value = "standard")]
    language: String,
    #[arg(long)]
    json: Option<PathBuf>,
}

const TENANT: u64 = 1;
/// Member of every conversation; writes all messages.
const WRITER: u64 = 1;
/// Member of every conversation.
const WIDE: u64 = 2;
/// Member of the first ten.
const NARROW: u64 = 3;

const ENGLISH: &[&str] = &[
    "budget",
    "review",
    "meeting",
    "release",
    "customer",
    "invoice",
    "deadline",
    "server",
    "deploy",
    "roadmap",
    "design",
    "contract",
    "quarter",
    "report",
    "launch",
    "feedback",
    "hiring",
    "travel",
    "office",
    "security",
    "incident",
    "migration",
    "database",
    "backup",
    "holiday",
    "training",
    "approval",
    "pricing",
    "support",
    "ticket",
    "network",
    "mobile",
    "browser",
    "update",
    "schedule",
    "agenda",
    "minutes",
    "summary",
    "forecast",
    "revenue",
    "project",
    "team",
    "manager",
    "partner",
    "vendor",
    "license",
    "audit",
    "policy",
    "cloud",
    "region",
    "latency",
    "capacity",
    "storage",
    "search",
    "index",
    "message",
    "group",
    "file",
];
const CHINESE: &[&str] = &[
    "预算",
    "会议",
    "发布",
    "客户",
    "发票",
    "截止",
    "服务器",
    "部署",
    "路线图",
    "设计",
    "合同",
    "季度",
    "报告",
    "反馈",
    "招聘",
    "出差",
    "办公室",
    "安全",
    "事故",
    "迁移",
    "数据库",
    "备份",
    "假期",
    "培训",
    "审批",
    "定价",
    "支持",
    "网络",
    "更新",
    "日程",
];

fn sentence(rng: &mut impl Rng) -> String {
    let n = rng.random_range(6..14);
    let words: Vec<&str> = (0..n)
        .map(|_| match rng.random_bool(0.3) {
            true => *CHINESE.choose(rng).expect("words"),
            false => *ENGLISH.choose(rng).expect("words"),
        })
        .collect();
    words.join(" ")
}

pub async fn run(args: SearchArgs) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut config = crate::unlimited_cell(dir.path().to_path_buf());
    config.search.language = match args.language.as_str() {
        "zh" => cellmesh_cell::search::Language::Zh,
        _ => cellmesh_cell::search::Language::Standard,
    };
    let cell = crate::own_cell(config).await?;
    let endpoint = format!("http://{}", cell.addr);
    let conversations = create(&endpoint, args.conversations).await?;
    let docs = || -> u64 {
        (cell.service.search_indexes())
            .and_then(|s| s.tenant(TenantId(TENANT)).ok())
            .map_or(0, |i| i.num_docs())
    };

    // Fill while the indexer runs.
    let started = Instant::now();
    fill(&endpoint, &conversations, &args).await?;
    let send_secs = started.elapsed().as_secs_f64();
    let acked_at = Instant::now();
    while docs() < args.messages {
        tokio::time::sleep(Duration::from_millis(20)).await;
        anyhow::ensure!(
            acked_at.elapsed() < Duration::from_secs(600),
            "the index never caught up"
        );
    }
    let catch_up = acked_at.elapsed().as_secs_f64();
    let index_secs = started.elapsed().as_secs_f64();
    let send_rate = args.messages as f64 / send_secs;
    let index_rate = args.messages as f64 / index_secs;
    println!(
        "sent {} in {send_secs:.1} s ({send_rate:.0}/s); all searchable {catch_up:.2} s after the last ack ({index_rate:.0} indexed/s overall)",
        args.messages
    );
    let index_bytes = crate::du(&dir.path().join("search"));

    let narrow = query_latency(&endpoint, NARROW, &conversations[..10], args.queries).await?;
    let queried = Instant::now();
    let wide = query_latency(&endpoint, WIDE, &conversations, args.queries).await?;
    let query_time = queried.elapsed();
    let visible = ack_to_found(&endpoint, conversations[0]).await?;
    cell.shutdown().await?;

    let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let report = Report::new(
        "search",
        args.queries,
        Default::default(),
        query_time,
        &wide,
    )
    .param("messages", args.messages)
    .param("conversations", args.conversations)
    .param("language", args.language.clone())
    .param("send_rate_per_s", send_rate.round())
    .param("indexed_per_s_overall", index_rate.round())
    .param("index_catch_up_after_last_ack_s", catch_up)
    .param(
        "index_bytes_per_message",
        (index_bytes / args.messages.max(1)) as f64,
    )
    .param("query_10_conversations_p50_ms", ms(&narrow, 0.5))
    .param("query_10_conversations_p99_ms", ms(&narrow, 0.99))
    .param("query_1000_conversations_p50_ms", ms(&wide, 0.5))
    .param("query_1000_conversations_p99_ms", ms(&wide, 0.99))
    .param("ack_to_found_p50_ms", ms(&visible, 0.5))
    .param("ack_to_found_p99_ms", ms(&visible, 0.99));
    report.print();
    if let Some(path) = &args.json {
        report.write_json(path)?;
    }
    Ok(())
}

async fn create(endpoint: &str, n: u64) -> anyhow::Result<Vec<u64>> {
    let mut client = connect(endpoint).await?;
    let mut out = Vec::new();
    for i in 0..n {
        let members = if i < 10 {
            vec![WIDE, NARROW]
        } else {
            vec![WIDE]
        };
        let created = client
            .create_conversation(CreateConversationRequest {
                caller: caller(TENANT, WRITER),
                kind: ConversationKind::Group as i32,
                member_ids: members,
                title: format!("bench {i}"),
                client_req_id: format!("create-{i}"),
            })
            .await?
            .into_inner();
        out.push(created.conversation.map_or(0, |c| c.conversation_id));
    }
    Ok(out)
}

async fn fill(endpoint: &str, conversations: &[u64], args: &SearchArgs) -> anyhow::Result<()> {
    let client = connect(endpoint).await?;
    let per_task = args.messages.div_ceil(args.concurrency as u64);
    let mut tasks = Vec::new();
    for t in 0..args.concurrency as u64 {
        let (mut client, conversations) = (client.clone(), conversations.to_vec());
        let (from, to) = (t * per_task, ((t + 1) * per_task).min(args.messages));
        tasks.push(tokio::spawn(async move {
            for n in from..to {
                let (conv, body) = {
                    let mut rng = rand::rng();
                    (
                        *conversations.choose(&mut rng).expect("conversations"),
                        sentence(&mut rng),
                    )
                };
                let req = send_request(
                    TENANT,
                    WRITER,
                    conv,
                    format!("s-{n}"),
                    MessageType::Text,
                    body.into_bytes(),
                );
                client.send(req).await?;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// Latency of one-word and two-word queries of `user` over `conversations`
/// (named in the request, as the edge names them).
async fn query_latency(
    endpoint: &str,
    user: u64,
    conversations: &[u64],
    queries: u64,
) -> anyhow::Result<Histogram<u64>> {
    let mut client = connect(endpoint).await?;
    let mut h = Histogram::<u64>::new(3)?;
    for _ in 0..queries {
        let query = {
            let mut rng = rand::rng();
            let words = rng.random_range(1..=2);
            (0..words)
                .map(|_| match rng.random_bool(0.3) {
                    true => *CHINESE.choose(&mut rng).expect("words"),
                    false => *ENGLISH.choose(&mut rng).expect("words"),
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        let t = Instant::now();
        client
            .search(SearchRequest {
                caller: caller(TENANT, user),
                query,
                conversation_ids: conversations.to_vec(),
                page_size: 20,
                ..Default::default()
            })
            .await?;
        h.record(t.elapsed().as_micros() as u64)?;
    }
    Ok(h)
}

/// Sends a message with a word of its own and searches until it is found.
async fn ack_to_found(endpoint: &str, conversation: u64) -> anyhow::Result<Histogram<u64>> {
    let mut client = connect(endpoint).await?;
    let mut h = Histogram::<u64>::new(3)?;
    for i in 0..50 {
        let word = format!("marker{i}x{}", rand::rng().random_range(0..1_000_000u32));
        let req = send_request(
            TENANT,
            WRITER,
            conversation,
            format!("m-{word}"),
            MessageType::Text,
            word.clone().into_bytes(),
        );
        client.send(req).await?;
        let acked = Instant::now();
        loop {
            let r = client
                .search(SearchRequest {
                    caller: caller(TENANT, NARROW),
                    query: word.clone(),
                    conversation_id: conversation,
                    page_size: 1,
                    ..Default::default()
                })
                .await?
                .into_inner();
            if !r.hits.is_empty() {
                break;
            }
            anyhow::ensure!(
                acked.elapsed() < Duration::from_secs(30),
                "{word} never found"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        h.record(acked.elapsed().as_micros() as u64)?;
    }
    Ok(h)
}
