//! The long-running roles of the binary: `cell`, `router` and `edge`. Each
//! loads its TOML config (every field has a default), applies flag/env
//! overrides, validates, and serves until Ctrl-C / SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;

use cellmesh_cell::CellConfig;
use cellmesh_control_plane::server::ControlPlaneConfig;
use cellmesh_edge::EdgeConfig;
use cellmesh_router::config::RouterConfig;

use crate::telemetry;

#[derive(clap::Args)]
pub struct CellArgs {
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

#[derive(clap::Args)]
pub struct RouterArgs {
    /// TOML config file (see config/router.toml).
    #[arg(long, env = "CELLMESH_CONFIG")]
    config: Option<PathBuf>,
    /// Overrides `data_dir`.
    #[arg(long, env = "CELLMESH_DATA_DIR")]
    data_dir: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct EdgeArgs {
    /// TOML config file (see config/edge.toml).
    #[arg(long, env = "CELLMESH_CONFIG")]
    config: Option<PathBuf>,
    /// Overrides `listen`.
    #[arg(long, env = "CELLMESH_LISTEN")]
    listen: Option<SocketAddr>,
}

#[derive(clap::Args)]
pub struct ControlPlaneArgs {
    /// TOML config file (see config/control-plane.toml).
    #[arg(long, env = "CELLMESH_CONFIG")]
    config: Option<PathBuf>,
}

pub async fn run_control_plane(args: ControlPlaneArgs) -> anyhow::Result<()> {
    let config = match &args.config {
        Some(path) => ControlPlaneConfig::load(path)?,
        None => ControlPlaneConfig::default(),
    };
    let cp = cellmesh_control_plane::server::start(config)
        .await
        .map_err(anyhow::Error::msg)?;
    println!(
        "control plane watching {} cells",
        cp.routes.read(|t| t.cells.len())
    );
    telemetry::shutdown_signal().await;
    cp.stop();
    Ok(())
}

pub async fn run_cell(args: CellArgs) -> anyhow::Result<()> {
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

pub async fn run_router(args: RouterArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => RouterConfig::load(path)?,
        None => RouterConfig::default(),
    };
    if let Some(dir) = args.data_dir {
        config.data_dir = dir;
    }
    let router = cellmesh_router::node::start(config).await?;
    println!(
        "router {} serving: api {}, raft {}",
        router.node_id, router.node.api_addr, router.node.raft_addr
    );
    telemetry::shutdown_signal().await;
    router.stop().await;
    Ok(())
}

pub async fn run_edge(args: EdgeArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => EdgeConfig::load(path)?,
        None => EdgeConfig::default(),
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    let edge = cellmesh_edge::start(config).await?;
    println!("edge serving on {}", edge.endpoint());
    telemetry::shutdown_signal().await;
    edge.stop().await;
    Ok(())
}
