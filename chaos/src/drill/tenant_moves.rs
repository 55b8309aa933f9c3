//! The drills' tenant moves: the whole drill tenant moves to another cell
//! (one workflow, one freeze, one switch), optionally with the source or
//! the target SIGKILLed mid-copy (the deployment's supervisor restarts it)
//! and the move resumed. Conversations that followed the tenant's entry
//! are checked against their source's copy afterwards.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::time::{Duration, Instant};

use cellmesh_control_plane::migration::tenant::TenantMoveReport;
use cellmesh_control_plane::migration::{MigrationError, MigrationOptions, Migrator};
use cellmesh_route_client::table::Key;
use rand::Rng;

use super::faults::{Fault, Injector, MoveEnd, signal};
use super::workload::now_ms;

impl Injector {
    /// Moves the drill tenant to another cell, killing `kill` mid-copy
    /// when set, and records the outcome in `fault`.
    pub(super) async fn tenant_move(
        &mut self,
        fault: &mut Fault,
        kill: Option<MoveEnd>,
        to: Option<&str>,
    ) -> anyhow::Result<()> {
        let tenant = self.dev.tenant;
        let routes = self.dev.routes().await?;
        let from = routes
            .resolve(&Key::tenant(TenantId(tenant)))
            .map(|r| r.entry.cell)
            .unwrap_or_default();
        let to = match to {
            Some(to) => to.to_string(),
            None => self.other_cell(&from).await?,
        };
        // The drill's conversations that follow the tenant's entry.
        let moving: Vec<u64> = routes.read(|t| {
            self.conversations
                .iter()
                .copied()
                .filter(|&c| {
                    t.resolve(&Key::conversation(TenantId(tenant), ConversationId(c)))
                        .is_some_and(|r| r.entry.key == Key::tenant(TenantId(tenant)))
                })
                .collect()
        });
        fault.kind = match kill {
            None => "move the whole tenant".into(),
            Some(end) => format!("move the whole tenant; SIGKILL the {end:?} mid-copy; resume"),
        };
        fault.target = format!("{from} -> {to}");
        fault.affected = moving.clone();
        // Throttled when a kill must land inside the copy.
        let options = MigrationOptions {
            rate: if kill.is_some() { 2_000 } else { 0 },
            ..MigrationOptions::default()
        };
        let task = {
            let (dev, to) = (self.dev.clone(), to.clone());
            tokio::spawn(async move {
                let migrator = Migrator::new(dev.routes().await?, dev.secret(), options);
                Ok::<_, anyhow::Error>(
                    migrator
                        .migrate_tenant(TenantId(tenant), &to, 8, |_| {})
                        .await?,
                )
            })
        };
        let mut detail = String::new();
        if let Some(end) = kill {
            tokio::time::sleep(Duration::from_millis(self.rng.random_range(100..1_500))).await;
            let cell = match end {
                MoveEnd::Source => &from,
                MoveEnd::Target => &to,
            };
            signal(self.dev.pid(&cell.replace('/', "-"))?, libc::SIGKILL);
            detail = format!("{cell} SIGKILLed; ");
        }
        let outcome = match task.await? {
            Ok(report) => Ok(report),
            Err(e) if kill.is_some() => {
                detail += &format!("interrupted ({e}); ");
                self.resume_tenant(&to).await
            }
            Err(e) => Err(e.to_string()),
        };
        fault.detail = detail
            + &match outcome {
                Ok(report) => {
                    let at = now_ms(self.epoch);
                    for c in moving {
                        self.moves.push((c, from.clone(), to.clone(), at));
                    }
                    fault.recovered_ms = Some(at);
                    format!(
                        "{} conversations and {} homes, {} rows copied, frozen {} ms, {} route writes",
                        report.conversations_moved,
                        report.users_moved,
                        report.messages_moved,
                        report.max_freeze.as_millis(),
                        report.route_writes
                    )
                }
                Err(e) => format!("the tenant move did not finish: {e}"),
            };
        Ok(())
    }

    /// Runs the interrupted tenant move again until it finishes, is
    /// refused (the route changed: e.g. a failover took the tenant), or
    /// 30 s pass.
    async fn resume_tenant(&mut self, to: &str) -> Result<TenantMoveReport, String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = String::new();
        while Instant::now() < deadline {
            if let Ok(routes) = self.dev.routes().await {
                let migrator =
                    Migrator::new(routes, self.dev.secret(), MigrationOptions::default());
                match migrator
                    .migrate_tenant(TenantId(self.dev.tenant), to, 8, |_| {})
                    .await
                {
                    Ok(report) => return Ok(report),
                    Err(e @ (MigrationError::Refused(_) | MigrationError::Conflict(_))) => {
                        return Err(format!("resume refused: {e}"));
                    }
                    Err(e) => last = e.to_string(),
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(format!("resume gave up after 30 s: {last}"))
    }
}
