//! The longer faults an [`Injector`] injects, one method each: process
//! faults on a cell or the route table's leader, fail points, a Kafka
//! broker outage, and moves whose source, target or control plane is
//! killed midway, then resumed.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::time::{Duration, Instant};

use cellmesh_control_plane::migration::{MigrationOptions, Migrator, StopPoint};
use cellmesh_route_client::table::Key;
use rand::Rng;

use super::faults::{Fault, FaultKind, Injector, needs_failpoints, signal};
use super::workload::now_ms;

impl Injector {
    /// SIGKILL a cell, or hang it 3 s (half the time one owning drill
    /// conversations).
    pub(super) async fn cell_fault(
        &mut self,
        fault: &mut Fault,
        kind: FaultKind,
    ) -> anyhow::Result<()> {
        let mut cells = self.dev.cell_pids()?;
        anyhow::ensure!(!cells.is_empty(), "no cells in dev.json");
        // Half the time, a cell that owns drill conversations.
        if self.rng.random_bool(0.5) {
            let mut owners = Vec::new();
            for &c in &self.conversations {
                owners.push(self.owner(c).await?);
            }
            let owning: Vec<_> = cells
                .iter()
                .filter(|(name, _)| owners.contains(name))
                .cloned()
                .collect();
            if !owning.is_empty() {
                cells = owning;
            }
        }
        let (name, pid) = cells[self.rng.random_range(0..cells.len())].clone();
        fault.affected = self.owned_by(&name).await?;
        fault.target = name;
        if matches!(kind, FaultKind::CellKill) {
            signal(pid, libc::SIGKILL);
            fault.kind = "kill (SIGKILL)".into();
        } else {
            signal(pid, libc::SIGSTOP);
            tokio::time::sleep(Duration::from_secs(3)).await;
            signal(pid, libc::SIGCONT);
            fault.kind = "hang 3s (SIGSTOP/SIGCONT)".into();
        }
        Ok(())
    }

