//! `cellmesh ctl`: operator commands against the route table — cells,
//! routes, tenant placement, router replicas — and client token issuing.
//! Every read command takes `--json`.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use std::time::Duration;

use cellmesh_control_plane::migration::MigrationOptions;
use cellmesh_edge::auth::{Claims, TokenKey, now_secs};
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::table::Key;
use clap::{Args, Subcommand};

use crate::connect::describe;

pub mod backfill;
mod backup;
mod hold;
mod moves;
mod ops;
mod status;
mod table;
mod upgrade;

#[derive(Args)]
pub struct CtlArgs {
    /// Routing API endpoints, comma-separated.
    #[arg(
        long,
        env = "CELLMESH_ROUTERS",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:7300"
    )]
    routers: Vec<String>,
    /// The deployment's shared secret.
    #[arg(
        long,
        env = "CELLMESH_CLUSTER_SECRET",
        default_value = "",
        hide_env_values = true
    )]
    secret: String,
    /// Take routers, secret and the operator's certificate from a running
    /// `cellmesh dev` (its data dir).
    #[arg(long, env = "CELLMESH_DEV")]
    dev: Option<std::path::PathBuf>,
    /// Mutual TLS: the deployment's CA and the operator's certificate and
    /// key (PEM), for a deployment whose processes run with `[tls]`.
    #[arg(long, env = "CELLMESH_TLS_CA", default_value = "")]
    tls_ca: String,
    #[arg(long, env = "CELLMESH_TLS_CERT", default_value = "")]
    tls_cert: String,
    #[arg(long, env = "CELLMESH_TLS_KEY", default_value = "")]
    tls_key: String,
    /// etcd endpoints (for the control-plane leader in `status`).
    #[arg(long, env = "CELLMESH_ETCD", value_delimiter = ',')]
    etcd: Vec<String>,
    /// The lock-file directory of control-plane replicas sharing one host
    /// (`coordination.backend = "local"`), for the leader in `status`.
    #[arg(long)]
    coordination_dir: Option<std::path::PathBuf>,
    /// Admin API endpoints of the control-plane replicas, comma-separated
    /// (for `ops` and `hold`).
    #[arg(
        long,
        env = "CELLMESH_CONTROL_PLANE",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:7101"
    )]
    control_plane: Vec<String>,
    /// Run `migrate`, `drain` and `failback` in this process instead of
    /// handing them to the control plane as operations (a deployment
    /// without a control plane; the move stops if this process does).
    #[arg(long)]
    here: bool,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Args)]
struct TokenArgs {
    #[arg(long)]
    tenant: u64,
    #[arg(long)]
    user: u64,
    #[arg(long, default_value = "cli")]
    device: String,
    /// How long the token is valid, e.g. `24h`.
    #[arg(long, default_value = "24h")]
    ttl: humantime::Duration,
    /// The edge's token secret (or, with `--key-id`, the secret of that
    /// key in the edge's `token_keys`).
    #[arg(long, env = "CELLMESH_TOKEN_SECRET", hide_env_values = true)]
    token_secret: String,
    /// Sign with the edge's `token_keys` entry of this id.
    #[arg(long, default_value = "")]
    key_id: String,
}

