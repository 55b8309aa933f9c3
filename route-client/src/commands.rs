//! Builders for Routing API write messages, shared by the control plane,
//! `cellmesh ctl` and tests.

use cellmesh_proto::ids::TenantId;
use cellmesh_proto::v1::{self as pb, route_command::Command, update_route::Transition};

use crate::convert::key_to_pb;
use crate::table::Key;

/// Registers a cell running this build's release, announcing no owner
/// lease.
pub fn register_cell(cell_id: &str, region: &str, address: &str) -> pb::RouteCommand {
    register_leased_cell(cell_id, region, address, 0)
}

/// Registers a cell running this build's release that writes at most
/// `owner_lease_ms` after its last confirmation from the table.
pub fn register_leased_cell(
    cell_id: &str,
    region: &str,
    address: &str,
    owner_lease_ms: u64,
) -> pb::RouteCommand {
    let version = cellmesh_proto::version::BINARY;
    register_cell_at(cell_id, region, address, version, owner_lease_ms)
}

/// Registers a cell running release `version`.
pub fn register_cell_at(
    cell_id: &str,
    region: &str,
    address: &str,
    version: &str,
    owner_lease_ms: u64,
) -> pb::RouteCommand {
    pb::RouteCommand {
        command: Some(Command::RegisterCell(pb::RegisterCell {
            cell_id: cell_id.into(),
            region: region.into(),
            address: address.into(),
            version: version.into(),
            owner_lease_ms,
        })),
    }
}

/// Raises the cluster version (see `cellmesh_proto::version`).
pub fn set_cluster_version(version: &str) -> pb::RouteCommand {
    pb::RouteCommand {
        command: Some(Command::SetClusterVersion(pb::SetClusterVersion {
            version: version.into(),
        })),
    }
}

pub fn set_cell_status(cell_id: &str, status: pb::CellStatus) -> pb::RouteCommand {
    pb::RouteCommand {
        command: Some(Command::SetCellStatus(pb::SetCellStatus {
            cell_id: cell_id.into(),
            status: status as i32,
        })),
    }
}

/// Binds `tenant` to `regions` (empty: unbinds it).
pub fn set_tenant_regions(
    tenant: TenantId,
    regions: &[String],
    expect_epoch: u64,
) -> pb::RouteCommand {
    pb::RouteCommand {
        command: Some(Command::SetTenantRegions(pb::SetTenantRegions {
            tenant_id: tenant.get(),
            regions: regions.to_vec(),
            expect_epoch,
        })),
    }
}

pub fn assign_tenant(tenant: TenantId, cell_id: &str, expect_epoch: u64) -> pb::RouteCommand {
    pb::RouteCommand {
        command: Some(Command::AssignTenant(pb::AssignTenant {
            tenant_id: tenant.get(),
            cell_id: cell_id.into(),
            expect_epoch,
        })),
    }
}

pub fn update_route(key: &Key, expect_epoch: u64, transition: Transition) -> pb::RouteCommand {
    pb::RouteCommand {
        command: Some(Command::UpdateRoute(pb::UpdateRoute {
            key: Some(key_to_pb(key)),
            expect_epoch,
            transition: Some(transition),
        })),
    }
}

pub fn failover(
    key: &Key,
    expect_epoch: u64,
    to: &str,
    seq_floor: u64,
    floor_margin: u64,
) -> pb::RouteCommand {
    update_route(
        key,
        expect_epoch,
        Transition::Failover(pb::Failover {
            to: to.into(),
            seq_floor,
            floor_margin,
        }),
    )
}

/// Records the cells holding a complete copy of `cell_id`'s high-water
/// marks (written by the cell itself).
pub fn set_mark_holders(
    cell_id: &str,
    holders: Vec<String>,
    expect_epoch: u64,
) -> pb::RouteCommand {
    pb::RouteCommand {
        command: Some(Command::SetMarkHolders(pb::SetMarkHolders {
            cell_id: cell_id.into(),
            holders,
            expect_epoch,
        })),
    }
}
