//! The failover planner: a pure function from the route table and a failed
//! cell to the route writes that move everything it owned to a cell that
//! holds its high-water marks (same region first), each with a new epoch
//! and a floor margin: the new owner puts each conversation's floor at the
//! mark it holds plus that margin. One write per route entry the cell
//! owned (tenants and overrides), none per conversation.

use cellmesh_proto::v1::{self as pb, update_route::Transition};
use cellmesh_route_client::commands::{failover, set_cell_status, set_mark_holders, update_route};
use cellmesh_route_client::table::{RouteState, RouteTable};

#[derive(Debug, Clone, PartialEq)]
pub struct FailoverPlan {
    pub failed: String,
    pub fallback: String,
    /// Marks the cell Down, then moves every entry it owns.
    pub commands: Vec<pb::RouteCommand>,
    pub moved_entries: usize,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error("unknown cell {0}")]
    UnknownCell(String),
    #[error("no healthy cell holding its high-water marks can take over from {0}")]
    NoFallback(String),
}

pub use cellmesh_route_client::table::safety_margin;

pub fn plan_failover(
    table: &RouteTable,
    failed: &str,
    margin: u64,
) -> Result<FailoverPlan, PlanError> {
    if table.cell(failed).is_none() {
        return Err(PlanError::UnknownCell(failed.to_string()));
    }
    let target = table
        .failover_target(failed)
        .ok_or_else(|| PlanError::NoFallback(failed.to_string()))?;
    let fallback = target.id.clone();
    let mut commands = vec![set_cell_status(failed, pb::CellStatus::Down)];
    // The new owner's own holders lack the floors it takes over until it
    // pushes them: only those that also hold the failed cell's marks stay.
    let holders_of_failed = &table.cell(failed).expect("checked").mark_holders;
    let kept: Vec<String> = target
        .mark_holders
        .iter()
        .filter(|h| holders_of_failed.contains(h))
        .cloned()
        .collect();
    if kept != target.mark_holders {
        commands.push(set_mark_holders(&fallback, kept, target.epoch));
    }
    let mut moved = 0;
    for entry in table.routes.values() {
        if entry.cell == failed {
            commands.push(failover(
                &entry.key,
                entry.epoch,
                &fallback,
                entry.seq_floor,
                margin,
            ));
            moved += 1;
        } else if matches!(&entry.state, RouteState::Migrating { to, .. } | RouteState::Frozen { to } if to == failed)
        {
            // A move towards the failed cell is rolled back.
            commands.push(update_route(
                &entry.key,
                entry.epoch,
                Transition::Cancel(true),
            ));
        }
    }
    Ok(FailoverPlan {
        failed: failed.to_string(),
        fallback,
        commands,
        moved_entries: moved,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellmesh_proto::ids::{ConversationId, TenantId};
    use cellmesh_route_client::table::{CellStatus, Command, Key, Transition as T};

    fn table() -> RouteTable {
        let mut t = RouteTable::default();
        let mut i = 0;
        let mut apply = |t: &mut RouteTable, c: Command| {
            i += 1;
            t.apply(&c, i).unwrap();
        };
        for (id, region) in [("eu/c1", "eu"), ("eu/c2", "eu"), ("us/c1", "us")] {
            apply(
                &mut t,
                Command::RegisterCell {
                    id: id.into(),
                    region: region.into(),
                    address: format!("http://{id}"),
                    version: "0.2.0".into(),
                },
            );
        }
        // eu/c1's standbys hold its high-water marks.
        let epoch = t.cell("eu/c1").unwrap().epoch;
        apply(
            &mut t,
            Command::SetMarkHolders {
                cell: "eu/c1".into(),
                holders: vec!["eu/c2".into(), "us/c1".into()],
                expect_epoch: epoch,
            },
        );
        apply(
            &mut t,
            Command::AssignTenant {
                tenant: 1,
                cell: "eu/c1".into(),
                expect_epoch: 0,
            },
        );
        apply(
            &mut t,
            Command::AssignTenant {
                tenant: 2,
                cell: "us/c1".into(),
                expect_epoch: 0,
            },
        );
        let epoch = t.entry(&Key::tenant(TenantId(2))).unwrap().epoch;
        apply(
            &mut t,
            Command::UpdateRoute {
                key: Key::conversation(TenantId(2), ConversationId(9)),
                expect_epoch: epoch,
                transition: T::Failover {
                    to: "eu/c1".into(),
                    seq_floor: 5,
                    floor_margin: 0,
                },
            },
        );
        let epoch = t.entry(&Key::tenant(TenantId(2))).unwrap().epoch;
        apply(
            &mut t,
            Command::UpdateRoute {
                key: Key::conversation(TenantId(2), ConversationId(10)),
                expect_epoch: epoch,
                transition: T::BeginMigration { to: "eu/c1".into() },
            },
        );
        t
    }

    #[test]
    fn everything_of_the_failed_cell_moves_to_a_same_region_fallback() {
        let t = table();
        let plan = plan_failover(&t, "eu/c1", 100).unwrap();
        assert_eq!(plan.fallback, "eu/c2");
        // Tenant 1 and the override of conversation 9 move; the migration
        // towards eu/c1 is cancelled; the cell is marked Down first.
        assert_eq!(plan.moved_entries, 2);
        assert_eq!(plan.commands.len(), 4);
        // Applying the plan leaves nothing on the failed cell.
        let mut after = t.clone();
        for (n, c) in plan.commands.iter().enumerate() {
            let cmd = cellmesh_route_client::convert::command_from_pb(c.clone()).unwrap();
            after.apply(&cmd, 100 + n as u64).unwrap();
        }
        assert_eq!(after.cell("eu/c1").unwrap().status, CellStatus::Down);
        assert!(after.routes.values().all(|e| e.cell != "eu/c1"));
        let r = after
            .resolve(&Key::conversation(TenantId(2), ConversationId(9)))
            .unwrap();
        // The new owner adds the margin to the mark it holds.
        assert_eq!(
            (r.entry.cell.as_str(), r.seq_floor, r.entry.floor_margin),
            ("eu/c2", 5, 100)
        );
        assert_eq!(
            after
                .resolve(&Key::conversation(TenantId(2), ConversationId(10)))
                .unwrap()
                .entry
                .state,
            RouteState::Active
        );
    }

    #[test]
    fn another_region_is_used_when_the_region_has_no_healthy_cell() {
        let mut t = table();
        t.apply(
            &Command::SetCellStatus {
                id: "eu/c2".into(),
                status: CellStatus::Down,
            },
            50,
        )
        .unwrap();
        assert_eq!(plan_failover(&t, "eu/c1", 1).unwrap().fallback, "us/c1");
        t.apply(
            &Command::SetCellStatus {
                id: "us/c1".into(),
                status: CellStatus::Draining,
            },
            51,
        )
        .unwrap();
        assert_eq!(
            plan_failover(&t, "eu/c1", 1),
            Err(PlanError::NoFallback("eu/c1".into()))
        );
        assert_eq!(
            plan_failover(&t, "xx/c9", 1),
            Err(PlanError::UnknownCell("xx/c9".into()))
        );
    }
}
