//! `cellmesh bench migrate --dev DATA_DIR`: fills conversations through the
//! edge of a running `cellmesh dev`, moves each one to another cell while a
//! sender keeps sending, and reports messages copied per second (over whole
//! moves, and over their first copy round: the bulk copy alone) and the
//! freeze window (writes refused) percentiles.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellmesh_control_plane::migration::{MigrationOptions, Migrator};
use cellmesh_proto::status::{error_code, error_detail};
use cellmesh_proto::v1::ErrorCode;
use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::{ConversationKind, CreateConversationRequest, MessageType, SendRequest};
use cellmesh_route_client::table::Key;
use clap::Args;
use hdrhistogram::Histogram;
use tonic::transport::Channel;

use crate::Report;
use cellmesh_chaos::target::DevTarget;

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
    /// Messages per copied chunk (the migrator's default).
    #[arg(long, default_value_t = MigrationOptions::default().chunk)]
    chunk: u32,
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Sends `messages` into `conv`, spread over `senders`, retrying rate
/// limits after the wait the cell asks for.
async fn fill(
    channel: Channel,
    dev: Arc<DevTarget>,
    senders: Vec<u64>,
    conv: u64,
    messages: u32,
    run: u64,
) -> anyhow::Result<()> {
    let per = messages.div_ceil(senders.len() as u32);
    let mut tasks = Vec::new();
    for (w, user) in senders.into_iter().enumerate() {
        let mut client = MessagingClient::new(channel.clone());
        let dev = dev.clone();
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
                    match client.send(dev.request(request.clone(), user)).await {
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
            .map_err(|e| anyhow::anyhow!(cellmesh_client::connect::describe(&e)))?;
    }
    Ok(())
}

pub async fn run(args: MigrateArgs) -> anyhow::Result<()> {
    let dev = Arc::new(DevTarget::load(&args.dev)?);
    let tenant = dev.tenant;
    // Senders of their own: a user's rate limit is per user.
    let senders: Vec<u64> = (0..args.concurrency as u64).map(|w| 1000 + w).collect();
    let routes = dev.routes().await?;
    let migrator = Migrator::new(
        routes.clone(),
        dev.secret(),
        MigrationOptions {
            chunk: args.chunk,
            ..MigrationOptions::default()
        },
    );
    let channel = Channel::from_shared(dev.edge.clone())?.connect().await?;
    let mut client = MessagingClient::new(channel.clone());
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut freeze = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let (mut copied, mut copy_time) = (0u64, Duration::ZERO);
    // The first copy round alone: the bulk copy, without a move's fixed costs.
    let (mut bulk, mut bulk_time) = (0u64, Duration::ZERO);
    let started = Instant::now();
    for i in 0..args.conversations {
        let conv = client
            .create_conversation(dev.request(
                CreateConversationRequest {
                    kind: ConversationKind::Group as i32,
                    title: format!("bench-migrate-{i}"),
                    member_ids: senders.clone(),
                    client_req_id: format!("bm-{run}-{i}"),
                    ..Default::default()
                },
                // The demo user 1 creates; the senders are its members.
                1,
            ))
            .await
            .map_err(|e| anyhow::anyhow!(cellmesh_client::connect::describe(&e)))?
            .into_inner()
            .conversation
            .map_or(0, |c| c.conversation_id);
        fill(
            channel.clone(),
            dev.clone(),
            senders.clone(),
            conv,
            args.messages,
            run,
        )
        .await?;
        let owner = routes
            .resolve(&Key::conversation(TenantId(tenant), ConversationId(conv)))
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
            channel.clone(),
            dev.clone(),
            vec![senders[0]],
            conv,
            200,
            run + 1 + i as u64,
        ));
        let t = Instant::now();
        let mut first_round = None;
        let report = migrator
            .migrate_conversation(TenantId(tenant), ConversationId(conv), &to, |p| {
                first_round.get_or_insert((t.elapsed(), p.copied_through));
            })
            .await?;
        copy_time += t.elapsed();
        if let Some((took, through)) = first_round {
            bulk += through;
            bulk_time += took;
        }
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
    .param(
        "bulk_copy_per_s",
        (bulk as f64 / bulk_time.as_secs_f64().max(1e-9)).round(),
    )
    .param("latency_is", "freeze window (writes refused) per move")
    .param("chunk", args.chunk);
    report.print();
    if let Some(path) = &args.json {
        report.write_json(path)?;
    }
    Ok(())
}
