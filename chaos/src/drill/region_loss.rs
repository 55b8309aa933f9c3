//! The `region-loss` scenario: the drill's conversations live on the lost
//! region's first cell and a second tenant, replicated asynchronously,
//! lives on its second cell, both written from another region. Each cell
//! of the region is backed up under load; then every process of the
//! region (router replica, cells, edge) is killed and its data directory
//! deleted. The control plane fails the cells over to their standbys in
//! other regions while the router group keeps its quorum. Then the region
//! is rebuilt — the router replica from its peers, each cell from its
//! latest backup (`ctl backup restore`, resuming above the marks its
//! standbys kept) — and the tenants failed back.
//!
//! Measured: RTO, each affected conversation's first acknowledged send
//! after the loss; RPO, the acknowledged messages missing at the end. The
//! drill tenant must be replicated `sync` (`cellmesh dev --replication
//! sync`): its RPO is 0, judged by the checker with every other invariant.
//! The asynchronous tenant (`--other-mode-tenants 9002`) loses what its
//! cell acknowledged after the backup; that is reported, not judged.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use cellmesh_cell::config::{CellConfig, ReplicationMode};
use cellmesh_control_plane::migration::{MigrationOptions, Migrator};
use cellmesh_proto::ids::TenantId;
use cellmesh_proto::v1::CreateBackupRequest;
use cellmesh_route_client::peers::Peers;
use cellmesh_route_client::table::CellStatus;
use serde_json::{Value, json};

use super::faults::{Fault, Injector};
use super::workload::{Workload, now_ms};
use crate::history::{History, Outcome, SendOp};
use crate::target::DevTarget;

/// The tenant whose writes are acknowledged asynchronously.
pub(super) const ASYNC_TENANT: u64 = 9_002;
/// How long a step (failover, a process's return, a failback) may take.
const STEP_WAIT: Duration = Duration::from_secs(90);
/// How long the asynchronous tenant's read-back waits for unavailable
/// history.
const ASYNC_READ_WAIT: Duration = Duration::from_secs(5);
/// The load between two steps.
const BETWEEN: Duration = Duration::from_secs(3);

/// The asynchronous tenant's load, recorded apart from the judged history.
pub(super) struct Probe {
    pub workload: Workload,
    pub ops: Arc<Mutex<Vec<SendOp>>>,
}

/// What the steps measured, for the report.
#[derive(Default)]
pub(super) struct Measured {
    /// When the backups were stored and when the region's last process
    /// was gone.
    backed_up_ms: u64,
    lost_ms: u64,
    failed_over_after_ms: Option<u64>,
    restore_ms: BTreeMap<String, u64>,
    rebuilt_after_ms: Option<u64>,
}

/// The mode `tenant`'s writes get on `cell` (from the config dev wrote).
fn mode_of(dev: &DevTarget, cell: &str, tenant: u64) -> anyhow::Result<ReplicationMode> {
    let file = dev.config_file(cell);
    let config = CellConfig::load(&file).with_context(|| format!("{}", file.display()))?;
    Ok(config.replication.mode_of(TenantId(tenant)))
}

/// Places the drill's conversations on `region`'s first cell and the
/// asynchronous tenant on its second, whose load is returned; refuses a
/// deployment whose modes are not sync for the drill tenant and async for
/// the other.
pub(super) async fn prepare(
    dev: &Arc<DevTarget>,
    injector: &mut Injector,
    region: &str,
    senders: u64,
) -> anyhow::Result<Probe> {
    let (first, second) = (format!("{region}/c1"), format!("{region}/c2"));
    anyhow::ensure!(
        !dev.tls.enabled(),
        "region-loss rebuilds the region's router under a new node id, which needs a \
         certificate `cellmesh pki` issues for it: run it on a deployment without --tls"
    );
    anyhow::ensure!(
        mode_of(dev, &first, dev.tenant)? == ReplicationMode::Sync
            && mode_of(dev, &second, ASYNC_TENANT)? == ReplicationMode::Async,
        "region-loss needs the drill tenant sync and tenant {ASYNC_TENANT} async: \
         cellmesh dev --replication sync --other-mode-tenants {ASYNC_TENANT}"
    );
    injector.place_all(&first).await?;
    dev.place_on(ASYNC_TENANT, &second).await?;
    let workload = super::placed_workload(dev, ASYNC_TENANT, senders, 2).await?;
    println!("  conversations placed on {first} (sync); tenant {ASYNC_TENANT} (async) on {second}");
    Ok(Probe {
        workload,
        ops: Arc::new(Mutex::new(Vec::new())),
    })
}

