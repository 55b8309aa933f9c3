//! `cellmesh ctl backup`: a cell's backups. `create` asks the control plane
//! for a backup operation (with `--here`, the cell directly); `list`,
//! `verify` and `delete` call the cell; `restore` runs on the machine of
//! the cell to restore, before it starts, from its config file: it
//! downloads and checks the backup into the empty data dir, asks the
//! backed-up cell's standbys for their high-water marks (so that no seq is
//! reused), and gives every user's sync queue a new identity.

use cellmesh_proto::ids::TenantId;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use cellmesh_cell::backup::{Backups, restore};
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1 as pb;
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::peers::Peers;
use cellmesh_route_client::table::Key;
use clap::Subcommand;

use crate::connect::describe;

#[derive(Subcommand)]
pub enum BackupCommand {
    /// Take a backup of a cell now (an operation of the control plane).
    Create {
        #[arg(long)]
        cell: String,
        /// Then keep only the newest this many (0: all).
        #[arg(long, default_value_t = 0)]
        keep: u32,
        #[arg(long)]
        json: bool,
    },
    /// A cell's backups, oldest first.
    List {
        #[arg(long)]
        cell: String,
        #[arg(long)]
        json: bool,
    },
    /// Restore a backup into a scratch directory on the cell and check it.
    Verify {
        #[arg(long)]
        cell: String,
        /// Empty: the latest.
        #[arg(long, default_value = "")]
        backup: String,
        #[arg(long)]
        json: bool,
    },
    /// Delete a backup (and the files no other backup shares).
    Delete {
        #[arg(long)]
        cell: String,
        #[arg(long)]
        backup: String,
    },
    /// Back up the route table (a router replica's Raft snapshot) into the
    /// backup store a config file's `[backup]` names.
    Routes {
        /// A TOML file with a `[backup]` section (a cell's config will do).
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Fetch and check a route-table backup into FILE, for `cellmesh router
    /// --restore-from FILE` (a new group that serves the same routes).
    RestoreRoutes {
        #[arg(long)]
        config: PathBuf,
        /// Empty: the latest.
        #[arg(long, default_value = "")]
        backup: String,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Restore a cell's database from a backup, before the cell starts.
    Restore {
        /// The config file of the cell to restore (its data dir must not
        /// hold a database; its `[backup]` names the store).
        #[arg(long)]
        config: PathBuf,
        /// The cell whose backup to restore (default: the config's cell).
        #[arg(long)]
        from: Option<String>,
        /// Empty: the latest.
        #[arg(long, default_value = "")]
        backup: String,
        /// Do not ask the standbys for their marks: resume each
        /// conversation above the backup plus what it could have taken
        /// since at its rate limit.
        #[arg(long)]
        no_standbys: bool,
        #[arg(long)]
        json: bool,
    },
}

fn info_json(b: &pb::BackupInfo) -> serde_json::Value {
    serde_json::json!({
        "id": b.id, "cell": b.cell_id, "created_ms": b.created_ms, "release": b.release,
        "route_index": b.route_index, "files": b.files, "bytes": b.bytes,
        "uploaded_files": b.uploaded_files, "uploaded_bytes": b.uploaded_bytes,
        "conversations": b.conversations, "users": b.users,
    })
}

fn print_info(b: &pb::BackupInfo) {
    println!(
        "{}  {}  {} files  {} bytes ({} uploaded)  {} conversations  {} users  release {}",
        b.id, b.cell_id, b.files, b.bytes, b.uploaded_bytes, b.conversations, b.users, b.release
    );
}

/// A call to the `Backups` API of `cell`.
fn request<T>(secret: &ClusterSecret, body: T, timeout: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(body);
    r.set_timeout(timeout);
    secret.attach(&mut r);
    r
}

/// Runs every command but `restore` against the cell.
pub async fn run(
    command: BackupCommand,
    routes: &RouteClient,
    secret: &ClusterSecret,
) -> anyhow::Result<()> {
    let cell = match &command {
        BackupCommand::Create { cell, .. }
        | BackupCommand::List { cell, .. }
        | BackupCommand::Verify { cell, .. }
        | BackupCommand::Delete { cell, .. } => cell.clone(),
        BackupCommand::Routes { config, json } => {
            return backup_routes(routes, config, *json).await;
        }
        BackupCommand::Restore { .. } | BackupCommand::RestoreRoutes { .. } => {
            anyhow::bail!("restores run without a route table")
        }
    };
    let address = routes
        .read(|t| t.cell(&cell).map(|c| c.address.clone()))
        .with_context(|| format!("cell {cell} is not registered"))?;
    let mut client = Peers::default().backups(&address)?;
    let long = Duration::from_secs(6 * 3600);
    let fail = |e: tonic::Status| anyhow::anyhow!("{cell}: {}", describe(&e));
    match command {
        BackupCommand::Create { keep, json, .. } => {
            let info = client
                .create(request(secret, pb::CreateBackupRequest { keep }, long))
                .await
                .map_err(fail)?
                .into_inner();
            if json {
                println!("{}", info_json(&info));
            } else {
                print_info(&info);
            }
        }
        BackupCommand::List { json, .. } => {
            let list = client
                .list(request(secret, pb::ListBackupsRequest {}, long))
                .await
                .map_err(fail)?
                .into_inner()
                .backups;
            if json {
                let rows: Vec<_> = list.iter().map(info_json).collect();
                println!("{}", serde_json::Value::Array(rows));
            } else {
                list.iter().for_each(print_info);
            }
        }
        BackupCommand::Verify { backup, json, .. } => {
            let r = client
                .verify(request(secret, pb::BackupRequest { id: backup }, long))
                .await
                .map_err(fail)?
                .into_inner();
            let info = r.backup.unwrap_or_default();
            if json {
                println!(
                    "{}",
                    serde_json::json!({"backup": info_json(&info), "problems": r.problems,
                        "bytes_read": r.bytes_read, "millis": r.millis})
                );
            } else {
                print_info(&info);
                println!("read {} bytes in {} ms", r.bytes_read, r.millis);
                r.problems.iter().for_each(|p| println!("problem: {p}"));
            }
            anyhow::ensure!(r.problems.is_empty(), "backup {} is damaged", info.id);
            if !json {
                println!("backup {} verified", info.id);
            }
        }
        BackupCommand::Delete { backup, .. } => {
            let left = client
                .delete(request(secret, pb::BackupRequest { id: backup }, long))
                .await
                .map_err(fail)?
                .into_inner()
                .backups;
            println!("deleted; {} backups left", left.len());
        }
        BackupCommand::Routes { .. }
        | BackupCommand::Restore { .. }
        | BackupCommand::RestoreRoutes { .. } => unreachable!("handled above"),
    }
    Ok(())
}

/// The `[backup]` section and data dir of a TOML file (a cell's config).
fn store_of(
    path: &std::path::Path,
) -> anyhow::Result<(cellmesh_cell::backup::BackupConfig, PathBuf)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let mut table: toml::Table =
        toml::from_str(&text).with_context(|| format!("{}", path.display()))?;
    let backup = match table.remove("backup") {
        Some(section) => section.try_into().context("[backup]")?,
        None => anyhow::bail!("{} has no [backup] section", path.display()),
    };
    let data_dir = table
        .get("data_dir")
        .and_then(|d| d.as_str())
        .map_or_else(|| PathBuf::from("."), PathBuf::from);
    Ok((backup, data_dir))
}

/// `backup routes`: the leader's snapshot of the table into the store.
async fn backup_routes(
    routes: &RouteClient,
    config: &std::path::Path,
    json: bool,
) -> anyhow::Result<()> {
    let (store, data_dir) = store_of(config)?;
    let backups = cellmesh_cell::backup::routes::open(&store, &data_dir)?;
    let snapshot = routes
        .snapshot()
        .await
        .map_err(|e| anyhow::anyhow!("route snapshot: {}", describe(&e)))?;
    let m = backups
        .put_routes(&snapshot, cellmesh_operations::now_ms())
        .await?;
    if json {
        println!("{}", serde_json::to_value(&m)?);
    } else {
        println!(
            "route-table backup {}: applied index {}, {} cells, {} routes, {} bytes",
            m.id, m.applied_index, m.cells, m.routes, m.size
        );
    }
    Ok(())
}

/// `backup restore-routes`: a checked route-table backup into a file.
pub async fn run_restore_routes(command: BackupCommand) -> anyhow::Result<()> {
    let BackupCommand::RestoreRoutes {
        config,
        backup,
        out,
        json,
    } = command
    else {
        anyhow::bail!("not a route-table restore");
    };
    let (store, data_dir) = store_of(&config)?;
    let backups = cellmesh_cell::backup::routes::open(&store, &data_dir)?;
    let (m, data) = backups.get_routes(&backup).await?;
    std::fs::write(&out, &data).with_context(|| format!("{}", out.display()))?;
    if json {
        println!("{}", serde_json::to_value(&m)?);
    } else {
        println!(
            "route-table backup {} (applied index {}, {} cells, {} routes) written to {}: start a router with --restore-from {}",
            m.id,
            m.applied_index,
            m.cells,
            m.routes,
            out.display(),
            out.display()
        );
    }
    Ok(())
}

/// `restore`: offline, from the cell's config file.
pub async fn run_restore(
    command: BackupCommand,
    routers: &[String],
    secret: &ClusterSecret,
) -> anyhow::Result<()> {
    let BackupCommand::Restore {
        config,
        from,
        backup,
        no_standbys,
        json,
    } = command
    else {
        anyhow::bail!("not a restore");
    };
    let config = cellmesh_cell::config::CellConfig::load(&config)?;
    let from = from.unwrap_or_else(|| config.cell_id.clone());
    let backups = Backups::open(&config.backup, &from, &config.data_dir)?;
    let manifest = backups.manifest(&backup).await?;
    let held = if no_standbys {
        None
    } else {
        held_marks(routers, secret, &from, &manifest).await
    };
    if held.is_none() {
        eprintln!(
            "no standby of {from} answered with its marks: each conversation resumes above the backup plus what its rate limit allows since"
        );
    }
    let now = cellmesh_operations::now_ms();
    let done = restore::restore(&config, &from, &manifest.id, held, now).await?;
    if json {
        println!("{}", serde_json::to_value(&done)?);
    } else {
        println!(
            "restored backup {} of {} into {}: {} files, {} bytes, {} conversations (widest seq skip {}), {} users rebased",
            done.backup,
            done.from_cell,
            config.data_dir.display(),
            done.files,
            done.bytes,
            done.conversations,
            done.widest_skip,
            done.users_rebased
        );
    }
    Ok(())
}

/// The marks `from`'s holders keep for the backup's conversations (the
/// highest of every holder that answers); `None` when none answers.
async fn held_marks(
    routers: &[String],
    secret: &ClusterSecret,
    from: &str,
    manifest: &cellmesh_cell::backup::Manifest,
) -> Option<HashMap<u64, u64>> {
    let routes = tokio::time::timeout(
        Duration::from_secs(5),
        RouteClient::connect(routers.to_vec(), secret.clone()),
    )
    .await
    .ok()?
    .ok()?;
    let holders: Vec<String> = routes.read(|t| {
        let holders = t
            .cell(from)
            .map(|c| c.mark_holders.clone())
            .unwrap_or_default();
        holders
            .iter()
            .filter_map(|h| t.cell(h).map(|c| c.address.clone()))
            .collect()
    });
    let mut by_tenant: HashMap<u64, Vec<u64>> = HashMap::new();
    for mark in &manifest.conversations {
        by_tenant
            .entry(mark.tenant.get())
            .or_default()
            .push(mark.conversation.get());
    }
    let peers = Peers::default();
    let mut out: Option<HashMap<u64, u64>> = None;
    for address in holders {
        let Ok(mut client) = peers.cell(&address) else {
            continue;
        };
        let mut got = HashMap::new();
        let mut answered = true;
        'tenants: for (&tenant, conversations) in &by_tenant {
            for chunk in conversations.chunks(10_000) {
                let body = pb::GetHighWaterMarksRequest {
                    tenant_id: tenant,
                    conversation_ids: chunk.to_vec(),
                };
                match client
                    .get_high_water_marks(request(secret, body, Duration::from_secs(10)))
                    .await
                {
                    Ok(r) => got.extend(
                        r.into_inner()
                            .marks
                            .into_iter()
                            .map(|m| (m.conversation_id, m.hwm)),
                    ),
                    Err(_) => {
                        answered = false;
                        break 'tenants;
                    }
                }
            }
        }
        if answered {
            let merged = out.get_or_insert_with(HashMap::new);
            for (c, m) in got {
                let e = merged.entry(c).or_default();
                *e = (*e).max(m);
            }
        }
    }
    out
}

