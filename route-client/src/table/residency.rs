//! Data residency: a tenant bound to regions (its entry's `regions`) has
//! no route placed, moved or failed over to a cell outside them — every
//! command that gives a route a cell asks [`check`] first, so placement,
//! moves (conversation, user, whole tenant) and failovers are refused the
//! same way (`RESIDENCY_VIOLATION`). [`bind`] sets the regions, refused
//! while a route of the tenant lives outside the new ones.

use cellmesh_proto::ids::TenantId;

use super::command::{check_epoch, nonzero};
use super::{Change, Key, RouteError, RouteState, RouteTable};

impl RouteTable {
    /// The regions `tenant`'s data may live in (empty: any).
    pub fn regions_of(&self, tenant: TenantId) -> &[String] {
        self.entry(&Key::tenant(tenant))
            .map_or(&[], |e| e.regions.as_slice())
    }

    /// Whether `tenant` may have a route on `cell` (an unknown cell's
    /// region is unknown: only an unbound tenant may).
    pub fn allows(&self, tenant: TenantId, cell: &str) -> bool {
        let regions = self.regions_of(tenant);
        regions.is_empty() || self.cell(cell).is_some_and(|c| regions.contains(&c.region))
    }
}

/// Refuses a route of `tenant` towards `cell` outside its regions.
pub(super) fn check(table: &RouteTable, tenant: TenantId, cell: &str) -> Result<(), RouteError> {
    if table.allows(tenant, cell) {
        return Ok(());
    }
    let region = table.cell(cell).map_or("?", |c| c.region.as_str());
    Err(RouteError::Residency(format!(
        "tenant {tenant} may live only in {}: cell {cell} is in {region}",
        table.regions_of(tenant).join(", ")
    )))
}

/// `SetTenantRegions`: the tenant's entry with `regions` (sorted, without
/// repeats), once every route of the tenant (and every move under way)
/// lies inside them.
pub(super) fn bind(
    table: &RouteTable,
    tenant: TenantId,
    regions: &[String],
    expect_epoch: u64,
    index: u64,
) -> Result<Vec<Change>, RouteError> {
    nonzero("tenant_id", tenant.get())?;
    let key = Key::tenant(tenant);
    let current = table
        .entry(&key)
        .ok_or_else(|| RouteError::NoRoute(key.to_string()))?;
    check_epoch(current, expect_epoch)?;
    let mut regions = regions.to_vec();
    regions.sort();
    regions.dedup();
    if let Some(bad) = regions.iter().find(|r| r.is_empty() || r.len() > 64) {
        return Err(RouteError::invalid(
            "regions",
            format!("{bad:?} is not a region name"),
        ));
    }
    if !regions.is_empty() {
        let inside = |cell: &str| {
            table
                .cell(cell)
                .is_some_and(|c| regions.contains(&c.region))
        };
        for entry in table.routes.values().filter(|e| e.key.tenant == tenant) {
            let moving_to = match &entry.state {
                RouteState::Migrating { to, .. } | RouteState::Frozen { to } => Some(to),
                RouteState::Active => None,
            };
            if let Some(outside) = [Some(&entry.cell), moving_to]
                .into_iter()
                .flatten()
                .find(|c| !inside(c))
            {
                return Err(RouteError::Residency(format!(
                    "{} lives on (or moves to) {outside}, outside {}: move it first",
                    entry.key,
                    regions.join(", ")
                )));
            }
        }
    }
    Ok(vec![Change::Route(super::Entry {
        epoch: index,
        regions,
        ..current.clone()
    })])
}
