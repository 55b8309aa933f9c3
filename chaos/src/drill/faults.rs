//! The faults a drill injects into a running `cellmesh dev`: process
//! faults on cells, on the Raft leader of the route table and on the active
//! control-plane replica (SIGKILL — the dev supervisor restarts the process
//! — or SIGSTOP/SIGCONT, a hung process), and live migrations, plain or
//! with their source killed, or with the migrator stopped after a phase
//! while the control-plane leader is killed, then resumed.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellmesh_control_plane::migration::{MigrationOptions, MigrationReport, Migrator};
use cellmesh_coord::etcd::EtcdCoordination;
use cellmesh_coord::local::LocalCoordination;
use cellmesh_coord::{CONTROL_PLANE_ELECTION, Coordination};
use cellmesh_route_client::table::{CellStatus, Key};
use rand::Rng;
use rand::rngs::StdRng;
use serde_json::{Value, json};

use super::workload::now_ms;
use crate::target::DevTarget;

#[derive(Clone, Copy, Debug)]
pub enum FaultKind {
    CellKill,
    CellHang,
    Migrate,
    RouterLeaderKill,
    /// SIGSTOP the route table's Raft leader for `hold`, then SIGCONT:
    /// cells must keep writing what they own while a new leader is elected.
    RouterLeaderHang {
        hold: Duration,
    },
    MigrationSourceKill,
    /// Move the whole drill tenant to another cell (and, next time, on or
    /// back): one workflow, one freeze, one switch.
    TenantMove,
    /// The same, with the source or the target SIGKILLed mid-copy; then
    /// the move is resumed.
    TenantMoveKill,
    ControlPlaneKillMidMigration,
    /// Move drill conversations to another cell, then hang that cell until
    /// it is failed over (see `move_failover`).
    MoveThenFailOver,
    /// The target of a move crashes between storing a copied chunk and
    /// answering (fail point `migration.copy_stored`).
    MigrationTargetCrash,
    /// Kafka broker 1 of `cellmesh dev --kafka mock` down for `hold`, then
    /// up.
    BrokerOutage {
        hold: Duration,
    },
    /// A fail point set for `hold` on every cell owning drill
    /// conversations, then cleared.
    FailPoint {
        what: &'static str,
        spec: &'static str,
        hold: Duration,
    },
    /// Cut `region` off from the others for `hold`, then heal.
    RegionPartition {
        region: &'static str,
        hold: Duration,
    },
}

/// The end of a move a drill kills.
#[derive(Debug, Clone, Copy)]
pub enum MoveEnd {
    Source,
    Target,
}

/// One injected fault, for the report.
pub struct Fault {
    pub at_ms: u64,
    pub kind: String,
    pub target: String,
    pub detail: String,
    /// Drill conversations the fault hit (owned by the faulted cell, or
    /// moved); their acks after `at_ms` give the recovery time.
    pub affected: Vec<u64>,
    /// When the faulted component was whole again (new leader elected),
    /// where the injector can tell.
    pub recovered_ms: Option<u64>,
}

pub struct Injector {
    pub dev: Arc<DevTarget>,
    pub conversations: Vec<u64>,
    pub epoch: Instant,
    pub rng: StdRng,
    /// Moves that finished: (conversation, source, target, switch ms).
    pub moves: Vec<(u64, String, String, u64)>,
    /// Tenant moves with a kill so far: they kill the source and the
    /// target in turn.
    pub move_kills: u32,
}

/// Refuses a fault this build cannot inject.
pub(super) fn needs_failpoints() -> anyhow::Result<()> {
    anyhow::ensure!(
        cellmesh_cell::failpoints::ENABLED,
        "this build has no fail points: build cellmesh with `--features failpoints` (and run `cellmesh dev` from it)"
    );
    Ok(())
}

pub(super) use crate::target::signal;

impl Injector {
    /// An injector over the drill's `conversations`, its choices drawn
    /// from `seed`.
    pub fn new(dev: Arc<DevTarget>, conversations: Vec<u64>, seed: u64) -> Self {
        Self {
            dev,
            conversations,
            epoch: Instant::now(),
            rng: rand::SeedableRng::seed_from_u64(seed),
            moves: Vec::new(),
            move_kills: 0,
        }
    }

    /// A fault injected now, to be described.
    pub(super) fn fault(&self) -> Fault {
        Fault {
            at_ms: now_ms(self.epoch),
            kind: String::new(),
            target: String::new(),
            detail: String::new(),
            affected: Vec::new(),
            recovered_ms: None,
        }
    }

