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

use cellmesh_proto::version::BINARY;
use cellmesh_route_client::commands::set_cluster_version;
use rand::Rng;

use super::faults::{Fault, Injector};
use super::workload::now_ms;
use crate::upgrade::rolling_order;

/// How long one component may take to serve again.
const STEP_WAIT: Duration = Duration::from_secs(120);
/// The pause between two steps.
const BETWEEN: Duration = Duration::from_secs(1);
/// How long the finalize may wait for every process's report.
const FINALIZE_WAIT: Duration = Duration::from_secs(60);

/// One step: a component and the binary it moves to.
pub(super) struct Step {
    name: String,
    binary: PathBuf,
    back: bool,
}

/// Every component to this binary in rolling order; then one cell (owning
/// drill conversations when one does) and one router back to `previous`
/// and forward again.
pub(super) async fn plan(injector: &mut Injector, previous: &Path) -> anyhow::Result<Vec<Step>> {
    let current = std::env::current_exe()?;
    let names = rolling_order(&injector.dev.process_names()?);
    anyhow::ensure!(!names.is_empty(), "dev.json lists no processes");
    let mut steps: Vec<Step> = (names.iter())
        .map(|name| Step {
            name: name.clone(),
            binary: current.clone(),
            back: false,
        })
        .collect();
    let mut owner = String::new();
    if let Some(&c) = injector.conversations.first() {
        owner = injector.owner(c).await?.replace('/', "-");
    }
    let cell = match names.iter().find(|n| **n == owner) {
        Some(cell) => cell.clone(),
        None => names
            .iter()
            .find(|n| is_cell(n))
            .cloned()
            .unwrap_or_default(),
    };
    let routers: Vec<&String> = names.iter().filter(|n| n.starts_with("router-")).collect();
    let mut back = vec![cell];
    if !routers.is_empty() {
        back.push(routers[injector.rng.random_range(0..routers.len())].clone());
    }
    for name in back.into_iter().filter(|n| !n.is_empty()) {
        for (binary, back) in [(previous.to_path_buf(), true), (current.clone(), false)] {
            steps.push(Step {
                name: name.clone(),
                binary,
                back,
            });
        }
    }
    Ok(steps)
}

impl Injector {
    /// Carries out one step, as a fault of the report.
    pub(super) async fn upgrade_step(&mut self, step: &Step) -> anyhow::Result<Fault> {
        let mut fault = self.fault();
        let cell_id = step.name.rsplit_once('-').map(|(r, c)| format!("{r}/{c}"));
        if let Some(id) = cell_id.filter(|_| is_cell(&step.name)) {
            fault.affected = self.owned_by(&id).await?;
        }
        let moved = self
            .dev
            .move_process(&step.name, &step.binary, STEP_WAIT)
            .await?;
        fault.kind = match step.back {
            true => format!("roll back to {}", moved.release),
            false => format!("upgrade to {}", moved.release),
        };
        fault.target = step.name.clone();
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

/// Whether dev process `name` is a cell (`REGION-cN`).
fn is_cell(name: &str) -> bool {
    !(name.starts_with("router-") || name.starts_with("edge-") || name.starts_with("control-"))
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
