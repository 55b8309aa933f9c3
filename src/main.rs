//! `cellmesh`: the one operator binary. Each subcommand is a role (`cell`,
//! `router`, `edge`, `control-plane`) or a tool (`dev`, `ctl`, `chat`,
//! `chaos`, `bench`, `plan`, each in its own crate); this file only parses flags,
//! sets up logging and hands over to library code.

mod roles;
mod telemetry;

use cellmesh_bench as bench;
use cellmesh_client::{chat, ctl, plan};

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Every role allocates through mimalloc: the message path makes many small,
/// short-lived allocations on two threads or more, where it beats the system
/// allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "cellmesh",
    version,
    about = "Cell-based instant messaging for enterprise operators"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A whole multi-region deployment on this machine, one process per
    /// component, with a demo tenant.
    Dev(cellmesh_deployment::dev::DevArgs),
    /// Run one cell: the message service over RocksDB.
    Cell(roles::CellArgs),
    /// Run one RoutingService replica (Raft over RocksDB).
    Router(roles::RouterArgs),
    /// Run the client-facing edge: token checks and routing to cells.
    Edge(roles::EdgeArgs),
    /// Run the control plane: cell health probes and failover.
    ControlPlane(roles::ControlPlaneArgs),
    /// Operator commands against the route table.
    Ctl(ctl::CtlArgs),
    /// A small client: create conversations, send, read history.
    Chat(chat::ChatArgs),
    /// Chaos drills against a running `cellmesh dev`, with a verdict.
    Chaos(cellmesh_chaos::drill::ChaosArgs),
    /// Load generators that print throughput and latency percentiles.
    Bench(bench::BenchArgs),
    /// Certificates of a deployment's own CA (`cellmesh dev --tls` makes
    /// one): issue or renew in place, revoke; running processes reload.
    Pki(cellmesh_deployment::dev::pki::PkiArgs),
    /// Size a deployment from its expected load: cells, routers, disks,
    /// Kafka partitions, and tfvars for `terraform/envs/example`.
    Plan(plan::PlanArgs),
}

impl Command {
    fn sets_up_logging(&self) -> bool {
        matches!(
            self,
            Command::Cell(_)
                | Command::Router(_)
                | Command::Edge(_)
                | Command::ControlPlane(_)
                | Command::Chaos(_)
        )
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A role (or a drill) sets up logging once it knows where traces go.
    if !cli.command.sets_up_logging() {
        telemetry::init();
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Dev(args) => cellmesh_deployment::dev::run(args).await,
            Command::Cell(args) => roles::run_cell(args).await,
            Command::Router(args) => roles::run_router(args).await,
            Command::Edge(args) => roles::run_edge(args).await,
            Command::ControlPlane(args) => roles::run_control_plane(args).await,
            Command::Ctl(args) => ctl::run(args).await,
            Command::Pki(args) => cellmesh_deployment::dev::pki::run(args),
            Command::Chat(args) => chat::run(args).await,
            Command::Bench(args) => bench::run(args).await,
            Command::Chaos(args) => {
                // A drill is a trace in the deployment it runs against.
                let identity = cellmesh_telemetry::trace::Identity {
                    role: "chaos",
                    ..Default::default()
                };
                let _traces = telemetry::init_traced(&args.traces(), identity)?;
                cellmesh_chaos::drill::run(args).await
            }
            Command::Plan(args) => plan::run(args),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", describe(&e));
            ExitCode::from(2)
        }
    }
}

/// The error and its causes on one line, skipping a cause whose text the
/// line already holds (wrapping errors often repeat their source).
fn describe(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}
