//! Conversions between the Routing API's protobuf messages and the route
//! table's types. Malformed requests become INVALID_ARGUMENT statuses here.

use cellmesh_proto::ids::TenantId;
use cellmesh_proto::v1 as pb;
use cellmesh_proto::v1::route_key::Scope as PbScope;
use cellmesh_proto::v1::{route_change, route_command, update_route};
use tonic::Status;

use crate::table::{
    CellInfo, CellStatus, Change, Command, Entry, Key, Phase, Resolved, RouteError, RouteState,
    RouteTable, Scope, Transition,
};

fn missing(field: &str) -> Status {
    RouteError::invalid(field, "missing").to_status()
}

pub fn key_from_pb(key: Option<pb::RouteKey>) -> Result<Key, Status> {
    let key = key.ok_or_else(|| missing("key"))?;
    let scope = match key.scope.ok_or_else(|| missing("key.scope"))? {
        PbScope::Tenant(_) => Scope::Tenant,
        PbScope::ConversationId(c) => Scope::Conversation(c),
        PbScope::UserId(u) => Scope::User(u),
    };
    if key.tenant_id == 0 {
        return Err(RouteError::invalid("key.tenant_id", "must not be 0").to_status());
    }
    Ok(Key {
        tenant: TenantId(key.tenant_id),
        scope,
    })
}

pub fn key_to_pb(key: &Key) -> pb::RouteKey {
    pb::RouteKey {
        tenant_id: key.tenant.get(),
        scope: Some(match key.scope {
            Scope::Tenant => PbScope::Tenant(true),
            Scope::Conversation(c) => PbScope::ConversationId(c),
            Scope::User(u) => PbScope::UserId(u),
        }),
    }
}

pub fn cell_status_to_pb(s: CellStatus) -> pb::CellStatus {
    match s {
        CellStatus::Up => pb::CellStatus::Up,
        CellStatus::Degraded => pb::CellStatus::Degraded,
        CellStatus::Down => pb::CellStatus::Down,
        CellStatus::Draining => pb::CellStatus::Draining,
    }
}

pub fn cell_status_from_pb(s: i32) -> Result<CellStatus, Status> {
    match pb::CellStatus::try_from(s) {
        Ok(pb::CellStatus::Up) => Ok(CellStatus::Up),
        Ok(pb::CellStatus::Degraded) => Ok(CellStatus::Degraded),
        Ok(pb::CellStatus::Down) => Ok(CellStatus::Down),
        Ok(pb::CellStatus::Draining) => Ok(CellStatus::Draining),
        _ => Err(RouteError::invalid("status", format!("unknown cell status {s}")).to_status()),
    }
}

pub fn cell_to_pb(c: &CellInfo) -> pb::CellInfo {
    pb::CellInfo {
        cell_id: c.id.clone(),
        region: c.region.clone(),
        address: c.address.clone(),
        status: cell_status_to_pb(c.status) as i32,
        epoch: c.epoch,
        mark_holders: c.mark_holders.clone(),
        version: c.version.clone(),
        owner_lease_ms: c.owner_lease_ms,
    }
}

pub fn cell_from_pb(c: pb::CellInfo) -> Result<CellInfo, Status> {
    Ok(CellInfo {
        status: cell_status_from_pb(c.status)?,
        id: c.cell_id,
        region: c.region,
        address: c.address,
        epoch: c.epoch,
        mark_holders: c.mark_holders,
        version: c.version,
        owner_lease_ms: c.owner_lease_ms,
    })
}

pub fn phase_to_pb(p: Phase) -> pb::MigrationPhase {
    match p {
        Phase::Copy => pb::MigrationPhase::Copy,
        Phase::CatchUp => pb::MigrationPhase::CatchUp,
        Phase::Paused => pb::MigrationPhase::Paused,
    }
}

fn phase_from_pb(p: i32) -> Result<Phase, Status> {
    match pb::MigrationPhase::try_from(p) {
        Ok(pb::MigrationPhase::Copy) => Ok(Phase::Copy),
        Ok(pb::MigrationPhase::CatchUp) => Ok(Phase::CatchUp),
        Ok(pb::MigrationPhase::Paused) => Ok(Phase::Paused),
        _ => Err(RouteError::invalid(
            "set_phase",
            "only COPY, CATCH_UP and PAUSED are set directly; freeze and switch have their own transitions",
        )
        .to_status()),
    }
}

