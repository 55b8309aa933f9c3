//! `cellmesh chaos run SCENARIO --dev DATA_DIR`: a drill against a running
//! `cellmesh dev`. Senders write through the edge with unique request ids
//! and record every outcome; process faults are injected on a schedule
//! drawn from the seed (SIGKILL — the supervisor restarts the cell — or
//! SIGSTOP/SIGCONT, a hung cell the control plane fails over); afterwards
//! every conversation is read back and the history checker judges each
//! invariant of DESIGN.md §7. The report (JSON and a summary) lists the
//! faults with times, the outcomes and every verdict; any violation makes
//! the command fail.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellmesh_chaos::check_all;
use cellmesh_chaos::history::{Floor, History, Outcome, SendOp, Stored};
use cellmesh_proto::status::error_code;
use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::{
    ConversationKind, CreateConversationRequest, Direction, ErrorCode, MessageType, PullRequest,
    SendRequest,
};
use clap::{Args, Subcommand, ValueEnum};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tonic::transport::Channel;

use cellmesh_control_plane::migration::{MigrationOptions, Migrator};
use cellmesh_router::table::Key;

use crate::devtarget::DevTarget;

#[derive(Args)]
pub struct ChaosArgs {
    #[command(subcommand)]
    command: ChaosCommand,
}

#[derive(Subcommand)]
enum ChaosCommand {
    /// Run one drill and judge it.
    Run(RunArgs),
}

#[derive(Clone, Copy, ValueEnum, Debug)]
enum Scenario {
    /// SIGKILL a random cell now and then (the dev supervisor restarts it).
    CellKill,
    /// SIGSTOP a random cell for a while (failover), then SIGCONT.
    CellHang,
    /// Move the drill's conversations live to other cells while they are
    /// written.
    MigrationUnderLoad,
    /// Kills and hangs, chosen from the seed.
    Mixed,
}

#[derive(Args)]
struct RunArgs {
    #[arg(value_enum)]
    scenario: Scenario,
    /// The data dir of a running `cellmesh dev`.
    #[arg(long)]
    dev: PathBuf,
    #[arg(long, default_value = "30s")]
    duration: humantime::Duration,
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long, default_value_t = 4)]
    senders: u64,
    #[arg(long, default_value_t = 4)]
    conversations: u64,
    /// Write the report here as JSON.
    #[arg(long)]
    report: Option<PathBuf>,
}

pub async fn run(args: ChaosArgs) -> anyhow::Result<()> {
    match args.command {
        ChaosCommand::Run(args) => drill(args).await,
    }
}

const USER_BASE: u64 = 200_000;

fn now_ms(epoch: Instant) -> u64 {
    epoch.elapsed().as_millis() as u64
}

/// Outcomes the client cannot know (the request may have been applied).
fn outcome_of(status: &tonic::Status) -> Outcome {
    match error_code(status) {
        ErrorCode::RetryLater | ErrorCode::Internal | ErrorCode::WrongCell => Outcome::Unknown,
        code => Outcome::Rejected {
            code: code.as_str_name().to_string(),
        },
    }
}

/// Moves `conversation` live to another cell; what happened, for the report.
async fn migrate(dev: &DevTarget, conversation: u64, rng: &mut StdRng) -> String {
    let attempt = async {
        let routes = dev.routes().await?;
        let owner = routes
            .resolve(&Key::conversation(dev.tenant, conversation))
            .map(|r| r.entry.cell)
            .unwrap_or_default();
        let targets: Vec<String> = routes.read(|t| {
            t.cells
                .values()
                .filter(|c| c.id != owner && c.status == cellmesh_router::table::CellStatus::Up)
                .map(|c| c.id.clone())
                .collect()
        });
        anyhow::ensure!(!targets.is_empty(), "no cell to move to");
        let to = targets[rng.random_range(0..targets.len())].clone();
        let report = Migrator::new(routes, dev.secret(), MigrationOptions::default())
            .migrate_conversation(dev.tenant, conversation, &to, |_| {})
            .await?;
        Ok::<_, anyhow::Error>(format!(
            "conversation {conversation} {owner} -> {to}: {} messages, writes paused {} ms",
            report.messages_verified,
            report.frozen_for.as_millis()
        ))
    };
    match attempt.await {
        Ok(done) => done,
        Err(e) => format!("conversation {conversation}: migration failed: {e}"),
    }
}