/// `ctl tenant export`: each cell that owns some of the tenant exports
/// its part.
pub async fn export_tenant(
    routes: &RouteClient,
    secret: &ClusterSecret,
    tenant: u64,
    json: bool,
) -> anyhow::Result<()> {
    let cells: Vec<(String, String)> = routes.read(|t| {
        let owners: std::collections::BTreeSet<&str> = t
            .routes
            .iter()
            .filter(|(k, _)| k.tenant == TenantId(tenant))
            .map(|(_, e)| e.cell.as_str())
            .collect();
        owners
            .into_iter()
            .filter_map(|id| t.cell(id).map(|c| (c.id.clone(), c.address.clone())))
            .collect()
    });
    anyhow::ensure!(!cells.is_empty(), "tenant {tenant} has no placement");
    let peers = Peers::default();
    let mut out = Vec::new();
    for (cell, address) in cells {
        let body = pb::ExportTenantRequest { tenant_id: tenant };
        let info = peers
            .backups(&address)?
            .export_tenant(request(secret, body, Duration::from_secs(6 * 3600)))
            .await
            .map_err(|e| anyhow::anyhow!("{cell}: {}", describe(&e)))?
            .into_inner();
        if !json {
            println!(
                "{cell}: export {} of tenant {tenant}: {} conversations, {} messages, {} bytes",
                info.id, info.conversations, info.messages, info.bytes
            );
            info.keys.iter().for_each(|k| println!("  {k}"));
        }
        out.push(serde_json::json!({
            "cell": cell, "id": info.id, "conversations": info.conversations,
            "messages": info.messages, "bytes": info.bytes, "keys": info.keys,
        }));
    }
    if json {
        println!("{}", serde_json::Value::Array(out));
    }
    Ok(())
}

