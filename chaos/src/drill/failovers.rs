//! The failovers a drill saw: every time the route table marked a cell
//! `Down`, when, and whether one of the drill's faults explains it (a
//! fault on that cell, its region or its process, shortly before). A
//! failover nothing explains is a false one: a healthy but busy cell
//! failed its probes long enough to lose its routes. The report lists
//! both; the figure to watch when failure detection gets faster.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::table::CellStatus;
use serde_json::{Value, json};

use super::faults::Fault;

/// How long after a fault a failover still counts as its consequence.
const EXPLAINED_WITHIN: Duration = Duration::from_secs(30);

pub struct FailoverWatch {
    /// (cell, ms since the drill's epoch) of every mark `Down`.
    seen: Arc<Mutex<Vec<(String, u64)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FailoverWatch {
    /// Polls the route table every 100 ms from now on.
    pub fn start(routes: RouteClient, epoch: Instant) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let task = tokio::spawn(async move {
            let down = |routes: &RouteClient| -> HashSet<String> {
                routes.read(|t| {
                    t.cells
                        .values()
                        .filter(|c| c.status == CellStatus::Down)
                        .map(|c| c.id.clone())
                        .collect()
                })
            };
            // Cells already down when the drill starts are not its doing.
            let mut before = down(&routes);
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let now = down(&routes);
                let at = epoch.elapsed().as_millis() as u64;
                for cell in now.difference(&before) {
                    log.lock().expect("failovers").push((cell.clone(), at));
                }
                before = now;
            }
        });
        Self { seen, task }
    }

    /// Stops watching; the failovers seen, each with the fault that
    /// explains it (or none), and how many nothing explains.
    pub fn finish(self, faults: &[Fault]) -> (Value, usize) {
        self.task.abort();
        let seen = std::mem::take(&mut *self.seen.lock().expect("failovers"));
        let mut unexplained = 0;
        let records: Vec<Value> = seen
            .into_iter()
            .map(|(cell, at_ms)| {
                let cause = faults.iter().rev().find(|f| explains(f, &cell, at_ms));
                if cause.is_none() {
                    unexplained += 1;
                }
                json!({
                    "cell": cell,
                    "at_ms": at_ms,
                    "fault_at_ms": cause.map(|f| f.at_ms),
                    "fault": cause.map(|f| f.kind.clone()),
                })
            })
            .collect();
        (
            json!({ "seen": records, "unexplained": unexplained }),
            unexplained,
        )
    }
}

/// Whether `fault` (on the cell, its region, its dev process, or every
/// cell) came shortly before `cell` was marked down at `at_ms`.
fn explains(fault: &Fault, cell: &str, at_ms: u64) -> bool {
    let region = cell.split('/').next().unwrap_or(cell);
    // A rolling upgrade's steps name the process (`eu-west-c1`).
    let its_process =
        crate::upgrade::is_cell(&fault.target) && crate::upgrade::cell_id(&fault.target) == cell;
    let on_it = fault.target == region
        || fault.target.contains(cell)
        || fault.detail.contains(cell)
        || its_process;
    let when = fault.at_ms <= at_ms && at_ms - fault.at_ms <= EXPLAINED_WITHIN.as_millis() as u64;
    on_it && when
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(at_ms: u64, target: &str) -> Fault {
        Fault {
            at_ms,
            kind: "cell-hang".into(),
            target: target.into(),
            detail: String::new(),
            affected: Vec::new(),
            recovered_ms: None,
        }
    }

    #[test]
    fn a_failover_is_explained_only_by_a_recent_fault_on_its_cell_or_region() {
        assert!(explains(&fault(1_000, "eu-west/c1"), "eu-west/c1", 4_000));
        assert!(explains(&fault(1_000, "eu-west"), "eu-west/c2", 4_000));
        assert!(!explains(&fault(1_000, "eu-west/c1"), "eu-west/c2", 4_000));
        assert!(!explains(&fault(1_000, "eu-west/c1"), "eu-west/c1", 40_000));
        assert!(!explains(&fault(5_000, "eu-west/c1"), "eu-west/c1", 4_000));
    }

    #[test]
    fn a_rolling_upgrade_step_explains_a_failover_of_the_cell_it_restarted() {
        let restarted = |process: &str, cell: &str| explains(&fault(1_000, process), cell, 4_000);
        assert!(restarted("ap-south-c1", "ap-south/c1"));
        assert!(!restarted("ap-south-c1", "ap-south/c2"));
        assert!(!restarted("edge-ap-south", "ap-south/c1"));
        assert!(!restarted("router-eu-west", "eu-west/c1"));
    }
}
