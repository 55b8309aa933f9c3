//! The `rolling-upgrade` scenario: a deployment started on the previous
//! release (`cellmesh dev --process-binary PREVIOUS`) is moved to this
//! binary one component at a time while the workload runs — routers, the
//! control plane, cells, edges — then one cell and one router go back to
//! the previous release and forward again, and the cluster version is
//! finalized. Each step is a fault in the report, with the time the
//! component took to serve again; the checker judges the history as in
//! every drill.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cellmesh_proto::ids::TenantId;
use cellmesh_proto::version::BINARY;
use cellmesh_route_client::commands::set_cluster_version;
use cellmesh_route_client::table::Key;
use rand::Rng;

use super::faults::{Fault, Injector};
use super::workload::now_ms;
use crate::upgrade::{cell_id, is_cell, rolling_order};

/// How long one component may take to serve again.
const STEP_WAIT: Duration = Duration::from_secs(120);
/// The pause between two steps.
const BETWEEN: Duration = Duration::from_secs(1);
/// How long the finalize may wait for every process's report.
const FINALIZE_WAIT: Duration = Duration::from_secs(60);

/// One step: a component moved to a binary, or the canary move.
pub(super) enum Step {
    Move {
        name: String,
        binary: PathBuf,
        back: bool,
    },
    /// The drill tenant moved onto this cell (an id), just upgraded.
    Canary(String),
}

/// Every component to this binary in rolling order, the first cell
/// upgraded being a canary the drill tenant then moves onto; then that
/// cell and one router back to `previous` and forward again.
pub(super) async fn plan(injector: &mut Injector, previous: &Path) -> anyhow::Result<Vec<Step>> {
    let current = std::env::current_exe()?;
    let mut names = rolling_order(&injector.dev.process_names()?);
    anyhow::ensure!(!names.is_empty(), "dev.json lists no processes");
    let tenant = Key::tenant(TenantId(injector.dev.tenant));
    let routes = injector.dev.routes().await?;
    let home = (routes
        .resolve(&tenant)
        .map(|r| r.entry.cell.replace('/', "-")))
    .unwrap_or_default();
    // The canary goes first among the cells.
    let first = names.iter().position(|n| is_cell(n));
    let canary = names.iter().position(|n| is_cell(n) && *n != home);
    let canary = match (first, canary) {
        (Some(first), Some(canary)) => {
            names.swap(first, canary);
            Some(names[first].clone())
        }
        _ => None,
    };
    let moved = |name: &String, binary: &Path, back| Step::Move {
        name: name.clone(),
        binary: binary.to_path_buf(),
        back,
    };
    let mut steps = Vec::new();
    for name in &names {
        steps.push(moved(name, &current, false));
        if Some(name) == canary.as_ref() {
            steps.push(Step::Canary(cell_id(name)));
        }
    }
    let routers: Vec<&String> = names.iter().filter(|n| n.starts_with("router-")).collect();
    let mut back: Vec<String> = canary.into_iter().collect();
    if !routers.is_empty() {
        back.push(routers[injector.rng.random_range(0..routers.len())].clone());
    }
    for name in &back {
        steps.push(moved(name, previous, true));
        steps.push(moved(name, &current, false));
    }
    Ok(steps)
}

impl Injector {
    /// Carries out one step, as a fault of the report.
    pub(super) async fn upgrade_step(&mut self, step: &Step) -> anyhow::Result<Fault> {
        let mut fault = self.fault();
        let (name, binary, back) = match step {
            Step::Move { name, binary, back } => (name, binary, *back),
            Step::Canary(cell) => {
                self.tenant_move(&mut fault, None, Some(cell)).await?;
                fault.kind = format!("canary: {}", fault.kind);
                return Ok(fault);
            }
        };
        if is_cell(name) {
            fault.affected = self.owned_by(&cell_id(name)).await?;
        }
        let moved = self.dev.move_process(name, binary, STEP_WAIT).await?;
        fault.kind = match back {
            true => format!("roll back to {}", moved.release),
            false => format!("upgrade to {}", moved.release),
        };
        fault.target = name.clone();
        fault.recovered_ms = Some(now_ms(self.epoch));
        fault.detail = format!("serving again after {} ms", moved.took.as_millis());
        Ok(fault)
    }

    /// Raises the cluster version to this binary's release once the route
    /// table takes it (it refuses while a cell still reports another).
    pub(super) async fn finalize(&mut self) -> anyhow::Result<Fault> {
        let mut fault = self.fault();
        fault.kind = format!("finalize cluster version {BINARY}");
        fault.target = "route table".into();
        let routes = self.dev.routes().await?;
        let deadline = Instant::now() + FINALIZE_WAIT;
        loop {
            match routes.apply(set_cluster_version(BINARY)).await {
                Ok(_) => break,
                Err(e) if Instant::now() > deadline => {
                    anyhow::bail!("the finalize is refused: {e:?}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
        fault.recovered_ms = Some(now_ms(self.epoch));
        Ok(fault)
    }
}

/// Runs `plan`'s steps one after another, then the finalize.
pub(super) async fn run(
    injector: &mut Injector,
    steps: Vec<Step>,
    mut after: impl FnMut(&Injector, &Fault),
) -> anyhow::Result<Vec<Fault>> {
    let mut faults = Vec::new();
    for step in &steps {
        tokio::time::sleep(BETWEEN).await;
        let fault = injector.upgrade_step(step).await?;
        after(injector, &fault);
        faults.push(fault);
    }
    let fault = injector.finalize().await?;
    after(injector, &fault);
    faults.push(fault);
    Ok(faults)
}