/// `ctl tenant restore`.
#[derive(clap::Args, Debug)]
pub struct RestoreExportArgs {
    #[arg(long)]
    tenant: u64,
    /// The export's id (`ctl tenant export` prints it).
    #[arg(long)]
    export: String,
    #[arg(long)]
    into: Option<u64>,
    #[arg(long)]
    conversation: Option<u64>,
    #[arg(long)]
    json: bool,
}

/// `ctl tenant restore`: the cell that owns the tenant restored into
/// restores the export from its backup store.
pub async fn restore_export(
    routes: &RouteClient,
    secret: &ClusterSecret,
    args: RestoreExportArgs,
) -> anyhow::Result<()> {
    let RestoreExportArgs {
        tenant,
        export,
        into,
        conversation,
        json,
    } = args;
    let body = pb::RestoreExportRequest {
        tenant_id: tenant,
        export_id: export,
        into_tenant_id: into.unwrap_or(tenant),
        conversation_id: conversation.unwrap_or(0),
    };
    let into = TenantId(body.into_tenant_id);
    let route = routes
        .resolve(&Key::tenant(into))
        .ok_or_else(|| anyhow::anyhow!("tenant {into} has no placement: place it first"))?;
    let cell = route.entry.cell.clone();
    let info = Peers::default()
        .backups(&route.cell_address)?
        .restore_export(request(secret, body, Duration::from_secs(6 * 3600)))
        .await
        .map_err(|e| anyhow::anyhow!("{cell}: {}", describe(&e)))?
        .into_inner();
    if json {
        let restored: Vec<_> = info
            .conversations
            .iter()
            .map(|c| serde_json::json!({
                "from": c.from_conversation_id, "to": c.to_conversation_id, "messages": c.messages,
            }))
            .collect();
        println!(
            "{}",
            serde_json::json!({"cell": cell, "tenant": info.into_tenant_id, "conversations": restored})
        );
        return Ok(());
    }
    for c in &info.conversations {
        println!(
            "{cell}: conversation {} restored as {} of tenant {} ({} messages)",
            c.from_conversation_id, c.to_conversation_id, info.into_tenant_id, c.messages
        );
    }
    Ok(())
}
