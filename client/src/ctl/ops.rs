//! `cellmesh ctl ops`: the control plane's operations — start a move,
//! drain or failback that the active control-plane replica runs and
//! records (it finishes if this command, or that replica, dies), list
//! them, follow one's progress, cancel one.

use anyhow::Context;
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::tls::Dial;
use cellmesh_proto::v1 as pb;
use cellmesh_proto::v1::operations_client::OperationsClient;
use cellmesh_proto::v1::start_operation_request::Spec;
use clap::Subcommand;
use tonic::transport::Channel;

use crate::connect::describe;

#[derive(Subcommand)]
pub enum OpsCommand {
    /// Start an operation and follow it (`--detach`: print its id only).
    Start {
        #[command(subcommand)]
        what: StartCommand,
        #[arg(long, global = true)]
        detach: bool,
    },
    /// Every recorded operation.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Follow an operation until it ends.
    Watch { id: String },
    /// Stop an operation (a move's route is cancelled: the key stays put).
    Cancel { id: String },
    /// Hold a move before its next copy round or its freeze.
    Pause { id: String },
    /// Let a paused move go on.
    Resume { id: String },
}

#[derive(Subcommand)]
pub enum StartCommand {
    /// A whole tenant, its entry last.
    Tenant {
        #[arg(long)]
        tenant: u64,
        #[arg(long)]
        to: String,
        #[arg(long, default_value_t = 8)]
        parallel: u32,
        /// Messages and sync events copied per second at most (0: no limit).
        #[arg(long, default_value_t = 0)]
        rate: u64,
        /// File bytes copied into the target's region per second at most
        /// (0: the target cell's own limit).
        #[arg(long, default_value_t = 0)]
        file_rate: u64,
    },
    /// One conversation.
    Conversation {
        #[arg(long)]
        tenant: u64,
        #[arg(long)]
        conversation: u64,
        #[arg(long)]
        to: String,
    },
    /// One user's home.
    User {
        #[arg(long)]
        tenant: u64,
        #[arg(long)]
        user: u64,
        #[arg(long)]
        to: String,
    },
    /// Move everything a cell owns elsewhere (default: its fallback).
    Drain {
        cell: String,
        #[arg(long)]
        to: Option<String>,
        #[arg(long, default_value_t = 8)]
        parallel: u32,
    },
    /// Move back what a failover took from a cell.
    Failback {
        cell: String,
        #[arg(long, default_value_t = 8)]
        parallel: u32,
    },
    /// A backup of a cell, then only its newest `--keep` kept (0: all).
    Backup {
        cell: String,
        #[arg(long, default_value_t = 0)]
        keep: u32,
    },
}

/// A client of the first control-plane replica that answers.
pub(super) async fn connect(endpoints: &[String]) -> anyhow::Result<OperationsClient<Channel>> {
    let mut last = None;
    for endpoint in endpoints {
        match cellmesh_proto::tls::endpoint(endpoint.clone())?
            .dial()
            .await
        {
            Ok(channel) => return Ok(OperationsClient::new(channel)),
            Err(e) => last = Some(e),
        }
    }
    Err(anyhow::anyhow!(
        "no control plane answers at {endpoints:?}: {last:?}"
    ))
}

pub(super) fn request<T>(secret: &ClusterSecret, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    secret.attach(&mut request);
    request
}

fn state(op: &pb::OperationInfo) -> &'static str {
    match pb::OperationState::try_from(op.state).unwrap_or_default() {
        pb::OperationState::Pending => "pending",
        pb::OperationState::Running => "running",
        pb::OperationState::Succeeded => "succeeded",
        pb::OperationState::Failed => "failed",
        pb::OperationState::Cancelled => "cancelled",
        pb::OperationState::Paused => "paused",
        pb::OperationState::Unspecified => "?",
    }
}

fn line(op: &pb::OperationInfo) -> String {
    let mut progress = match (op.total, op.done) {
        (0, 0) => String::new(),
        (0, done) => format!(" {done}"),
        (total, done) => format!(" {done}/{total}"),
    };
    if op.rows_copied > 0 {
        progress += &format!(
            ", {} rows ({:.1} MB) copied, {} behind",
            op.rows_copied,
            op.bytes_copied as f64 / 1e6,
            op.lag
        );
        if op.eta_ms > 0 && op.state == pb::OperationState::Running as i32 {
            progress += &format!(", ETA {} s", op.eta_ms.div_ceil(1000));
        }
    }
    if op.frozen_ms > 0 {
        progress += &format!(", frozen {} ms", op.frozen_ms);
    }
    if op.files_total > 0 {
        progress += &format!(
            ", files {}/{} ({:.1}/{:.1} MB) in the target's region",
            op.files_copied,
            op.files_total,
            op.file_bytes_copied as f64 / 1e6,
            op.file_bytes_total as f64 / 1e6
        );
    }
    let runner = if op.runner.is_empty() {
        String::new()
    } else {
        format!(" on {}", op.runner)
    };
    format!(
        "{} {} [{}{}{}]{}{}",
        op.id,
        op.description,
        state(op),
        if op.phase.is_empty() {
            String::new()
        } else {
            format!(" {}", op.phase)
        },
        progress,
        runner,
        if op.message.is_empty() {
            String::new()
        } else {
            format!(": {}", op.message)
        }
    )
}