pub fn entry_to_pb(e: &Entry) -> pb::RouteEntry {
    let (state, migrating_to, phase) = match &e.state {
        RouteState::Active => (pb::RouteState::Active, String::new(), None),
        RouteState::Migrating { to, phase } => (
            pb::RouteState::Migrating,
            to.clone(),
            Some(phase_to_pb(*phase)),
        ),
        RouteState::Frozen { to } => (
            pb::RouteState::Frozen,
            to.clone(),
            Some(pb::MigrationPhase::Freeze),
        ),
    };
    pb::RouteEntry {
        key: Some(key_to_pb(&e.key)),
        cell_id: e.cell.clone(),
        epoch: e.epoch,
        state: state as i32,
        migrating_to,
        phase: phase.map_or(0, |p| p as i32),
        seq_floor: e.seq_floor,
        floor_margin: e.floor_margin,
        failed_from: e.failed_from.clone().unwrap_or_default(),
        regions: e.regions.clone(),
    }
}

pub fn entry_from_pb(e: pb::RouteEntry) -> Result<Entry, Status> {
    let state = match pb::RouteState::try_from(e.state) {
        Ok(pb::RouteState::Active) => RouteState::Active,
        Ok(pb::RouteState::Migrating) => RouteState::Migrating {
            to: e.migrating_to,
            phase: phase_from_pb(e.phase)?,
        },
        Ok(pb::RouteState::Frozen) => RouteState::Frozen { to: e.migrating_to },
        _ => return Err(RouteError::invalid("state", "unknown route state").to_status()),
    };
    Ok(Entry {
        key: key_from_pb(e.key)?,
        cell: e.cell_id,
        epoch: e.epoch,
        state,
        seq_floor: e.seq_floor,
        floor_margin: e.floor_margin,
        failed_from: (!e.failed_from.is_empty()).then_some(e.failed_from),
        regions: e.regions,
    })
}

/// The client-facing route of a resolved key.
pub fn route_to_pb(r: &Resolved) -> pb::Route {
    let state = match r.entry.state {
        RouteState::Active => pb::RouteState::Active,
        RouteState::Migrating { .. } => pb::RouteState::Migrating,
        RouteState::Frozen { .. } => pb::RouteState::Frozen,
    };
    pb::Route {
        epoch: r.entry.epoch,
        cell_id: r.entry.cell.clone(),
        cell_address: r.cell_address.clone(),
        state: state as i32,
        seq_floor: r.seq_floor,
    }
}

pub fn change_to_pb(c: &Change) -> pb::RouteChange {
    pb::RouteChange {
        change: Some(match c {
            Change::Cell(cell) => route_change::Change::Cell(cell_to_pb(cell)),
            Change::Route(e) => route_change::Change::Route(entry_to_pb(e)),
            Change::Removed(k) => route_change::Change::Removed(key_to_pb(k)),
            Change::ClusterVersion(v) => route_change::Change::ClusterVersion(v.clone()),
        }),
    }
}

pub fn change_from_pb(c: pb::RouteChange) -> Result<Change, Status> {
    Ok(match c.change.ok_or_else(|| missing("change"))? {
        route_change::Change::Cell(cell) => Change::Cell(cell_from_pb(cell)?),
        route_change::Change::Route(e) => Change::Route(entry_from_pb(e)?),
        route_change::Change::Removed(k) => Change::Removed(key_from_pb(Some(k))?),
        route_change::Change::ClusterVersion(v) => Change::ClusterVersion(v),
    })
}

pub fn table_to_pb(t: &RouteTable) -> pb::RouteTable {
    pb::RouteTable {
        applied_index: t.applied,
        cells: t.cells.values().map(cell_to_pb).collect(),
        entries: t.routes.values().map(entry_to_pb).collect(),
        cluster_version: t.cluster_version.clone(),
    }
}

pub fn table_from_pb(t: pb::RouteTable) -> Result<RouteTable, Status> {
    let mut table = RouteTable::default();
    for cell in t.cells {
        table.apply_change(&Change::Cell(cell_from_pb(cell)?));
    }
    for e in t.entries {
        table.apply_change(&Change::Route(entry_from_pb(e)?));
    }
    table.applied = t.applied_index;
    table.cluster_version = t.cluster_version;
    Ok(table)
}