async fn drill(args: RunArgs) -> anyhow::Result<()> {
    let dev = Arc::new(DevTarget::load(&args.dev)?);
    let seed = args.seed.unwrap_or_else(|| rand::rng().random());
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let channel = Channel::from_shared(dev.edge.clone())?.connect().await?;
    let senders: Vec<u64> = (0..args.senders).map(|i| USER_BASE + i).collect();
    let mut conversations = Vec::new();
    for i in 0..args.conversations {
        let mut client = MessagingClient::new(channel.clone());
        let created = client
            .create_conversation(dev.request(
                CreateConversationRequest {
                    kind: ConversationKind::Group as i32,
                    title: format!("drill {run_id} {i}"),
                    member_ids: senders[1..].to_vec(),
                    client_req_id: format!("drill-{run_id}-{i}"),
                    ..Default::default()
                },
                senders[0],
            ))
            .await
            .map_err(|e| anyhow::anyhow!(crate::client::describe(&e)))?;
        conversations.push(
            created
                .into_inner()
                .conversation
                .map_or(0, |c| c.conversation_id),
        );
    }
    println!(
        "drill {:?} seed {seed}: {} senders into {} conversations for {}",
        args.scenario,
        senders.len(),
        conversations.len(),
        args.duration
    );

    let epoch = Instant::now();
    let stop = epoch + Duration::from(args.duration);
    let ops = Arc::new(Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    for (w, &user) in senders.iter().enumerate() {
        let (dev, ops, convs, channel) = (
            dev.clone(),
            ops.clone(),
            conversations.clone(),
            channel.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut client = MessagingClient::new(channel);
            let mut n = 0u64;
            while Instant::now() < stop {
                n += 1;
                let conversation = convs[(n as usize + w) % convs.len()];
                let tag = format!("d{run_id}-{user}-{n}");
                let invoked_ms = now_ms(epoch);
                let mut request = dev.request(
                    SendRequest {
                        conversation_id: conversation,
                        client_req_id: tag.clone(),
                        r#type: MessageType::Text as i32,
                        body: tag.clone().into_bytes(),
                        ..Default::default()
                    },
                    user,
                );
                request.set_timeout(Duration::from_secs(10));
                let outcome = match client.send(request).await {
                    Ok(r) => {
                        let r = r.into_inner();
                        Outcome::Ok {
                            msg_id: r.msg_id,
                            seq: r.seq,
                        }
                    }
                    Err(e) => outcome_of(&e),
                };
                ops.lock().expect("ops").push(SendOp {
                    conversation,
                    sender: user,
                    client_req_id: tag,
                    invoked_ms,
                    completed_ms: now_ms(epoch),
                    outcome,
                });
            }
        }));
    }

    // Faults on a schedule drawn from the seed.
    let mut rng = StdRng::seed_from_u64(seed);
    let mut faults = Vec::new();
    let period = (Duration::from(args.duration) / 4).max(Duration::from_secs(2));
    while Instant::now() + period < stop {
        tokio::time::sleep(period).await;
        let cells = dev.cell_pids()?;
        if cells.is_empty() {
            break;
        }
        let (name, pid) = cells[rng.random_range(0..cells.len())].clone();
        let kind = match args.scenario {
            Scenario::CellKill => 0,
            Scenario::CellHang => 1,
            Scenario::MigrationUnderLoad => 2,
            Scenario::Mixed => usize::from(rng.random_bool(0.5)),
        };
        let at = now_ms(epoch);
        match kind {
            0 => {
                // SAFETY: signals to a process of the dev deployment under drill.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                faults.push(json!({"at_ms": at, "kind": "kill (SIGKILL)", "target": name}));
            }
            1 => {
                unsafe { libc::kill(pid, libc::SIGSTOP) };
                tokio::time::sleep(Duration::from_secs(3)).await;
                unsafe { libc::kill(pid, libc::SIGCONT) };
                faults.push(
                    json!({"at_ms": at, "kind": "hang 3s (SIGSTOP/SIGCONT)", "target": name}),
                );
            }
            _ => {
                let conversation = conversations[rng.random_range(0..conversations.len())];
                let done = migrate(&dev, conversation, &mut rng).await;
                faults.push(json!({"at_ms": at, "kind": "migrate", "target": done}));
            }
        }
        if let Some(f) = faults.last() {
            println!("  {at:>6} ms  {} {}", f["kind"], f["target"]);
        }
    }
    for w in workers {
        w.await?;
    }
    let ops = std::mem::take(&mut *ops.lock().expect("ops"));

    // Read every conversation back once the deployment has settled.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut history = History {
        sends: ops,
        ..History::default()
    };
    let mut client = MessagingClient::new(channel.clone());
    for &conversation in &conversations {
        let mut stored = Vec::new();
        let mut since = 0;
        let mut floor = 0;
        loop {
            let page = client
                .pull(dev.request(
                    PullRequest {
                        conversation_id: conversation,
                        since_seq: since,
                        direction: Direction::Forward as i32,
                        limit: 500,
                        ..Default::default()
                    },
                    senders[0],
                ))
                .await
                .map_err(|e| {
                    anyhow::anyhow!(
                        "reading back {conversation}: {}",
                        crate::client::describe(&e)
                    )
                })?
                .into_inner();
            floor = floor.max(page.seq_floor);
            stored.extend(page.messages.iter().map(|m| Stored {
                seq: m.seq,
                msg_id: m.msg_id,
                // A tombstone (a reconciled duplicate) has no body.
                tag: if m.state == cellmesh_proto::v1::MessageState::Recalled as i32 {
                    format!("tombstone-{}", m.seq)
                } else {
                    String::from_utf8_lossy(&m.body).into_owned()
                },
            }));
            if !page.has_more || page.next_seq <= since {
                break;
            }
            since = page.next_seq;
        }
        history.conversations.insert(conversation, stored);
        if floor > 0 {
            history.floors.push(Floor {
                conversation,
                floor,
            });
        }
    }
    let verdicts = check_all(&history);
    let count = |f: fn(&Outcome) -> bool| history.sends.iter().filter(|o| f(&o.outcome)).count();
    let acked = count(|o| matches!(o, Outcome::Ok { .. }));
    let rejected = count(|o| matches!(o, Outcome::Rejected { .. }));
    let unknown = count(|o| matches!(o, Outcome::Unknown));
    let ok = verdicts.iter().all(|v| v.holds);
    let mut rejected_by_code = std::collections::BTreeMap::<String, u64>::new();
    for op in &history.sends {
        if let Outcome::Rejected { code } = &op.outcome {
            *rejected_by_code.entry(code.clone()).or_default() += 1;
        }
    }
    let report = json!({
        "scenario": format!("{:?}", args.scenario),
        "seed": seed,
        "duration_ms": Duration::from(args.duration).as_millis() as u64,
        "faults": faults,
        "operations": {"acked": acked, "rejected": rejected, "rejected_by_code": rejected_by_code, "unknown": unknown},
        "verdicts": verdicts,
        "ok": ok,
    });
    println!(
        "operations: {acked} acked, {rejected} rejected {rejected_by_code:?}, {unknown} unknown"
    );
    for v in &verdicts {
        println!(
            "  {:<28} {}",
            v.invariant,
            if v.holds {
                "holds".to_string()
            } else {
                format!(
                    "VIOLATED ({}): {:?}",
                    v.violations,
                    v.counterexamples.first()
                )
            }
        );
    }
    if let Some(path) = &args.report {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")?;
    }
    anyhow::ensure!(
        ok,
        "the drill found violations (seed {seed}); see the report"
    );
    println!("verdict: every invariant holds");
    Ok(())
}
