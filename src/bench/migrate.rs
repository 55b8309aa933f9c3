//! `cellmesh bench migrate --dev DATA_DIR`: fills conversations through the
//! edge of a running `cellmesh dev`, moves each one to another cell while a
//! sender keeps sending, and reports messages copied per second and the
//! freeze window (writes refused) percentiles.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cellmesh_control_plane::migration::{MigrationOptions, Migrator};
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::status::{error_code, error_detail};
use cellmesh_proto::v1::ErrorCode;
use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::{ConversationKind, CreateConversationRequest, MessageType, SendRequest};
use cellmesh_router::client::RouteClient;
use cellmesh_router::edge::auth::{Claims, TokenKey, now_secs};
use cellmesh_router::table::Key;
use clap::Args;
use hdrhistogram::Histogram;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

use super::Report;

#[derive(Args)]
pub struct MigrateArgs {
    /// The data dir of a running `cellmesh dev`.
    #[arg(long)]
    dev: PathBuf,
    /// Conversations to move, one after the other.
    #[arg(long, default_value_t = 5)]
    conversations: u32,
    /// Messages in each conversation before it moves.
    #[arg(long, default_value_t = 10_000)]
    messages: u32,
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    #[arg(long, default_value_t = 1000)]
    chunk: u32,
    #[arg(long)]
    json: Option<PathBuf>,
}

fn authed<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    if let Ok(v) = MetadataValue::try_from(format!("Bearer {token}")) {
        r.metadata_mut().insert("authorization", v);
    }
    r
}

/// Sends `messages` into `conv` from one sender per token, retrying rate
/// limits after the wait the cell asks for.
async fn fill(
    edge: String,
    tokens: Vec<String>,
    conv: u64,
    messages: u32,
    run: u64,
) -> anyhow::Result<()> {
    let channel = Channel::from_shared(edge)?.connect().await?;
    let per = messages.div_ceil(tokens.len() as u32);
    let mut tasks = Vec::new();
    for (w, token) in tokens.into_iter().enumerate() {
        let mut client = MessagingClient::new(channel.clone());
        tasks.push(tokio::spawn(async move {
            for n in 0..per {
                let request = SendRequest {
                    conversation_id: conv,
                    client_req_id: format!("bm-{run}-{conv}-{w}-{n}"),
                    r#type: MessageType::Text as i32,
                    body: vec![b'x'; 100],
                    ..Default::default()
                };
                loop {
                    match client.send(authed(request.clone(), &token)).await {
                        Ok(_) => break,
                        Err(e) if error_code(&e) == ErrorCode::RateLimited => {
                            let wait = error_detail(&e).retry_after_ms.max(1);
                            tokio::time::sleep(Duration::from_millis(wait)).await;
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            Ok::<_, tonic::Status>(())
        }));
    }
    for t in tasks {
        t.await?
            .map_err(|e| anyhow::anyhow!(crate::client::describe(&e)))?;
    }
    Ok(())
}

pub async fn run(args: MigrateArgs) -> anyhow::Result<()> {
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(args.dev.join("dev.json"))?)?;
    let secret = info["cluster_secret"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let routers: Vec<String> = info["routers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    let edge = info["edges"]["eu-west"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let token = info["demo"]["tokens"]["1"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let tenant = info["demo"]["tenant"].as_u64().unwrap_or(1);
    // Senders of their own (a user's rate limit is per user), with tokens
    // signed by the deployment's token secret.
    let secrets: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(args.dev.join("secrets.json"))?)?;
    let key = TokenKey::new(secrets["token"].as_str().unwrap_or_default());
    let senders: Vec<u64> = (0..args.concurrency as u64).map(|w| 1000 + w).collect();
    let tokens: Vec<String> = senders
        .iter()
        .map(|&user| {
            key.issue(&Claims {
                tenant,
                user,
                device: "bench".into(),
                exp: now_secs() + 3600,
            })
        })
        .collect();
    let routes = RouteClient::connect(routers, ClusterSecret::new(&secret))
        .await
        .map_err(|e| anyhow::anyhow!(crate::client::describe(&e)))?;
    let migrator = Migrator::new(
        routes.clone(),
        ClusterSecret::new(&secret),
        MigrationOptions {
            chunk: args.chunk,
            ..MigrationOptions::default()
        },
    );
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut freeze = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let (mut copied, mut copy_time) = (0u64, Duration::ZERO);
    let started = Instant::now();
    for i in 0..args.conversations {
        let mut client = MessagingClient::new(Channel::from_shared(edge.clone())?.connect().await?);
        let conv = client
            .create_conversation(authed(
                CreateConversationRequest {
                    kind: ConversationKind::Group as i32,
                    title: format!("bench-migrate-{i}"),
                    member_ids: senders.clone(),
                    client_req_id: format!("bm-{run}-{i}"),
                    ..Default::default()
                },
                &token,
            ))
            .await
            .map_err(|e| anyhow::anyhow!(crate::client::describe(&e)))?
            .into_inner()
            .conversation
            .map_or(0, |c| c.conversation_id);
        fill(edge.clone(), tokens.clone(), conv, args.messages, run).await?;
        let owner = routes
            .resolve(&Key::conversation(tenant, conv))
            .map(|r| r.entry.cell)
            .unwrap_or_default();
        let to = routes.read(|t| {
            t.cells
                .values()
                .find(|c| {
                    c.id != owner
                        && c.region != t.cell(&owner).map(|o| o.region.clone()).unwrap_or_default()
                })
                .map(|c| c.id.clone())
        });
        let to = to.ok_or_else(|| anyhow::anyhow!("no cell in another region"))?;
        // A sender keeps going during the move.
        let keep = tokio::spawn(fill(
            edge.clone(),
            vec![tokens[0].clone()],
            conv,
            200,
            run + 1 + i as u64,
        ));
        let t = Instant::now();
        let report = migrator
            .migrate_conversation(tenant, conv, &to, |_| {})
            .await?;
        copy_time += t.elapsed();
        copied += report.messages_verified;
        let _ = freeze.record(report.frozen_for.as_micros() as u64);
        keep.await??;
        println!(
            "moved conversation {conv} ({} messages) {} -> {to} in {} ms, writes paused {} ms",
            report.messages_verified,
            report.from,
            report.total.as_millis(),
            report.frozen_for.as_millis()
        );
    }
    let rate = copied as f64 / copy_time.as_secs_f64().max(1e-9);
    let report = Report::new(
        "migrate",
        u64::from(args.conversations),
        BTreeMap::new(),
        started.elapsed(),
        &freeze,
    )
    .param("messages_per_conversation", args.messages)
    .param("messages_copied", copied)
    .param("messages_copied_per_s", rate.round())
    .param("latency_is", "freeze window (writes refused) per move")
    .param("chunk", args.chunk);
    report.print();
    if let Some(path) = &args.json {
        report.write_json(path)?;
    }
    Ok(())
}