/// The cell id of dev process `name` (`us-east-c1` → `us-east/c1`), if it
/// is a cell.
fn cell_of(name: &str) -> Option<String> {
    crate::upgrade::is_cell(name).then(|| crate::upgrade::cell_id(name))
}

impl Injector {
    /// Backs up every cell of `cells` through its Backups API.
    async fn back_up(&mut self, cells: &[String]) -> anyhow::Result<Fault> {
        let mut fault = self.fault();
        fault.kind = "back up".into();
        fault.target = cells.join(" ");
        let routes = self.dev.routes().await?;
        let (peers, secret) = (Peers::default(), self.dev.secret());
        let mut details = Vec::new();
        for cell in cells {
            let address = routes
                .read(|t| t.cell(cell).map(|c| c.address.clone()))
                .with_context(|| format!("{cell} is not registered"))?;
            let started = Instant::now();
            let mut request = tonic::Request::new(CreateBackupRequest { keep: 0 });
            secret.attach(&mut request);
            let info = peers
                .backups(&address)?
                .create(request)
                .await
                .map_err(|e| anyhow::anyhow!("backup of {cell}: {}", e.message()))?
                .into_inner();
            details.push(format!(
                "{cell}: {} bytes in {} ms",
                info.bytes,
                started.elapsed().as_millis()
            ));
        }
        fault.detail = details.join("; ");
        fault.recovered_ms = Some(now_ms(self.epoch));
        Ok(fault)
    }

