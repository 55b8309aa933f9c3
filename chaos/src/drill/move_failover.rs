//! The move-then-fail-over fault: two drill conversations move live to one
//! other cell, and right after the switch that new owner hangs (SIGSTOP)
//! until the control plane fails it over to its standby, then resumes. The
//! standby must serve the moved conversations at once — it received their
//! meta while they were still being copied — and every acknowledged
//! message must read back once the hung cell's history is backfilled.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::time::{Duration, Instant};

use cellmesh_control_plane::migration::{MigrationOptions, Migrator};
use cellmesh_route_client::table::Key;

use super::faults::{Fault, Injector, signal};
use super::workload::now_ms;

/// The longest a new owner stays hung waiting for its failover.
const MAX_HANG: Duration = Duration::from_secs(20);

impl Injector {
    pub(super) async fn move_then_fail_over(&mut self, fault: &mut Fault) -> anyhow::Result<()> {
        let first = self.pick();
        let second = self.pick();
        let moving: Vec<u64> = if first == second {
            vec![first]
        } else {
            vec![first, second]
        };
        let owner = self.owner(first).await?;
        let to = self.other_cell(&owner).await?;
        fault.kind = "move, then hang the new owner until it fails over".into();
        fault.target = to.clone();
        let mut detail = String::new();
        for &conversation in &moving {
            let migrator = Migrator::new(
                self.dev.routes().await?,
                self.dev.secret(),
                MigrationOptions::default(),
            );
            match migrator
                .migrate_conversation(
                    TenantId(self.dev.tenant),
                    ConversationId(conversation),
                    &to,
                    |_| {},
                )
                .await
            {
                Ok(report) => {
                    self.moved(&report);
                    detail += &format!("conversation {conversation} {} -> {to}; ", report.from);
                }
                Err(e) => detail += &format!("conversation {conversation}: move failed: {e}; "),
            }
        }
        fault.affected = self.owned_by(&to).await?;
        let pid = self.dev.pid(&to.replace('/', "-"))?;
        let stopped = Instant::now();
        signal(pid, libc::SIGSTOP);
        let routes = self.dev.routes().await?;
        let tenant = self.dev.tenant;
        let failed_over = || {
            routes.read(|t| {
                moving.iter().all(|c| {
                    t.resolve(&Key::conversation(TenantId(tenant), ConversationId(*c)))
                        .is_some_and(|r| r.entry.cell != to)
                })
            })
        };
        while !failed_over() && stopped.elapsed() < MAX_HANG {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let hung = stopped.elapsed();
        signal(pid, libc::SIGCONT);
        fault.recovered_ms = Some(now_ms(self.epoch));
        detail += &match failed_over() {
            true => format!("{to} hung {} ms until it was failed over", hung.as_millis()),
            false => format!("{to} hung {} ms and was not failed over", hung.as_millis()),
        };
        fault.detail = detail;
        Ok(())
    }
}
