//! Route writes and their validation: each [`Command`] is checked against the
//! current table and turned into the [`Change`]s it makes. Epochs of changed
//! entries become the log index of the command.

use cellmesh_proto::ids::TenantId;
use cellmesh_proto::version::Version;
use serde::{Deserialize, Serialize};

use super::{
    CellInfo, CellStatus, Change, Entry, Key, Phase, RouteError, RouteState, RouteTable, Scope,
};

/// One transition of a route entry (DESIGN.md §5 and §6).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Transition {
    /// Active → Migrating{to, Copy}.
    BeginMigration { to: String },
    /// Migrating: advance to a later phase.
    SetPhase(Phase),
    /// Migrating → Frozen.
    Freeze,
    /// Frozen → Active on the migration target with seq above the floor.
    Switch { seq_floor: u64 },
    /// Migrating or Frozen → Active on the same cell.
    Cancel,
    /// Any state → Active on another cell.
    Failover {
        to: String,
        seq_floor: u64,
        floor_margin: u64,
    },
    /// Drop an override that agrees with its tenant's route.
    Remove,
    /// Create the override of a new conversation on the target of its
    /// tenant's migration (new conversations of a moving tenant are
    /// created there).
    Place { cell: String },
}

impl Transition {
    fn name(&self) -> &'static str {
        match self {
            Transition::BeginMigration { .. } => "begin a migration",
            Transition::SetPhase(_) => "set a migration phase",
            Transition::Freeze => "freeze",
            Transition::Switch { .. } => "switch",
            Transition::Cancel => "cancel a migration",
            Transition::Failover { .. } => "fail over",
            Transition::Remove => "remove the override",
            Transition::Place { .. } => "place a new conversation",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    RegisterCell {
        id: String,
        region: String,
        address: String,
        /// The release the cell runs ("" before releases were reported).
        version: String,
        /// The cell's owner lease (0: not announced).
        owner_lease_ms: u64,
    },
    /// Raises the cluster version; never lowers it, and refused while a
    /// cell that is not Down registered an older release.
    SetClusterVersion {
        version: String,
    },
    SetCellStatus {
        id: String,
        status: CellStatus,
    },
    /// Places a new tenant (`expect_epoch` 0) or moves an Active one.
    AssignTenant {
        tenant: u64,
        cell: String,
        expect_epoch: u64,
    },
    UpdateRoute {
        key: Key,
        expect_epoch: u64,
        transition: Transition,
    },
    /// Binds `tenant` to `regions` (empty: unbinds it); refused while a
    /// route of the tenant lives outside them.
    SetTenantRegions {
        tenant: u64,
        regions: Vec<String>,
        expect_epoch: u64,
    },
    /// The cells that hold a complete copy of `cell`'s high-water marks.
    SetMarkHolders {
        cell: String,
        holders: Vec<String>,
        expect_epoch: u64,
    },
}

impl Command {
    pub(super) fn plan(&self, table: &RouteTable, index: u64) -> Result<Vec<Change>, RouteError> {
        match self {
            Command::RegisterCell {
                id,
                region,
                address,
                version,
                owner_lease_ms,
            } => register_cell(
                table,
                id,
                (region, address),
                (version, *owner_lease_ms),
                index,
            ),
            Command::SetClusterVersion { version } => raise_cluster_version(table, version),
            Command::SetCellStatus { id, status } => {
                let mut cell = known_cell(table, id)?.clone();
                cell.status = *status;
                cell.epoch = index;
                Ok(vec![Change::Cell(cell)])
            }
            Command::AssignTenant {
                tenant,
                cell,
                expect_epoch,
            } => {
                nonzero("tenant_id", *tenant)?;
                usable_cell(table, cell)?;
                super::residency::check(table, TenantId(*tenant), cell)?;
                let key = Key::tenant(TenantId(*tenant));
                let entry = match table.entry(&key) {
                    None if *expect_epoch == 0 => Entry {
                        key,
                        cell: cell.clone(),
                        epoch: index,
                        state: RouteState::Active,
                        seq_floor: 0,
                        floor_margin: 0,
                        failed_from: None,
                        regions: Vec::new(),
                    },
                    None => return Err(RouteError::NoRoute(key.to_string())),
                    Some(current) => {
                        check_epoch(current, *expect_epoch)?;
                        if current.state != RouteState::Active {
                            return Err(illegal(current, "reassign"));
                        }
                        Entry {
                            cell: cell.clone(),
                            epoch: index,
                            ..current.clone()
                        }
                    }
                };
                Ok(vec![Change::Route(entry)])
            }
            Command::UpdateRoute {
                key,
                expect_epoch,
                transition,
            } => update_route(table, *key, *expect_epoch, transition, index),
            Command::SetTenantRegions {
                tenant,
                regions,
                expect_epoch,
            } => super::residency::bind(table, TenantId(*tenant), regions, *expect_epoch, index),
            Command::SetMarkHolders {
                cell,
                holders,
                expect_epoch,
            } => {
                let mut info = known_cell(table, cell)?.clone();
                if info.epoch != *expect_epoch {
                    return Err(RouteError::StaleEpoch {
                        key: format!("cell {cell}"),
                        expected: *expect_epoch,
                        current: info.epoch,
                    });
                }
                let mut holders = holders.clone();
                holders.sort();
                holders.dedup();
                for holder in &holders {
                    known_cell(table, holder)?;
                    if holder == cell {
                        return Err(RouteError::invalid(
                            "holders",
                            "a cell cannot hold its own marks",
                        ));
                    }
                }
                info.mark_holders = holders;
                info.epoch = index;
                Ok(vec![Change::Cell(info)])
            }
        }
    }
}

fn update_route(
    table: &RouteTable,
    key: Key,
    expect_epoch: u64,
    transition: &Transition,
    index: u64,
) -> Result<Vec<Change>, RouteError> {
    nonzero("tenant_id", key.tenant.get())?;
    match key.scope {
        Scope::Conversation(id) => nonzero("conversation_id", id)?,
        Scope::User(id) => nonzero("user_id", id)?,
        Scope::Tenant => {}
    }
    // An override that does not exist yet starts as a copy of its tenant's,
    // Active on the tenant's owner even while the tenant itself moves: the
    // tenant's phase is about the tenant as a whole.
    let effective = table
        .effective(&key)
        .ok_or_else(|| RouteError::NoRoute(key.to_string()))?;
    check_epoch(effective, expect_epoch)?;
    if let Transition::Place { cell } = transition {
        return place(table, key, effective, cell, index);
    }
    let inherited;
    let current = if effective.key == key {
        effective
    } else {
        inherited = Entry {
            state: RouteState::Active,
            ..effective.clone()
        };
        &inherited
    };
    let mut next = Entry {
        key,
        epoch: index,
        ..current.clone()
    };
    // Regions live on the tenant's entry alone.
    if key.is_override() {
        next.regions.clear();
    }
    let refuse = || illegal(current, transition.name());
    match (transition, &current.state) {
        (Transition::BeginMigration { to }, RouteState::Active) => {
            usable_cell(table, to)?;
            super::residency::check(table, key.tenant, to)?;
            if *to == current.cell {
                return Err(RouteError::invalid("to", "is the current owner"));
            }
            next.state = RouteState::Migrating {
                to: to.clone(),
                phase: Phase::Copy,
            };
        }
        (Transition::SetPhase(phase), RouteState::Migrating { to, phase: now })
            if phase >= now || (*now == Phase::Paused && *phase == Phase::CatchUp) =>
        {
            next.state = RouteState::Migrating {
                to: to.clone(),
                phase: *phase,
            };
        }
        (Transition::Freeze, RouteState::Migrating { to, phase }) if *phase != Phase::Paused => {
            next.state = RouteState::Frozen { to: to.clone() };
        }
        (Transition::Switch { seq_floor }, RouteState::Frozen { to }) => {
            next.cell = to.clone();
            next.state = RouteState::Active;
            next.seq_floor = current.seq_floor.max(*seq_floor);
            next.floor_margin = 0;
            next.failed_from = None;
        }
        (Transition::Cancel, RouteState::Migrating { .. } | RouteState::Frozen { .. }) => {
            next.state = RouteState::Active;
        }
        (
            Transition::Failover {
                to,
                seq_floor,
                floor_margin,
            },
            _,
        ) => {
            known_cell(table, to)?;
            if *to == current.cell {
                return Err(RouteError::invalid("to", "is the current owner"));
            }
            super::residency::check(table, key.tenant, to)?;
            next.cell = to.clone();
            next.state = RouteState::Active;
            next.seq_floor = current.seq_floor.max(*seq_floor);
            next.floor_margin = *floor_margin;
            next.failed_from = current
                .failed_from
                .clone()
                .or_else(|| Some(current.cell.clone()));
        }
        (Transition::Remove, RouteState::Active) => {
            if !key.is_override() || table.entry(&key).is_none() {
                return Err(RouteError::NoRoute(format!("override for {key}")));
            }
            let tenant = table
                .entry(&key.tenant_key())
                .ok_or_else(|| RouteError::NoRoute(key.tenant_key().to_string()))?;
            if tenant.cell != current.cell {
                return Err(RouteError::invalid(
                    "key",
                    format!(
                        "the override points at {}, its tenant at {}",
                        current.cell, tenant.cell
                    ),
                ));
            }
            return Ok(vec![Change::Removed(key)]);
        }
        _ => return Err(refuse()),
    }
    Ok(vec![Change::Route(next)])
}

/// The override of a conversation created on `cell` while its tenant
/// migrates there.
fn place(
    table: &RouteTable,
    key: Key,
    tenant: &Entry,
    cell: &str,
    index: u64,
) -> Result<Vec<Change>, RouteError> {
    if !matches!(key.scope, Scope::Conversation(_)) || tenant.key == key {
        return Err(RouteError::invalid(
            "key",
            format!("{key} is not a new conversation"),
        ));
    }
    match &tenant.state {
        RouteState::Migrating { to, .. } | RouteState::Frozen { to } if to == cell => {}
        _ => return Err(illegal(tenant, "place a new conversation")),
    }
    usable_cell(table, cell)?;
    super::residency::check(table, key.tenant, cell)?;
    Ok(vec![Change::Route(Entry {
        key,
        cell: cell.to_string(),
        epoch: index,
        state: RouteState::Active,
        seq_floor: 0,
        floor_margin: 0,
        failed_from: None,
        regions: Vec::new(),
    })])
}

fn validate_cell_id(id: &str, region: &str) -> Result<(), RouteError> {
    let valid_part = |s: &str| {
        !s.is_empty()
            && s.len() <= 64
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    match id.split_once('/') {
        Some((r, name)) if valid_part(r) && valid_part(name) => {
            if r != region {
                return Err(RouteError::invalid(
                    "region",
                    format!("cell {id} is not in region {region:?}"),
                ));
            }
            Ok(())
        }
        _ => Err(RouteError::invalid(
            "cell_id",
            format!("{id:?} is not region/name"),
        )),
    }
}

fn known_cell<'a>(table: &'a RouteTable, id: &str) -> Result<&'a CellInfo, RouteError> {
    table
        .cell(id)
        .ok_or_else(|| RouteError::UnknownCell(id.to_string()))
}