pub async fn run(
    endpoints: &[String],
    secret: &ClusterSecret,
    command: OpsCommand,
) -> anyhow::Result<()> {
    let mut client = connect(endpoints).await?;
    match command {
        OpsCommand::Start { what, detach } => {
            let spec = match what {
                StartCommand::Tenant {
                    tenant,
                    to,
                    parallel,
                    rate,
                    file_rate,
                } => Spec::MoveTenant(pb::MoveTenantSpec {
                    tenant_id: tenant,
                    to_cell: to,
                    parallel,
                    rate,
                    file_rate,
                }),
                StartCommand::Conversation {
                    tenant,
                    conversation,
                    to,
                } => Spec::MoveConversation(pb::MoveConversationSpec {
                    tenant_id: tenant,
                    conversation_id: conversation,
                    to_cell: to,
                }),
                StartCommand::User { tenant, user, to } => Spec::MoveUser(pb::MoveUserSpec {
                    tenant_id: tenant,
                    user_id: user,
                    to_cell: to,
                }),
                StartCommand::Drain { cell, to, parallel } => Spec::Drain(pb::DrainSpec {
                    cell_id: cell,
                    to_cell: to.unwrap_or_default(),
                    parallel,
                }),
                StartCommand::Failback { cell, parallel } => Spec::Failback(pb::FailbackSpec {
                    cell_id: cell,
                    parallel,
                }),
                StartCommand::Backup { cell, keep } => Spec::Backup(pb::BackupSpec {
                    cell_id: cell,
                    keep,
                }),
            };
            let op = client
                .start(request(
                    secret,
                    pb::StartOperationRequest { spec: Some(spec) },
                ))
                .await
                .map_err(|e| anyhow::anyhow!(describe(&e)))?
                .into_inner();
            if detach {
                println!("{}", op.id);
                return Ok(());
            }
            follow(&mut client, secret, op.id).await
        }
        OpsCommand::List { json } => {
            let ops = client
                .list(request(secret, pb::ListOperationsRequest {}))
                .await
                .map_err(|e| anyhow::anyhow!(describe(&e)))?
                .into_inner()
                .operations;
            if json {
                let rows: Vec<_> = ops
                    .iter()
                    .map(|op| {
                        serde_json::json!({
                            "id": op.id, "description": op.description, "state": state(op),
                            "phase": op.phase, "done": op.done, "total": op.total,
                            "rows_copied": op.rows_copied, "lag": op.lag, "frozen_ms": op.frozen_ms,
                            "bytes_copied": op.bytes_copied, "eta_ms": op.eta_ms,
                            "message": op.message, "runner": op.runner,
                            "created_ms": op.created_ms, "updated_ms": op.updated_ms,
                        })
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else if ops.is_empty() {
                println!("no operations");
            } else {
                for op in &ops {
                    println!("{}", line(op));
                }
            }
            Ok(())
        }
        OpsCommand::Watch { id } => follow(&mut client, secret, id).await,
        OpsCommand::Cancel { id } => {
            let op = client.cancel(request(secret, pb::OperationRequest { id }));
            asked(op.await, "cancel")
        }
        OpsCommand::Pause { id } => {
            let op = client.pause(request(secret, pb::OperationRequest { id }));
            asked(op.await, "pause")
        }
        OpsCommand::Resume { id } => {
            let op = client.resume(request(secret, pb::OperationRequest { id }));
            asked(op.await, "resume")
        }
    }
}

/// Prints the operation an operator's request was recorded on.
fn asked(
    answer: Result<tonic::Response<pb::OperationInfo>, tonic::Status>,
    what: &str,
) -> anyhow::Result<()> {
    let op = answer
        .map_err(|e| anyhow::anyhow!(describe(&e)))?
        .into_inner();
    println!("{} ({what} asked)", line(&op));
    Ok(())
}

/// Prints an operation's progress until it ends; an error unless it
/// succeeded.
async fn follow(
    client: &mut OperationsClient<Channel>,
    secret: &ClusterSecret,
    id: String,
) -> anyhow::Result<()> {
    let mut stream = client
        .watch(request(secret, pb::OperationRequest { id: id.clone() }))
        .await
        .map_err(|e| anyhow::anyhow!(describe(&e)))?
        .into_inner();
    let mut last = None;
    while let Some(op) = stream
        .message()
        .await
        .map_err(|e| anyhow::anyhow!(describe(&e)))
        .context("following the operation")?
    {
        println!("{}", line(&op));
        last = Some(op);
    }
    match last {
        Some(op) if op.state == pb::OperationState::Succeeded as i32 => Ok(()),
        Some(op) => Err(anyhow::anyhow!("{} ended {}", op.id, state(&op))),
        None => Err(anyhow::anyhow!("{id}: no answer")),
    }
}