    pub async fn inject(&mut self, kind: FaultKind) -> anyhow::Result<Fault> {
        let mut fault = self.fault();
        match kind {
            FaultKind::CellKill | FaultKind::CellHang => self.cell_fault(&mut fault, kind).await?,
            FaultKind::Migrate => {
                let conversation = self.pick();
                fault.kind = "migrate".into();
                fault.affected = vec![conversation];
                fault.target = self
                    .migrate(conversation, MigrationOptions::default())
                    .await;
            }
            FaultKind::TenantMove => self.tenant_move(&mut fault, None, None).await?,
            FaultKind::MoveThenFailOver => self.move_then_fail_over(&mut fault).await?,
            FaultKind::TenantMoveKill => {
                let end = if self.move_kills.is_multiple_of(2) {
                    MoveEnd::Source
                } else {
                    MoveEnd::Target
                };
                self.move_kills += 1;
                self.tenant_move(&mut fault, Some(end), None).await?
            }
            FaultKind::RouterLeaderKill => self.router_leader_kill(&mut fault).await?,
            FaultKind::RouterLeaderHang { hold } => {
                let region = self.router_leader().await?;
                fault.kind = format!(
                    "hang the route table's Raft leader {} ms (SIGSTOP/SIGCONT)",
                    hold.as_millis()
                );
                fault.target = format!("router-{region}");
                let pid = self.dev.pid(&fault.target)?;
                fault.affected = self.conversations.clone();
                signal(pid, libc::SIGSTOP);
                tokio::time::sleep(hold).await;
                signal(pid, libc::SIGCONT);
                fault.recovered_ms = Some(now_ms(self.epoch));
            }
            FaultKind::FailPoint { what, spec, hold } => {
                self.fail_point(&mut fault, what, spec, hold).await?
            }
            FaultKind::RegionPartition { region, hold } => {
                fault.kind = format!("partition for {} ms", hold.as_millis());
                fault.target = region.to_string();
                fault.affected = self.conversations.clone();
                self.partition(&[region]).await?;
                tokio::time::sleep(hold).await;
                self.partition(&[]).await?;
                fault.recovered_ms = Some(now_ms(self.epoch));
                fault.detail = "healed".into();
            }
            FaultKind::MigrationSourceKill => self.migration_source_kill(&mut fault).await?,
            FaultKind::MigrationTargetCrash => self.migration_target_crash(&mut fault).await?,
            FaultKind::BrokerOutage { hold } => self.broker_outage(&mut fault, hold).await?,
            FaultKind::ControlPlaneKillMidMigration => {
                self.control_plane_kill_mid_migration(&mut fault).await?
            }
        }
        Ok(fault)
    }

