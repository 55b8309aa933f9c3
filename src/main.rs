//! `cellmesh`: the one operator binary. Each subcommand is a role (`cell`)
//! or a tool (`chat`, `bench`); this file only parses flags, sets up logging
//! and hands over to library code.

mod bench;
mod chat;
mod client;
mod telemetry;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use cellmesh_cell::CellConfig;
use clap::{Parser, Subcommand};

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
    /// Run one cell: the message service over RocksDB.
    Cell(CellArgs),
    /// A small client: create conversations, send, read history.
    Chat(chat::ChatArgs),
    /// Load generators that print throughput and latency percentiles.
    Bench(bench::BenchArgs),
}

#[derive(clap::Args)]
struct CellArgs {
    /// TOML config file; every field has a default.
    #[arg(long, env = "CELLMESH_CONFIG")]
    config: Option<PathBuf>,
    /// Overrides `listen`.
    #[arg(long, env = "CELLMESH_LISTEN")]
    listen: Option<SocketAddr>,
    /// Overrides `data_dir`.
    #[arg(long, env = "CELLMESH_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Overrides `cell_id`.
    #[arg(long, env = "CELLMESH_CELL_ID")]
    cell_id: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Cell(args) => run_cell(args).await,
            Command::Chat(args) => chat::run(args).await,
            Command::Bench(args) => bench::run(args).await,
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

async fn run_cell(args: CellArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => CellConfig::load(path)?,
        None => CellConfig::default(),
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(dir) = args.data_dir {
        config.data_dir = dir;
    }
    if let Some(id) = args.cell_id {
        config.cell_id = id;
    }
    config.validate()?;
    cellmesh_cell::run(config, telemetry::shutdown_signal()).await?;
    Ok(())
}
