//! The failover planner: a pure function from the route table and a failed
//! cell to the route writes that move everything it owned to a cell that
//! holds its high-water marks (same region first), each with a new epoch
//! and a floor margin: the new owner puts each conversation's floor at the
//! mark it holds plus that margin. One write per route entry the cell
//! owned (tenants and overrides), none per conversation.

use cellmesh_proto::v1::{self as pb, update_route::Transition};
use cellmesh_route_client::commands::{failover, set_cell_status, set_mark_holders, update_route};
use cellmesh_route_client::table::{CellStatus, RouteState, RouteTable};

#[derive(Debug, Clone, PartialEq)]
pub struct FailoverPlan {
    pub failed: String,
    pub fallback: String,
    /// Marks the cell Down, then moves every entry it owns.
    pub commands: Vec<pb::RouteCommand>,
    pub moved_entries: usize,
    /// Routes of tenants bound to regions in which no healthy holder of
    /// the failed cell's marks lies: left where they are (their writes
    /// wait for the cell to return, or for an operator).
    pub stranded: Vec<String>,
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
    let mut routes = Vec::new();
    let mut targets = std::collections::BTreeSet::new();
    let mut stranded = Vec::new();
    for entry in table.routes.values() {
        if entry.cell == failed {
            // A tenant bound to regions goes to a holder inside them.
            let Some(to) = target_for(table, failed, &fallback, entry.key.tenant) else {
                stranded.push(entry.key.to_string());
                continue;
            };
            routes.push(failover(
                &entry.key,
                entry.epoch,
                &to,
                entry.seq_floor,
                margin,
            ));
            targets.insert(to);
        } else if matches!(&entry.state, RouteState::Migrating { to, .. } | RouteState::Frozen { to } if to == failed)
        {
            // A move towards the failed cell is rolled back.
            routes.push(update_route(
                &entry.key,
                entry.epoch,
                Transition::Cancel(true),
            ));
        }
    }
    // A new owner's own holders lack the floors it takes over until it
    // pushes them: only those that also hold the failed cell's marks stay.
    let holders_of_failed = &table.cell(failed).expect("checked").mark_holders;
    for id in &targets {
        let target = table.cell(id).expect("a holder is a known cell");
        let kept: Vec<String> = (target.mark_holders.iter())
            .filter(|h| holders_of_failed.contains(h))
            .cloned()
            .collect();
        if kept != target.mark_holders {
            commands.push(set_mark_holders(id, kept, target.epoch));
        }
    }
    let moved_entries = routes.iter().filter(|c| is_failover(c)).count();
    commands.extend(routes);
    Ok(FailoverPlan {
        failed: failed.to_string(),
        fallback,
        commands,
        moved_entries,
        stranded,
    })
}

/// Where a route of `tenant` on `failed` goes: the fallback, or for a
/// tenant bound to regions outside it, an Up holder of the failed cell's
/// marks inside them (same region as the failed cell first); `None` when
/// there is none.
fn target_for(
    table: &RouteTable,
    failed: &str,
    fallback: &str,
    tenant: cellmesh_proto::ids::TenantId,
) -> Option<String> {
    if table.allows(tenant, fallback) {
        return Some(fallback.to_string());
    }
    let cell = table.cell(failed)?;
    let holders = || {
        (cell.mark_holders.iter())
            .filter_map(|id| table.cell(id))
            .filter(|c| c.status == CellStatus::Up && table.allows(tenant, &c.id))
    };
    holders()
        .find(|c| c.region == cell.region)
        .or_else(|| holders().next())
        .map(|c| c.id.clone())
}