/// A cell that may receive new ownership.
fn usable_cell(table: &RouteTable, id: &str) -> Result<(), RouteError> {
    let cell = known_cell(table, id)?;
    match cell.status {
        CellStatus::Up | CellStatus::Degraded => Ok(()),
        status => Err(RouteError::invalid(
            "cell_id",
            format!("cell {id} is {status:?}"),
        )),
    }
}

pub(super) fn nonzero(field: &str, value: u64) -> Result<(), RouteError> {
    if value == 0 {
        return Err(RouteError::invalid(field, "must not be 0"));
    }
    Ok(())
}

pub(super) fn check_epoch(current: &Entry, expected: u64) -> Result<(), RouteError> {
    if current.epoch != expected {
        return Err(RouteError::StaleEpoch {
            key: current.key.to_string(),
            expected,
            current: current.epoch,
        });
    }
    Ok(())
}

fn illegal(current: &Entry, transition: &str) -> RouteError {
    RouteError::IllegalTransition {
        key: current.key.to_string(),
        state: current.state.name().to_string(),
        transition: transition.to_string(),
    }
}

/// A cell's (re-)registration: its address and release; a release older
/// than the cluster version is refused.
/// Registers cell `id` at (`region`, `address`), running (`version`, with
/// owner lease `owner_lease_ms`).
fn register_cell(
    table: &RouteTable,
    id: &str,
    (region, address): (&str, &str),
    (version, owner_lease_ms): (&str, u64),
    index: u64,
) -> Result<Vec<Change>, RouteError> {
    validate_cell_id(id, region)?;
    if address.is_empty() {
        return Err(RouteError::invalid("address", "empty"));
    }
    if let Some(cluster) = Version::reported(&table.cluster_version)
        && Version::reported(version).is_none_or(|v| v < cluster)
    {
        return Err(RouteError::VersionBehind(format!(
            "cell {id} runs release {} but the cluster version is {cluster}: \
             every process runs {cluster} or later since it was finalized",
            shown(version)
        )));
    }
    let known = table.cell(id);
    Ok(vec![Change::Cell(CellInfo {
        id: id.to_string(),
        region: region.to_string(),
        address: address.to_string(),
        status: known.map_or(CellStatus::Up, |c| c.status),
        epoch: index,
        mark_holders: known.map(|c| c.mark_holders.clone()).unwrap_or_default(),
        version: version.to_string(),
        owner_lease_ms,
    })])
}

/// Raises the cluster version to `version`: never lower, and only when no
/// cell that is not Down registered an older release.
fn raise_cluster_version(table: &RouteTable, version: &str) -> Result<Vec<Change>, RouteError> {
    let target = Version::parse(version).map_err(|e| RouteError::invalid("version", e))?;
    if let Some(current) = Version::reported(&table.cluster_version)
        && target < current
    {
        return Err(RouteError::VersionBehind(format!(
            "the cluster version is {current}: it is never lowered (to {target})"
        )));
    }
    let laggards: Vec<String> = table
        .cells
        .values()
        .filter(|c| c.status != CellStatus::Down)
        .filter(|c| Version::reported(&c.version).is_none_or(|v| v < target))
        .map(|c| format!("cell {} runs {}", c.id, shown(&c.version)))
        .collect();
    if !laggards.is_empty() {
        return Err(RouteError::VersionBehind(format!(
            "cannot finalize {target}: {}",
            laggards.join("; ")
        )));
    }
    Ok(vec![Change::ClusterVersion(target.to_string())])
}

/// A reported release for a message ("" = a build from before releases).
fn shown(version: &str) -> &str {
    if version.is_empty() {
        "a release before 0.2.0"
    } else {
        version
    }
}