    /// Kills every process of the region and deletes their data; waits
    /// until the route table gives the cells' routes to others.
    /// The fault, and when the last process was gone.
    async fn lose_region(
        &mut self,
        names: &[String],
        cells: &[String],
    ) -> anyhow::Result<(Fault, u64)> {
        let mut fault = self.fault();
        fault.kind = "lose the region (SIGKILL, data deleted)".into();
        fault.target = names.join(" ");
        for cell in cells {
            fault.affected.extend(self.owned_by(cell).await?);
        }
        fault.at_ms = now_ms(self.epoch);
        let deleted = self.dev.lose(names).await?;
        // Every process of the region is gone from here: what is
        // acknowledged after, the other regions acknowledged.
        let gone_ms = now_ms(self.epoch);
        let routes = self.dev.routes().await?;
        let deadline = Instant::now() + STEP_WAIT;
        loop {
            let (left, owners) = routes.read(|t| {
                let left = t
                    .routes
                    .values()
                    .filter(|e| cells.contains(&e.cell))
                    .count()
                    + cells
                        .iter()
                        .filter(|c| t.cell(c).is_some_and(|c| c.status != CellStatus::Down))
                        .count();
                let owners: std::collections::BTreeSet<String> = (t.routes.values())
                    .filter(|e| e.failed_from.as_ref().is_some_and(|f| cells.contains(f)))
                    .map(|e| e.cell.clone())
                    .collect();
                (left, owners)
            });
            if left == 0 {
                fault.recovered_ms = Some(now_ms(self.epoch));
                fault.detail = format!(
                    "{} data directories deleted; failed over to {}",
                    deleted.len(),
                    owners.into_iter().collect::<Vec<_>>().join(", ")
                );
                return Ok((fault, gone_ms));
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the region's cells were not failed over within {STEP_WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Brings the region back: its router replica (from its peers), each
    /// cell restored from its latest backup, then its edge; waits until
    /// the control plane has marked the cells Up. The restore times.
    async fn rebuild(
        &mut self,
        names: &[String],
        cells: &[String],
    ) -> anyhow::Result<(Fault, BTreeMap<String, u64>)> {
        let mut fault = self.fault();
        fault.kind = "rebuild the region (router from its peers, cells from backups)".into();
        fault.target = names.join(" ");
        let mut restores = BTreeMap::new();
        let mut rejoined = String::new();
        for name in names {
            if name.starts_with("router-") {
                let (old, new) = self.dev.rejoin_router(name, STEP_WAIT).await?;
                rejoined = format!("router node {old} replaced by node {new}; ");
                continue;
            }
            if let Some(cell) = cell_of(name) {
                let started = Instant::now();
                self.restore_cell(name).await?;
                restores.insert(cell, started.elapsed().as_millis() as u64);
            }
            self.dev.release(name, STEP_WAIT).await?;
        }
        let routes = self.dev.routes().await?;
        let deadline = Instant::now() + STEP_WAIT;
        while !routes.read(|t| {
            cells
                .iter()
                .all(|c| t.cell(c).is_some_and(|c| c.status == CellStatus::Up))
        }) {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the rebuilt cells were not marked Up within {STEP_WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        fault.recovered_ms = Some(now_ms(self.epoch));
        fault.detail = format!("{rejoined}restores took {restores:?} ms");
        Ok((fault, restores))
    }

    /// `cellmesh ctl backup restore` of dev child `name`, as an operator
    /// runs it before the cell starts.
    async fn restore_cell(&self, name: &str) -> anyhow::Result<()> {
        let out = tokio::process::Command::new(std::env::current_exe()?)
            .arg("ctl")
            .arg("--dev")
            .arg(self.dev.dir())
            .args(["backup", "restore", "--config"])
            .arg(self.dev.config_file(name))
            .output()
            .await?;
        anyhow::ensure!(
            out.status.success(),
            "restoring {name}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        println!("  {}", String::from_utf8_lossy(&out.stdout).trim());
        Ok(())
    }

    /// Fails back to each rebuilt cell what was failed over away from it.
    async fn fail_back(&mut self, cells: &[String]) -> anyhow::Result<Fault> {
        let mut fault = self.fault();
        fault.kind = "fail back".into();
        fault.target = cells.join(" ");
        let mut details = Vec::new();
        for cell in cells {
            let started = Instant::now();
            let migrator = Migrator::new(
                self.dev.routes().await?,
                self.dev.secret(),
                MigrationOptions::default(),
            );
            let report = migrator.failback(cell, 4, |_| {}).await?;
            anyhow::ensure!(
                report.failures.is_empty(),
                "failing back to {cell}: {:?}",
                report.failures
            );
            details.push(format!(
                "{cell}: {} routes, {} conversations in {} ms",
                report.selection.tenants.len()
                    + report.selection.conversations.len()
                    + report.selection.users.len(),
                report.conversations_moved,
                started.elapsed().as_millis()
            ));
        }
        fault.detail = details.join("; ");
        fault.recovered_ms = Some(now_ms(self.epoch));
        Ok(fault)
    }
}

/// Backs up, loses, rebuilds and fails back `region`, one step after
/// another with load in between.
pub(super) async fn run(
    injector: &mut Injector,
    region: &str,
    mut after: impl FnMut(&Injector, &Fault),
) -> anyhow::Result<(Vec<Fault>, Measured)> {
    let names = injector.dev.region_processes(region)?;
    let cells: Vec<String> = names.iter().filter_map(|n| cell_of(n)).collect();
    let mut measured = Measured::default();
    let mut faults = Vec::new();
    let mut step = |injector: &Injector, fault: Fault, faults: &mut Vec<Fault>| {
        after(injector, &fault);
        faults.push(fault);
    };
    tokio::time::sleep(BETWEEN).await;
    let fault = injector.back_up(&cells).await?;
    measured.backed_up_ms = fault.recovered_ms.unwrap_or(fault.at_ms);
    step(injector, fault, &mut faults);
    tokio::time::sleep(BETWEEN).await;
    let (fault, gone_ms) = injector.lose_region(&names, &cells).await?;
    measured.lost_ms = gone_ms;
    measured.failed_over_after_ms = fault.recovered_ms.map(|r| r.saturating_sub(gone_ms));
    step(injector, fault, &mut faults);
    tokio::time::sleep(BETWEEN).await;
    let (fault, restores) = injector.rebuild(&names, &cells).await?;
    measured.restore_ms = restores;
    measured.rebuilt_after_ms = fault
        .recovered_ms
        .map(|r| r.saturating_sub(measured.lost_ms));
    step(injector, fault, &mut faults);
    let fault = injector.fail_back(&cells).await?;
    step(injector, fault, &mut faults);
    Ok((faults, measured))
}

/// Each conversation's first acknowledged send invoked at or after
/// `at_ms`, as ms after it (`None`: none).
fn first_acks(sends: &[SendOp], conversations: &[u64], at_ms: u64) -> BTreeMap<u64, Option<u64>> {
    conversations
        .iter()
        .map(|&c| {
            let first = (sends.iter())
                .filter(|op| op.conversation == c && op.invoked_ms >= at_ms)
                .filter(|op| matches!(op.outcome, Outcome::Ok { .. }))
                .map(|op| op.completed_ms - at_ms)
                .min();
            (c, first)
        })
        .collect()
}

/// RTO and RPO of both tenants: the drill tenant's from the judged history,
/// the asynchronous tenant's from its own read back now.
impl Measured {
    /// The report of the drill `workload` (judged in `history`) and the
    /// asynchronous tenant's `probe`.
    pub(super) async fn report(
        &self,
        history: &History,
        workload: &Workload,
        probe: Probe,
    ) -> anyhow::Result<Value> {
        measure(
            self,
            history,
            (workload.tenant, &workload.conversations),
            probe,
        )
        .await
    }
}

async fn measure(
    measured: &Measured,
    history: &History,
    (drill_tenant, drill_conversations): (u64, &[u64]),
    probe: Probe,
) -> anyhow::Result<Value> {
    let drill = History {
        sends: (history.sends.iter())
            .filter(|op| drill_conversations.contains(&op.conversation))
            .cloned()
            .collect(),
        conversations: history.conversations.clone(),
        ..History::default()
    };
    let mut async_history = History {
        sends: std::mem::take(&mut *probe.ops.lock().expect("probe ops")),
        ..History::default()
    };
    // What the asynchronous tenant's cell acknowledged after its backup is
    // gone with the region: its owner reports that range unavailable for
    // good, so the read-back does not wait long for it.
    (probe.workload)
        .read_back_waiting(&mut async_history, ASYNC_READ_WAIT)
        .await?;
    let lost = |h: &History| crate::invariants::lost_acked::check(h).len();
    let acked = |h: &History| {
        (h.sends.iter())
            .filter(|op| matches!(op.outcome, Outcome::Ok { .. }))
            .count()
    };
    let after_backup = (async_history.sends.iter())
        .filter(|op| matches!(op.outcome, Outcome::Ok { .. }))
        .filter(|op| op.completed_ms > measured.backed_up_ms && op.completed_ms <= measured.lost_ms)
        .count();
    let rto = |sends: &[SendOp], conversations: &[u64]| {
        let each = first_acks(sends, conversations, measured.lost_ms);
        let worst = each.values().copied().max().flatten();
        json!({"rto_ms": worst, "first_ack_after_loss_ms": each})
    };
    let report = json!({
        "failed_over_after_ms": measured.failed_over_after_ms,
        "rebuilt_after_ms": measured.rebuilt_after_ms,
        "restore_ms": measured.restore_ms,
        "sync": {
            "tenant": drill_tenant,
            "acked": acked(&drill),
            "rpo_messages_lost": lost(&drill),
            "rto": rto(&drill.sends, drill_conversations),
        },
        "async": {
            "tenant": ASYNC_TENANT,
            "acked": acked(&async_history),
            "rpo_messages_lost": lost(&async_history),
            "acked_between_backup_and_loss": after_backup,
            "rto": rto(&async_history.sends, &probe.workload.conversations),
        },
    });
    println!(
        "  region loss: failed over after {:?} ms, rebuilt {:?} ms after the loss; \
         RTO sync {} ms, async {} ms; RPO sync {} lost of {} acked, async {} lost of {} acked \
         ({} acked between the backup and the loss)",
        measured.failed_over_after_ms,
        measured.rebuilt_after_ms,
        report["sync"]["rto"]["rto_ms"],
        report["async"]["rto"]["rto_ms"],
        report["sync"]["rpo_messages_lost"],
        report["sync"]["acked"],
        report["async"]["rpo_messages_lost"],
        report["async"]["acked"],
        after_backup,
    );
    Ok(report)
}