    /// SIGKILL the route table's Raft leader; recovered once a
    /// linearizable lookup answers.
    pub(super) async fn router_leader_kill(&mut self, fault: &mut Fault) -> anyhow::Result<()> {
        let region = self.router_leader().await?;
        fault.kind = "kill the route table's Raft leader (SIGKILL)".into();
        fault.target = format!("router-{region}");
        signal(self.dev.pid(&fault.target)?, libc::SIGKILL);
        fault.affected = self.conversations.clone();
        // Whole again when a linearizable lookup (a leader with a
        // quorum) answers.
        let key = Key::conversation(
            TenantId(self.dev.tenant),
            ConversationId(self.conversations[0]),
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let Ok(routes) = self.dev.routes().await else {
                continue;
            };
            let read = routes.resolve_linearizable(&key);
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), read).await {
                fault.recovered_ms = Some(now_ms(self.epoch));
                break;
            }
        }
        fault.detail = match fault.recovered_ms {
            Some(ms) => {
                format!(
                    "linearizable lookups answer again after {} ms",
                    ms - fault.at_ms
                )
            }
            None => "no linearizable lookup answered within 30 s".into(),
        };
        Ok(())
    }

    /// A fail point on every cell owning drill conversations for `hold`.
    pub(super) async fn fail_point(
        &mut self,
        fault: &mut Fault,
        what: &str,
        spec: &str,
        hold: Duration,
    ) -> anyhow::Result<()> {
        needs_failpoints()?;
        // Every cell owning a drill conversation: all of them are hit.
        let routes = self.dev.routes().await?;
        let mut cells: Vec<String> = routes.read(|t| {
            self.conversations
                .iter()
                .filter_map(|&c| {
                    t.resolve(&Key::conversation(
                        TenantId(self.dev.tenant),
                        ConversationId(c),
                    ))
                    .map(|r| r.entry.cell)
                })
                .collect()
        });
        cells.sort();
        cells.dedup();
        fault.affected = self.conversations.clone();
        fault.kind = format!("{what} for {} ms ({spec})", hold.as_millis());
        fault.target = cells.join(",");
        let files: Vec<_> = cells
            .iter()
            .map(|c| self.dev.dir().join(c.replace('/', "-")).join("failpoints"))
            .collect();
        for f in &files {
            std::fs::write(f, format!("{spec}\n"))?;
        }
        tokio::time::sleep(hold).await;
        for f in &files {
            std::fs::remove_file(f).ok();
        }
        fault.detail = "cleared".into();
        if spec.starts_with("queue.") {
            // Fan-out resumes: the outbox the outage filled drains.
            let (lag, drained) = self.drain_outboxes(&cells).await?;
            fault.detail = format!("cleared; outbox backlog {lag} drained");
            anyhow::ensure!(
                drained,
                "the outbox of {cells:?} did not drain within 30 s after the queue outage"
            );
        }
        fault.recovered_ms = Some(now_ms(self.epoch));
        Ok(())
    }

    /// A throttled move whose source is SIGKILLed mid-copy, then resumed.
    pub(super) async fn migration_source_kill(&mut self, fault: &mut Fault) -> anyhow::Result<()> {
        let conversation = self.pick();
        let source = self.owner(conversation).await?;
        fault.kind = "migrate, SIGKILL the source mid-copy, resume".into();
        fault.affected = vec![conversation];
        // Throttled so the kill lands inside the copy.
        let options = MigrationOptions {
            round_messages: 200,
            pause: Duration::from_millis(100),
            ..MigrationOptions::default()
        };
        let dev = self.dev.clone();
        let to = self.other_cell(&source).await?;
        let moving = {
            let to = to.clone();
            tokio::spawn(async move {
                let routes = dev.routes().await?;
                Migrator::new(routes, dev.secret(), options)
                    .migrate_conversation(
                        TenantId(dev.tenant),
                        ConversationId(conversation),
                        &to,
                        |_| {},
                    )
                    .await
                    .map_err(anyhow::Error::from)
            })
        };
        tokio::time::sleep(Duration::from_millis(self.rng.random_range(20..400))).await;
        signal(self.dev.pid(&source.replace('/', "-"))?, libc::SIGKILL);
        let first = match moving.await? {
            Ok(r) => {
                self.moved(&r);
                format!(
                    "finished before the kill took effect ({} ms)",
                    r.total.as_millis()
                )
            }
            Err(e) => format!("interrupted: {e}"),
        };
        fault.target = format!("{source} -> {to}");
        fault.detail = format!("{first}; then {}", self.resume(conversation, &to).await);
        Ok(())
    }

    /// A move whose target aborts after storing a chunk, then resumed.
    pub(super) async fn migration_target_crash(&mut self, fault: &mut Fault) -> anyhow::Result<()> {
        needs_failpoints()?;
        let conversation = self.pick();
        let source = self.owner(conversation).await?;
        let to = self.other_cell(&source).await?;
        fault.kind = "migrate; the target crashes after storing a chunk; resume".into();
        fault.target = format!("{source} -> {to}");
        fault.affected = vec![conversation];
        let file = self.dev.dir().join(to.replace('/', "-")).join("failpoints");
        std::fs::write(&file, "migration.copy_stored=abort\n")?;
        // The cell reads its fail points every 100 ms.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let routes = self.dev.routes().await?;
        let first = Migrator::new(routes, self.dev.secret(), MigrationOptions::default())
            .migrate_conversation(
                TenantId(self.dev.tenant),
                ConversationId(conversation),
                &to,
                |_| {},
            )
            .await;
        std::fs::remove_file(&file).ok();
        let first = match first {
            Ok(r) => {
                self.moved(&r);
                "the move finished: the target did not crash".to_string()
            }
            Err(e) => format!("interrupted: {e}"),
        };
        // The supervisor restarts the target; the move resumes from
        // what it stored.
        fault.detail = format!("{first}; then {}", self.resume(conversation, &to).await);
        fault.recovered_ms = Some(now_ms(self.epoch));
        Ok(())
    }

    /// Kafka broker 1 down for `hold`; every outbox drains after.
    pub(super) async fn broker_outage(
        &mut self,
        fault: &mut Fault,
        hold: Duration,
    ) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.dev.kafka_mock(),
            "broker-outage needs a deployment started with `cellmesh dev --kafka mock`"
        );
        let file = self.dev.dir().join(crate::target::KAFKA_FILE);
        fault.kind = format!("kafka broker down for {} ms", hold.as_millis());
        fault.target = "broker 1".into();
        fault.affected = self.conversations.clone();
        std::fs::write(&file, r#"{"down": [1]}"#)?;
        tokio::time::sleep(hold).await;
        std::fs::write(&file, r#"{"down": []}"#)?;
        let routes = self.dev.routes().await?;
        let mut cells: Vec<String> = routes.read(|t| t.cells.keys().cloned().collect());
        cells.sort();
        // Fan-out resumes: every cell's outbox drains.
        let (lag, drained) = self.drain_outboxes(&cells).await?;
        fault.recovered_ms = Some(now_ms(self.epoch));
        fault.detail = format!("up again; outbox backlog {lag} drained");
        anyhow::ensure!(
            drained,
            "the outboxes did not drain within 30 s after the broker came back"
        );
        Ok(())
    }

    /// A move stopped after a random phase, the control-plane leader
    /// SIGKILLed, then the move resumed.
    pub(super) async fn control_plane_kill_mid_migration(
        &mut self,
        fault: &mut Fault,
    ) -> anyhow::Result<()> {
        let conversation = self.pick();
        let stop = [
            StopPoint::Planned,
            StopPoint::Copied,
            StopPoint::Frozen,
            StopPoint::Sealed,
        ][self.rng.random_range(0..4)];
        let source = self.owner(conversation).await?;
        let to = self.other_cell(&source).await?;
        fault.kind =
            format!("migration stops after {stop:?}; SIGKILL the control-plane leader; resume");
        fault.affected = vec![conversation];
        fault.target = format!("{source} -> {to}");
        let routes = self.dev.routes().await?;
        let stopped = Migrator::new(
            routes,
            self.dev.secret(),
            MigrationOptions {
                stop_after: Some(stop),
                ..MigrationOptions::default()
            },
        )
        .migrate_conversation(
            TenantId(self.dev.tenant),
            ConversationId(conversation),
            &to,
            |_| {},
        )
        .await;
        let leader = self.control_plane_leader().await;
        let killed = match &leader {
            Some(name) => {
                signal(self.dev.pid(name)?, libc::SIGKILL);
                let deadline = Instant::now() + Duration::from_secs(30);
                while Instant::now() < deadline {
                    if self
                        .control_plane_leader()
                        .await
                        .is_some_and(|l| &l != name)
                    {
                        fault.recovered_ms = Some(now_ms(self.epoch));
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                format!("killed {name}")
            }
            None => "no control-plane leader to kill".into(),
        };
        let stopped = match stopped {
            Ok(r) => {
                self.moved(&r);
                "the migration finished before its stop point".to_string()
            }
            Err(e) => e.to_string(),
        };
        fault.detail = format!(
            "{stopped}; {killed}; then {}",
            self.resume(conversation, &to).await
        );
        Ok(())
    }
}