#[derive(Subcommand)]
enum CtlCommand {
    /// Issue a client token for the edge.
    Token(TokenArgs),
    /// The deployment at a glance: cells by region, routers, control-plane
    /// leader, migrations with progress.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Operations the control plane runs and records (moves, drains,
    /// failbacks): they finish whoever started them.
    Ops {
        #[command(subcommand)]
        command: ops::OpsCommand,
    },
    /// Registered cells with region, address and status.
    Cells {
        #[arg(long)]
        json: bool,
    },
    /// Route table lookups.
    Routes {
        #[command(subcommand)]
        command: RoutesCommand,
    },
    /// Tenant placement.
    Tenant {
        #[command(subcommand)]
        command: TenantCommand,
    },
    /// Rolling upgrades: each process's release and the cluster version
    /// (`status`), and raising it once every process runs the new release
    /// (`finalize`).
    Upgrade {
        #[command(subcommand)]
        command: upgrade::UpgradeCommand,
    },
    /// A cell's backups: take one (an operation of the control plane),
    /// list, verify, delete; restore one before the cell starts.
    Backup {
        #[command(subcommand)]
        command: backup::BackupCommand,
    },
    /// The router replicas: role, leader, term, applied index.
    Routers {
        #[arg(long)]
        json: bool,
    },
    /// Move a conversation to another cell (copy, catch up, freeze, verify,
    /// switch). Running it again resumes an interrupted move.
    Migrate {
        #[command(subcommand)]
        command: MigrateCommand,
    },
    /// Fail a cell over now (a drill, or a cell known to be bad): mark it
    /// Down and move everything it owns to its fallback.
    Fail {
        cell: String,
        /// Seq floor margin above each conversation's checkpoint.
        #[arg(long, default_value_t = 1000)]
        margin: u64,
        /// Wait this long between marking the cell Down and moving its
        /// routes: the cells' `routing.owner_lease_ms`, after which a cell
        /// cut off from the route table has stopped writing. `0s` when the
        /// cell is known to be dead.
        #[arg(long, default_value = "2s")]
        fence: humantime::Duration,
    },
    /// Copy the history a failed-over cell holds (what it acknowledged
    /// before its failover) into its conversations' current owners again:
    /// the control plane does it when the cell returns, and gives up after
    /// about 15 s of failed copies. Safe to run again.
    Backfill {
        cell: String,
        #[arg(long)]
        json: bool,
    },
    /// Hold a cell's failover for a planned restart (an upgrade, a host's
    /// reboot): while it is away the control plane neither fences it nor
    /// fails it over, until `--for` has passed or `--release`; a cell still
    /// failing then is failed over as usual. Without a cell: the holds in
    /// force.
    Hold(hold::HoldArgs),
    /// Stop placing anything on a cell and move everything it owns (its
    /// tenants and conversation overrides) to another cell by live
    /// migration. Running it again resumes.
    Drain {
        cell: String,
        /// Where to (default: the cell's fallback, same region first).
        #[arg(long)]
        to: Option<String>,
        /// Conversations moved at a time.
        #[arg(long, default_value_t = 8)]
        parallel: usize,
    },
    /// Move back, by live migration, every tenant and conversation a
    /// failover took from CELL (once it is Up again and backfilled).
    Failback {
        cell: String,
        /// Conversations moved at a time.
        #[arg(long, default_value_t = 8)]
        parallel: usize,
    },
    /// Migrations in progress (from the route table), and cancelling one.
    Migrations {
        #[command(subcommand)]
        command: Option<MigrationsCommand>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum MigrateCommand {
    /// Move a whole tenant as one workflow: copy, catch up, verify, one
    /// freeze, one switch of the tenant's entry.
    Tenant {
        #[arg(long)]
        tenant: u64,
        #[arg(long)]
        to: String,
        /// Copies (conversations, homes) in flight at a time.
        #[arg(long, default_value_t = 8)]
        parallel: usize,
        /// Messages and sync events copied per second at most (0: no limit).
        #[arg(long, default_value_t = 0)]
        rate: u64,
        /// File bytes copied into the target's region per second at most
        /// (0: the target cell's own limit).
        #[arg(long, default_value_t = 0)]
        file_rate: u64,
        #[arg(long)]
        json: bool,
    },
    /// Move one user's home: sync queue, conversation list, mute flags and
    /// device cursors; devices go on from their cursors on the new cell.
    User {
        #[arg(long)]
        tenant: u64,
        #[arg(long)]
        user: u64,
        #[arg(long)]
        to: String,
        #[arg(long)]
        json: bool,
    },
    Conversation {
        #[arg(long)]
        tenant: u64,
        #[arg(long)]
        conversation: u64,
        #[arg(long)]
        to: String,
        /// Messages per copied chunk.
        #[arg(long, default_value_t = 1000)]
        chunk: u32,
        /// Pause between copy rounds (throttle), e.g. `100ms`.
        #[arg(long, default_value = "0s")]
        pause: humantime::Duration,
        /// At most this many messages per copy round (throttle; 0 = all).
        #[arg(long, default_value_t = 0)]
        round_messages: u32,
    },
}

/// A route key: a conversation, a user's home, or (with neither) the
/// tenant itself.
#[derive(clap::Args)]
struct KeyArgs {
    #[arg(long)]
    tenant: u64,
    #[arg(long, conflicts_with = "user")]
    conversation: Option<u64>,
    #[arg(long)]
    user: Option<u64>,
}

impl KeyArgs {
    fn key(&self) -> Key {
        match (self.conversation, self.user) {
            (Some(c), _) => Key::conversation(TenantId(self.tenant), ConversationId(c)),
            (_, Some(u)) => Key::user(TenantId(self.tenant), UserId(u)),
            _ => Key::tenant(TenantId(self.tenant)),
        }
    }
}

#[derive(Subcommand)]
enum MigrationsCommand {
    /// Roll a migration back: the route returns to Active on its source.
    Cancel(KeyArgs),
    /// Hold a migration between copy rounds (its migrator waits).
    Pause(KeyArgs),
    /// Let a paused migration go on.
    Resume(KeyArgs),
}

#[derive(Subcommand)]
enum RoutesCommand {
    /// Where a tenant, conversation or user home lives.
    Get {
        #[command(flatten)]
        key: KeyArgs,
        /// Ask the leader (read index) instead of the local cache.
        #[arg(long)]
        linearizable: bool,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum TenantCommand {
    /// Place a new tenant on a cell (and bind it to regions).
    Place {
        tenant: u64,
        #[arg(long)]
        cell: String,
        /// The regions its data may live in (comma-separated; none: any).
        #[arg(long, value_delimiter = ',')]
        regions: Vec<String>,
    },
    /// Show the regions a tenant's data may live in; `--regions a,b` binds
    /// it to those (refused while it lives elsewhere), `--any` unbinds it.
    Residency {
        tenant: u64,
        #[arg(long, value_delimiter = ',', conflicts_with = "any")]
        regions: Vec<String>,
        #[arg(long)]
        any: bool,
    },
    /// Export a tenant's conversations, members and messages (hot and cold)
    /// as JSON lines into each owning cell's backup store.
    Export {
        #[arg(long)]
        tenant: u64,
        #[arg(long)]
        json: bool,
    },
    /// Restore an export beside the live data: each conversation (or the
    /// one named) becomes a new conversation of `--into` (default: the
    /// exported tenant), on the cell that owns that tenant.
    Restore(backup::RestoreExportArgs),
}

/// `ctl tenant ...`.
async fn tenant(
    routes: &RouteClient,
    secret: &ClusterSecret,
    command: TenantCommand,
) -> anyhow::Result<()> {
    match command {
        TenantCommand::Place {
            tenant,
            cell,
            regions,
        } => table::place_tenant(routes, TenantId(tenant), &cell, &regions).await?,
        TenantCommand::Residency {
            tenant,
            regions,
            any,
        } => {
            let bind = (any || !regions.is_empty()).then_some(regions.as_slice());
            table::residency(routes, TenantId(tenant), bind).await?
        }
        TenantCommand::Export { tenant, json } => {
            backup::export_tenant(routes, secret, tenant, json).await?
        }
        TenantCommand::Restore(args) => backup::restore_export(routes, secret, args).await?,
    }
    Ok(())
}

/// The operation a move, drain or failback command asks the control plane
/// for; `None` for the other commands.
fn as_operation(command: &CtlCommand) -> anyhow::Result<Option<ops::StartCommand>> {
    use ops::StartCommand as Start;
    Ok(Some(match command {
        CtlCommand::Migrate {
            command:
                MigrateCommand::Tenant {
                    tenant,
                    to,
                    parallel,
                    rate,
                    file_rate,
                    ..
                },
        } => Start::Tenant {
            tenant: *tenant,
            to: to.clone(),
            parallel: *parallel as u32,
            rate: *rate,
            file_rate: *file_rate,
        },
        CtlCommand::Migrate {
            command: MigrateCommand::User {
                tenant, user, to, ..
            },
        } => Start::User {
            tenant: *tenant,
            user: *user,
            to: to.clone(),
        },
        CtlCommand::Migrate {
            command:
                MigrateCommand::Conversation {
                    tenant,
                    conversation,
                    to,
                    chunk,
                    pause,
                    round_messages,
                },
        } => {
            anyhow::ensure!(
                *chunk == 1000 && pause.is_zero() && *round_messages == 0,
                "--chunk, --pause and --round-messages tune a move run here: add --here"
            );
            Start::Conversation {
                tenant: *tenant,
                conversation: *conversation,
                to: to.clone(),
            }
        }
        CtlCommand::Drain { cell, to, parallel } => Start::Drain {
            cell: cell.clone(),
            to: to.clone(),
            parallel: *parallel as u32,
        },
        CtlCommand::Failback { cell, parallel } => Start::Failback {
            cell: cell.clone(),
            parallel: *parallel as u32,
        },
        CtlCommand::Backup {
            command: backup::BackupCommand::Create { cell, keep, .. },
        } => Start::Backup {
            cell: cell.clone(),
            keep: *keep,
        },
        _ => return Ok(None),
    }))
}

pub async fn run(mut args: CtlArgs) -> anyhow::Result<()> {
    if let Some(dir) = args.dev.clone() {
        fill_from_dev(&mut args, &dir)?;
    }
    let secret = install_credentials(&args)?;
    match args.command {
        CtlCommand::Ops { command } => {
            return ops::run(&args.control_plane, &secret, command).await;
        }
        CtlCommand::Hold(hold) => return hold::run(&args.control_plane, &secret, hold).await,
        CtlCommand::Backup {
            command: command @ backup::BackupCommand::Restore { .. },
        } => return backup::run_restore(command, &args.routers, &secret).await,
        CtlCommand::Backup {
            command: command @ backup::BackupCommand::RestoreRoutes { .. },
        } => return backup::run_restore_routes(command).await,
        CtlCommand::Token(token) => return print_token(&token),
        CtlCommand::Upgrade {
            command: command @ upgrade::UpgradeCommand::Process { .. },
        } => return upgrade::run_process(command, args.dev.as_deref()).await,
        _ => {}
    }
    if !args.here
        && let Some(what) = as_operation(&args.command)?
    {
        let start = ops::OpsCommand::Start {
            what,
            detach: false,
        };
        return ops::run(&args.control_plane, &secret, start).await;
    }
    let routes = RouteClient::connect(args.routers.clone(), secret.clone())
        .await
        .map_err(|e| anyhow::anyhow!("cannot read the route table: {}", describe(&e)))?;
    match args.command {
        CtlCommand::Token(_) | CtlCommand::Ops { .. } | CtlCommand::Hold(_) => {
            unreachable!("handled above")
        }
        CtlCommand::Status { json } => status::show(&routes, &args, &secret, json).await?,
        CtlCommand::Upgrade { command } => {
            upgrade::run(command, &routes, &args.routers, &secret).await?
        }
        CtlCommand::Backup { command } => backup::run(command, &routes, &secret).await?,
        CtlCommand::Cells { json } => table::cells(&routes, json)?,
        CtlCommand::Routes {
            command:
                RoutesCommand::Get {
                    key,
                    linearizable,
                    json,
                },
        } => table::route(&routes, &key, linearizable, json).await?,
        CtlCommand::Tenant { command } => tenant(&routes, &secret, command).await?,
        CtlCommand::Migrate {
            command:
                MigrateCommand::Conversation {
                    tenant,
                    conversation,
                    to,
                    chunk,
                    pause,
                    round_messages,
                },
        } => {
            let options = MigrationOptions {
                chunk,
                pause: pause.into(),
                round_messages,
                ..MigrationOptions::default()
            };
            let what = (TenantId(tenant), ConversationId(conversation), to.as_str());
            moves::migrate_conversation(routes, secret, what, options).await?
        }
        CtlCommand::Migrate {
            command:
                MigrateCommand::Tenant {
                    tenant,
                    to,
                    parallel,
                    rate,
                    file_rate,
                    json,
                },
        } => {
            let limits = (parallel, rate, file_rate);
            moves::migrate_tenant(routes, secret, tenant, &to, limits, json).await?
        }
        CtlCommand::Migrate {
            command:
                MigrateCommand::User {
                    tenant,
                    user,
                    to,
                    json,
                },
        } => moves::migrate_user(routes, secret, tenant, user, &to, json).await?,
        CtlCommand::Drain { cell, to, parallel } => {
            moves::drain(routes, secret, &cell, to, parallel).await?
        }
        CtlCommand::Failback { cell, parallel } => {
            moves::failback(routes, secret, &cell, parallel).await?
        }
        CtlCommand::Fail {
            cell,
            margin,
            fence,
        } => table::fail(&routes, &cell, margin, fence).await?,
        CtlCommand::Backfill { cell, json } => {
            backfill::show(&routes, &secret, &cell, json).await?
        }
        CtlCommand::Migrations { command, json } => {
            table::migrations(&routes, command, json).await?
        }
        CtlCommand::Routers { json } => table::routers(&args.routers, &secret, json).await?,
    }
    Ok(())
}

/// The operator's certificate for this process's calls (when given), and
/// the cluster secret.
fn install_credentials(args: &CtlArgs) -> anyhow::Result<ClusterSecret> {
    cellmesh_proto::tls::install(&cellmesh_proto::tls::TlsConfig {
        ca_file: args.tls_ca.clone(),
        cert_file: args.tls_cert.clone(),
        key_file: args.tls_key.clone(),
        ..Default::default()
    })
    .map_err(anyhow::Error::msg)?;
    Ok(ClusterSecret::new(&args.secret))
}

/// `--dev DIR`: the routers, secret, etcd, control plane and TLS files of
/// the `cellmesh dev` deployment in DIR, where not given.
fn fill_from_dev(args: &mut CtlArgs, dir: &std::path::Path) -> anyhow::Result<()> {
    let dev = cellmesh_chaos::target::DevTarget::load(dir)?;
    dev.fill_routing(&mut args.routers, &mut args.secret, &mut args.etcd);
    if args.etcd.is_empty() && args.coordination_dir.is_none() {
        args.coordination_dir = Some(dir.join("coordination"));
    }
    let dev = cellmesh_chaos::target::DevTarget::load(dir)?;
    if !dev.admin.is_empty() {
        args.control_plane = dev.admin;
    }
    if args.tls_ca.is_empty() {
        (args.tls_ca, args.tls_cert, args.tls_key) =
            (dev.tls.ca_file, dev.tls.cert_file, dev.tls.key_file);
    }
    Ok(())
}

/// `ctl token`: prints a client token signed with `--token-secret`.
fn print_token(token: &TokenArgs) -> anyhow::Result<()> {
    let TokenArgs {
        tenant,
        user,
        device,
        ttl,
        token_secret,
        key_id,
    } = token;
    anyhow::ensure!(
        token_secret.len() >= 16,
        "--token-secret must be at least 16 bytes"
    );
    let claims = Claims {
        tenant: TenantId(*tenant),
        user: UserId(*user),
        device: device.clone(),
        exp: now_secs() + Duration::from(*ttl).as_secs(),
        ..Default::default()
    };
    let key = match key_id.as_str() {
        "" => TokenKey::new(token_secret),
        id => TokenKey::new(token_secret)
            .with_keys(&[(id.to_string(), token_secret.clone())].into())
            .issuing_with(id),
    };
    println!("{}", key.issue(&claims));
    Ok(())
}