fn is_failover(command: &pb::RouteCommand) -> bool {
    matches!(
        &command.command,
        Some(pb::route_command::Command::UpdateRoute(u))
            if matches!(u.transition, Some(Transition::Failover(_)))
    )
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
                    owner_lease_ms: 0,
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

    /// Binds tenant 1 (on eu/c1) to `regions`.
    fn bound(t: &mut RouteTable, regions: &[&str]) {
        let epoch = t.entry(&Key::tenant(TenantId(1))).unwrap().epoch;
        t.apply(
            &Command::SetTenantRegions {
                tenant: 1,
                regions: regions.iter().map(|r| r.to_string()).collect(),
                expect_epoch: epoch,
            },
            50,
        )
        .unwrap();
    }

    #[test]
    fn a_tenant_bound_to_regions_fails_over_only_inside_them() {
        // Bound to us: not the eu fallback, but the holder in us.
        let mut t = table();
        bound(&mut t, &["eu", "us"]);
        let epoch = t.entry(&Key::tenant(TenantId(1))).unwrap().epoch;
        t.apply(
            &Command::AssignTenant {
                tenant: 1,
                cell: "eu/c1".into(),
                expect_epoch: epoch,
            },
            51,
        )
        .unwrap();
        let mut us_only = t.clone();
        let epoch = us_only.entry(&Key::tenant(TenantId(1))).unwrap().epoch;
        // Not while the tenant still lives in eu.
        let refused = us_only
            .apply(
                &Command::SetTenantRegions {
                    tenant: 1,
                    regions: vec!["us".into()],
                    expect_epoch: epoch,
                },
                52,
            )
            .unwrap_err();
        assert_eq!(
            refused.code().1,
            cellmesh_proto::reason::Reason::ResidencyViolation
        );
        // Bound to eu only, and eu/c2 down: nowhere to go, and it says so.
        bound(&mut us_only, &["eu"]);
        us_only
            .apply(
                &Command::SetCellStatus {
                    id: "eu/c2".into(),
                    status: CellStatus::Down,
                },
                53,
            )
            .unwrap();
        let plan = plan_failover(&us_only, "eu/c1", 100).unwrap();
        assert_eq!(plan.fallback, "us/c1");
        assert_eq!(plan.stranded, vec![Key::tenant(TenantId(1)).to_string()]);
        let mut after = us_only.clone();
        for (n, c) in plan.commands.iter().enumerate() {
            let cmd = cellmesh_route_client::convert::command_from_pb(c.clone()).unwrap();
            after.apply(&cmd, 100 + n as u64).unwrap();
        }
        assert_eq!(
            after.entry(&Key::tenant(TenantId(1))).unwrap().cell,
            "eu/c1"
        );
        // The unbound override of tenant 2 still moves to us/c1.
        let r = after
            .resolve(&Key::conversation(TenantId(2), ConversationId(9)))
            .unwrap();
        assert_eq!(r.entry.cell, "us/c1");
        // A failover written by hand outside the regions is refused too.
        let epoch = after.entry(&Key::tenant(TenantId(1))).unwrap().epoch;
        let refused = after
            .apply(
                &Command::UpdateRoute {
                    key: Key::tenant(TenantId(1)),
                    expect_epoch: epoch,
                    transition: T::Failover {
                        to: "us/c1".into(),
                        seq_floor: 0,
                        floor_margin: 0,
                    },
                },
                200,
            )
            .unwrap_err();
        assert_eq!(
            refused.code().1,
            cellmesh_proto::reason::Reason::ResidencyViolation
        );
    }

    #[test]
    fn a_bound_tenant_goes_to_a_holder_inside_its_regions_when_the_fallback_is_outside() {
        let mut t = table();
        let apply = |t: &mut RouteTable, c: Command, i: u64| t.apply(&c, i).unwrap();
        apply(
            &mut t,
            Command::RegisterCell {
                id: "ap/c1".into(),
                region: "ap".into(),
                address: "http://ap/c1".into(),
                version: "0.2.0".into(),
                owner_lease_ms: 0,
            },
            60,
        );
        let epoch = t.cell("eu/c1").unwrap().epoch;
        let holders = ["eu/c2", "us/c1", "ap/c1"].map(String::from).to_vec();
        apply(
            &mut t,
            Command::SetMarkHolders {
                cell: "eu/c1".into(),
                holders,
                expect_epoch: epoch,
            },
            61,
        );
        let down = Command::SetCellStatus {
            id: "eu/c2".into(),
            status: CellStatus::Down,
        };
        apply(&mut t, down, 62);
        bound(&mut t, &["eu", "us"]);
        let plan = plan_failover(&t, "eu/c1", 100).unwrap();
        // The first holder up is ap/c1: the unbound routes go there, the
        // bound tenant to us/c1.
        assert_eq!(plan.fallback, "ap/c1");
        assert!(plan.stranded.is_empty());
        let mut after = t.clone();
        for (n, c) in plan.commands.iter().enumerate() {
            let cmd = cellmesh_route_client::convert::command_from_pb(c.clone()).unwrap();
            after.apply(&cmd, 100 + n as u64).unwrap();
        }
        assert_eq!(
            after.entry(&Key::tenant(TenantId(1))).unwrap().cell,
            "us/c1"
        );
        let r = after
            .resolve(&Key::conversation(TenantId(2), ConversationId(9)))
            .unwrap();
        assert_eq!(r.entry.cell, "ap/c1");
    }
}
