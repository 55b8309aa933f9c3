//! The long-running roles of the binary: `cell`, `router`, `edge` and
//! `control-plane`. Each loads its TOML config (every field has a default),
//! applies flag/env overrides, validates, and serves until Ctrl-C /
//! SIGTERM — or, with `--check-config FILE`, validates that file (with the
//! same overrides) and exits, naming the first bad field.

use std::net::SocketAddr;
use std::path::PathBuf;

use cellmesh_cell::CellConfig;
use cellmesh_control_plane::server::ControlPlaneConfig;
use cellmesh_edge::EdgeConfig;
use cellmesh_router::config::RouterConfig;

use cellmesh_telemetry::trace::{Identity, TraceConfig, TraceGuard};

use crate::telemetry;

#[derive(clap::Args)]
pub struct CellArgs {
    /// Validate this TOML file (with the overrides below) and exit
    /// without serving: 0 if a process could run with it, 2 naming the
    /// first bad field otherwise.
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    check_config: Option<PathBuf>,
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
    /// Validate this TOML file (with the overrides below) and exit
    /// without serving: 0 if a process could run with it, 2 naming the
    /// first bad field otherwise.
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    check_config: Option<PathBuf>,
    /// TOML config file (see config/router.toml).
    #[arg(long, env = "CELLMESH_CONFIG")]
    config: Option<PathBuf>,
    /// Overrides `data_dir`.
    #[arg(long, env = "CELLMESH_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Seed an empty data dir from this route-table backup (`ctl backup
    /// restore-routes` writes it) and form a new group (overrides
    /// `cluster.restore_from`).
    #[arg(long, value_name = "FILE")]
    restore_from: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct EdgeArgs {
    /// Validate this TOML file (with the overrides below) and exit
    /// without serving: 0 if a process could run with it, 2 naming the
    /// first bad field otherwise.
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    check_config: Option<PathBuf>,
    /// TOML config file (see config/edge.toml).
    #[arg(long, env = "CELLMESH_CONFIG")]
    config: Option<PathBuf>,
    /// Overrides `listen`.
    #[arg(long, env = "CELLMESH_LISTEN")]
    listen: Option<SocketAddr>,
}

#[derive(clap::Args)]
pub struct ControlPlaneArgs {
    /// Validate this TOML file (with the overrides below) and exit
    /// without serving: 0 if a process could run with it, 2 naming the
    /// first bad field otherwise.
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    check_config: Option<PathBuf>,
    /// TOML config file (see config/control-plane.toml).
    #[arg(long, env = "CELLMESH_CONFIG")]
    config: Option<PathBuf>,
}

pub async fn run_control_plane(args: ControlPlaneArgs) -> anyhow::Result<()> {
    let config = match args.check_config.as_ref().or(args.config.as_ref()) {
        Some(path) => ControlPlaneConfig::load(path)?,
        None => ControlPlaneConfig::default(),
    };
    let _traces = traced(
        args.check_config.is_some(),
        &config.telemetry,
        Identity {
            role: "control-plane",
            instance: config.admin_listen.clone(),
            ..Identity::default()
        },
    )?;
    if let Some(path) = &args.check_config {
        return valid(
            path,
            "control-plane",
            &format!("{} routers", config.routers.len()),
        );
    }
    let cp = cellmesh_control_plane::server::start(config).await?;
    println!(
        "control plane watching {} cells",
        cp.routes.read(|t| t.cells.len())
    );
    telemetry::shutdown_signal().await;
    cp.stop();
    Ok(())
}

pub async fn run_cell(args: CellArgs) -> anyhow::Result<()> {
    let mut config = match args.check_config.as_ref().or(args.config.as_ref()) {
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
    let _traces = traced(
        args.check_config.is_some(),
        &config.telemetry,
        Identity {
            role: "cell",
            region: config
                .cell_id
                .split('/')
                .next()
                .unwrap_or_default()
                .to_string(),
            cell: config.cell_id.clone(),
            instance: config.listen.to_string(),
        },
    )?;
    if let Some(path) = &args.check_config {
        let what = format!("cell {}, listen {}", config.cell_id, config.listen);
        return valid(path, "cell", &what);
    }
    cellmesh_cell::run(config, telemetry::shutdown_signal()).await?;
    Ok(())
}

pub async fn run_router(args: RouterArgs) -> anyhow::Result<()> {
    let mut config = match args.check_config.as_ref().or(args.config.as_ref()) {
        Some(path) => RouterConfig::load(path)?,
        None => RouterConfig::default(),
    };
    if let Some(dir) = args.data_dir {
        config.data_dir = dir;
    }
    if let Some(path) = args.restore_from {
        config.cluster.restore_from = path.display().to_string();
    }
    config.validate()?;
    let _traces = traced(
        args.check_config.is_some(),
        &config.telemetry,
        Identity {
            role: "router",
            region: config.region.clone(),
            instance: format!("node-{}", config.node_id),
            ..Identity::default()
        },
    )?;
    if let Some(path) = &args.check_config {
        let what = format!("node {}, region {}", config.node_id, config.region);
        return valid(path, "router", &what);
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
    let mut config = match args.check_config.as_ref().or(args.config.as_ref()) {
        Some(path) => EdgeConfig::load(path)?,
        None => EdgeConfig::default(),
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    config.validate()?;
    let _traces = traced(
        args.check_config.is_some(),
        &config.telemetry,
        Identity {
            role: "edge",
            region: config.region.clone(),
            instance: config.listen.to_string(),
            ..Identity::default()
        },
    )?;
    if let Some(path) = &args.check_config {
        return valid(path, "edge", &format!("listen {}", config.listen));
    }
    let edge = cellmesh_edge::start(config).await?;
    println!("edge serving on {}", edge.endpoint());
    telemetry::shutdown_signal().await;
    edge.stop().await;
    Ok(())
}

/// Sets up logging, with traces unless only a config file is checked.
fn traced(
    check_only: bool,
    config: &TraceConfig,
    identity: Identity,
) -> anyhow::Result<Option<TraceGuard>> {
    if check_only {
        telemetry::init();
        return Ok(None);
    }
    telemetry::init_traced(config, identity)
}

/// What `--check-config` prints for a usable file.
fn valid(path: &std::path::Path, role: &str, what: &str) -> anyhow::Result<()> {
    println!("{}: a valid {role} config ({what})", path.display());
    Ok(())
}