    /// Tells the dev deployment which regions to cut off (none: heal).
    pub async fn partition(&self, regions: &[&str]) -> anyhow::Result<()> {
        let path = self.dev.dir().join(crate::target::PARTITION_FILE);
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, json!({ "regions": regions }).to_string())?;
        std::fs::rename(tmp, path)?;
        // The dev process looks every 200 ms.
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok(())
    }

    /// Moves every drill conversation to `cell` before the load starts.
    pub async fn place_all(&mut self, cell: &str) -> anyhow::Result<()> {
        for c in self.conversations.clone() {
            if self.owner(c).await? != cell {
                Migrator::new(
                    self.dev.routes().await?,
                    self.dev.secret(),
                    MigrationOptions::default(),
                )
                .migrate_conversation(TenantId(self.dev.tenant), ConversationId(c), cell, |_| {})
                .await?;
            }
        }
        Ok(())
    }

    pub(super) fn pick(&mut self) -> u64 {
        self.conversations[self.rng.random_range(0..self.conversations.len())]
    }

    /// Waits (up to 30 s) until the outboxes of `cells` are nearly empty
    /// (senders keep writing); the largest backlog seen, and whether they
    /// drained.
    pub(super) async fn drain_outboxes(&self, cells: &[String]) -> anyhow::Result<(u64, bool)> {
        let routes = self.dev.routes().await?;
        let addresses: Vec<String> = routes.read(|t| {
            cells
                .iter()
                .filter_map(|c| t.cell(c).map(|c| c.address.clone()))
                .collect()
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut worst = 0;
        loop {
            let mut lag = 0;
            for a in &addresses {
                let stats =
                    cellmesh_control_plane::status::stats(a.clone(), self.dev.secret()).await;
                lag = lag.max(stats.map_or(u64::MAX, |s| s.queue_lag));
            }
            if lag != u64::MAX {
                worst = worst.max(lag);
            }
            if lag <= 50 {
                return Ok((worst, true));
            }
            if Instant::now() > deadline {
                return Ok((worst, false));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(super) async fn owner(&self, conversation: u64) -> anyhow::Result<String> {
        let routes = self.dev.routes().await?;
        Ok(routes
            .resolve(&Key::conversation(
                TenantId(self.dev.tenant),
                ConversationId(conversation),
            ))
            .map(|r| r.entry.cell)
            .unwrap_or_default())
    }

    pub(super) async fn owned_by(&self, cell: &str) -> anyhow::Result<Vec<u64>> {
        let mut out = Vec::new();
        for &c in &self.conversations {
            if self.owner(c).await? == cell {
                out.push(c);
            }
        }
        Ok(out)
    }

    /// A random Up cell other than `cell`.
    pub(super) async fn other_cell(&mut self, cell: &str) -> anyhow::Result<String> {
        let routes = self.dev.routes().await?;
        // Inside the drill tenant's regions when it is bound to some.
        let tenant = TenantId(self.dev.tenant);
        let targets: Vec<String> = routes.read(|t| {
            t.cells
                .values()
                .filter(|c| c.id != cell && c.status == CellStatus::Up && t.allows(tenant, &c.id))
                .map(|c| c.id.clone())
                .collect()
        });
        anyhow::ensure!(!targets.is_empty(), "no cell to move to");
        Ok(targets[self.rng.random_range(0..targets.len())].clone())
    }

    /// Moves `conversation` live to a random other cell; what happened.
    pub(super) async fn migrate(&mut self, conversation: u64, options: MigrationOptions) -> String {
        let attempt = async {
            let owner = self.owner(conversation).await?;
            let to = self.other_cell(&owner).await?;
            let report = Migrator::new(self.dev.routes().await?, self.dev.secret(), options)
                .migrate_conversation(
                    TenantId(self.dev.tenant),
                    ConversationId(conversation),
                    &to,
                    |_| {},
                )
                .await?;
            Ok::<_, anyhow::Error>(report)
        };
        match attempt.await {
            Ok(report) => {
                self.moved(&report);
                format!(
                    "conversation {conversation} {} -> {}: {} messages, writes paused {} ms",
                    report.from,
                    report.to,
                    report.messages_verified,
                    report.frozen_for.as_millis()
                )
            }
            Err(e) => format!("conversation {conversation}: migration failed: {e}"),
        }
    }

    /// Notes a finished move, for the migration invariant.
    pub(super) fn moved(&mut self, report: &MigrationReport) {
        self.moves.push((
            report.conversation,
            report.from.clone(),
            report.to.clone(),
            now_ms(self.epoch),
        ));
    }

    /// Runs the interrupted move again (its state is in the route table)
    /// until it finishes, is refused, or 30 s pass.
    pub(super) async fn resume(&mut self, conversation: u64, to: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = String::new();
        while Instant::now() < deadline {
            let routes = match self.dev.routes().await {
                Ok(r) => r,
                Err(e) => {
                    last = e.to_string();
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            match Migrator::new(routes, self.dev.secret(), MigrationOptions::default())
                .migrate_conversation(
                    TenantId(self.dev.tenant),
                    ConversationId(conversation),
                    to,
                    |_| {},
                )
                .await
            {
                Ok(r) => {
                    self.moved(&r);
                    return format!(
                        "resumed and finished: {} messages verified, writes paused {} ms",
                        r.messages_verified,
                        r.frozen_for.as_millis()
                    );
                }
                Err(e @ cellmesh_control_plane::migration::MigrationError::Refused(_)) => {
                    return format!("resume refused: {e}");
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        format!("resume gave up after 30 s: {last}")
    }

    /// The region of the route table's leader.
    pub(super) async fn router_leader(&self) -> anyhow::Result<String> {
        Ok(self.dev.router_leader().await?.1.region)
    }

    pub(super) async fn control_plane_leader(&self) -> Option<String> {
        let coordination: Box<dyn Coordination> = if self.dev.etcd.is_empty() {
            Box::new(LocalCoordination::open(&self.dev.dir().join("coordination")).ok()?)
        } else {
            Box::new(EtcdCoordination::connect(&self.dev.etcd).await.ok()?)
        };
        coordination
            .leader(CONTROL_PLANE_ELECTION)
            .await
            .ok()
            .flatten()
    }
}

impl Fault {
    pub fn to_json(&self) -> Value {
        json!({
            "at_ms": self.at_ms,
            "kind": self.kind,
            "target": self.target,
            "detail": self.detail,
            "affected_conversations": self.affected,
            "recovered_at_ms": self.recovered_ms,
        })
    }
}