pub fn command_from_pb(c: pb::RouteCommand) -> Result<Command, Status> {
    Ok(match c.command.ok_or_else(|| missing("command"))? {
        route_command::Command::RegisterCell(r) => Command::RegisterCell {
            id: r.cell_id,
            region: r.region,
            address: r.address,
            version: r.version,
            owner_lease_ms: r.owner_lease_ms,
        },
        route_command::Command::SetClusterVersion(v) => {
            Command::SetClusterVersion { version: v.version }
        }
        route_command::Command::SetCellStatus(s) => Command::SetCellStatus {
            status: cell_status_from_pb(s.status)?,
            id: s.cell_id,
        },
        route_command::Command::AssignTenant(a) => Command::AssignTenant {
            tenant: a.tenant_id,
            cell: a.cell_id,
            expect_epoch: a.expect_epoch,
        },
        route_command::Command::UpdateRoute(u) => Command::UpdateRoute {
            key: key_from_pb(u.key)?,
            expect_epoch: u.expect_epoch,
            transition: match u.transition.ok_or_else(|| missing("transition"))? {
                update_route::Transition::BeginMigration(to) => Transition::BeginMigration { to },
                update_route::Transition::SetPhase(p) => Transition::SetPhase(phase_from_pb(p)?),
                update_route::Transition::Freeze(_) => Transition::Freeze,
                update_route::Transition::SwitchFloor(seq_floor) => {
                    Transition::Switch { seq_floor }
                }
                update_route::Transition::Cancel(_) => Transition::Cancel,
                update_route::Transition::Failover(f) => Transition::Failover {
                    to: f.to,
                    seq_floor: f.seq_floor,
                    floor_margin: f.floor_margin,
                },
                update_route::Transition::Remove(_) => Transition::Remove,
                update_route::Transition::Place(cell) => Transition::Place { cell },
            },
        },
        route_command::Command::SetMarkHolders(h) => Command::SetMarkHolders {
            cell: h.cell_id,
            holders: h.holders,
            expect_epoch: h.expect_epoch,
        },
        route_command::Command::SetTenantRegions(r) => Command::SetTenantRegions {
            tenant: r.tenant_id,
            regions: r.regions,
            expect_epoch: r.expect_epoch,
        },
    })
}

pub fn command_to_pb(c: &Command) -> pb::RouteCommand {
    match c {
        Command::RegisterCell {
            id,
            region,
            address,
            version,
            owner_lease_ms,
        } => crate::commands::register_cell_at(id, region, address, version, *owner_lease_ms),
        Command::SetClusterVersion { version } => crate::commands::set_cluster_version(version),
        Command::SetCellStatus { id, status } => {
            crate::commands::set_cell_status(id, cell_status_to_pb(*status))
        }
        Command::AssignTenant {
            tenant,
            cell,
            expect_epoch,
        } => crate::commands::assign_tenant(TenantId(*tenant), cell, *expect_epoch),
        Command::UpdateRoute {
            key,
            expect_epoch,
            transition,
        } => crate::commands::update_route(
            key,
            *expect_epoch,
            match transition {
                Transition::BeginMigration { to } => {
                    update_route::Transition::BeginMigration(to.clone())
                }
                Transition::SetPhase(p) => {
                    update_route::Transition::SetPhase(phase_to_pb(*p) as i32)
                }
                Transition::Freeze => update_route::Transition::Freeze(true),
                Transition::Switch { seq_floor } => {
                    update_route::Transition::SwitchFloor(*seq_floor)
                }
                Transition::Cancel => update_route::Transition::Cancel(true),
                Transition::Failover {
                    to,
                    seq_floor,
                    floor_margin,
                } => update_route::Transition::Failover(pb::Failover {
                    to: to.clone(),
                    seq_floor: *seq_floor,
                    floor_margin: *floor_margin,
                }),
                Transition::Remove => update_route::Transition::Remove(true),
                Transition::Place { cell } => update_route::Transition::Place(cell.clone()),
            },
        ),
        Command::SetMarkHolders {
            cell,
            holders,
            expect_epoch,
        } => crate::commands::set_mark_holders(cell, holders.clone(), *expect_epoch),
        Command::SetTenantRegions {
            tenant,
            regions,
            expect_epoch,
        } => crate::commands::set_tenant_regions(TenantId(*tenant), regions, *expect_epoch),
    }
}
