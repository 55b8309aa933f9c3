//! The route table (DESIGN.md §3): which cell owns each tenant, each
//! conversation override and each user-home override, with epochs, migration
//! states and seq floors; the cell registry with the cells that hold each
//! cell's high-water marks. Nothing per written conversation: the marks a
//! failover floor comes from live on the cells (see `cellmesh-cell`'s
//! `hwm` module). Pure data and logic: the Raft state machine and every
//! route client hold one of these and feed it the same [`Change`]s.

mod command;
mod error;
mod residency;

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

pub use command::{Command, Transition};
pub use error::RouteError;

/// What a route is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Scope {
    Tenant,
    Conversation(u64),
    User(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Key {
    pub tenant: TenantId,
    pub scope: Scope,
}

impl Key {
    /// A tenant's placement (the default of its conversations and users).
    pub fn tenant(tenant: TenantId) -> Self {
        Self {
            tenant,
            scope: Scope::Tenant,
        }
    }
    /// A conversation's own route (an override of its tenant's).
    pub fn conversation(tenant: TenantId, conversation: ConversationId) -> Self {
        Self {
            tenant,
            scope: Scope::Conversation(conversation.get()),
        }
    }
    /// A user's home (an override of its tenant's).
    pub fn user(tenant: TenantId, user: UserId) -> Self {
        Self {
            tenant,
            scope: Scope::User(user.get()),
        }
    }
    /// The tenant default this key falls back to.
    pub fn tenant_key(&self) -> Self {
        Self::tenant(self.tenant)
    }
    pub fn is_override(&self) -> bool {
        self.scope != Scope::Tenant
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.scope {
            Scope::Tenant => write!(f, "tenant {}", self.tenant),
            Scope::Conversation(c) => write!(f, "conversation {c} of tenant {}", self.tenant),
            Scope::User(u) => write!(f, "user {u} of tenant {}", self.tenant),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CellStatus {
    Up,
    Degraded,
    Down,
    Draining,
}

impl CellStatus {
    /// Whether a cell so marked is fenced: it renews no owner lease (from
    /// release `FENCED_LEASE` on), so one lease after the mark it writes no
    /// more. The control plane fences a failed cell (Degraded) a lease
    /// before it fails it over (Down).
    pub fn fenced(self) -> bool {
        matches!(self, CellStatus::Degraded | CellStatus::Down)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CellInfo {
    pub id: String,
    pub region: String,
    pub address: String,
    pub status: CellStatus,
    pub epoch: u64,
    /// The cells holding a complete copy of this cell's high-water marks;
    /// a failover of this cell goes to one of them.
    #[serde(default)]
    pub mark_holders: Vec<String>,
    /// The release the cell registered with ("" before releases were
    /// reported).
    #[serde(default)]
    pub version: String,
    /// How long the cell writes after its last confirmation from the
    /// table (0: not announced, as by releases before 0.3.0).
    #[serde(default)]
    pub owner_lease_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Phase {
    Copy,
    CatchUp,
    /// Held by an operator between copy rounds; resumes at `CatchUp`.
    Paused,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RouteState {
    Active,
    Migrating {
        to: String,
        phase: Phase,
    },
    /// The owner rejects writes; `to` is the migration target.
    Frozen {
        to: String,
    },
}

impl RouteState {
    pub fn name(&self) -> &'static str {
        match self {
            RouteState::Active => "Active",
            RouteState::Migrating { .. } => "Migrating",
            RouteState::Frozen { .. } => "Frozen",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub key: Key,
    pub cell: String,
    /// The log index of the last change: every change bumps it, and epochs
    /// are ordered across the whole table.
    pub epoch: u64,
    pub state: RouteState,
    pub seq_floor: u64,
    /// After a failover: a conversation's floor is the high-water mark the
    /// new owner holds from the failed cell, plus this.
    pub floor_margin: u64,
    /// The cell a failover took this route from (the first, across chained
    /// failovers); a failback moves it there again. A migration clears it.
    #[serde(default)]
    pub failed_from: Option<String>,
    /// A tenant's entry: the regions its data may live in (empty: any).
    /// Overrides carry none; their tenant's entry says.
    #[serde(default)]
    pub regions: Vec<String>,
}

/// One effect of an applied command; the watch stream carries these.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    Cell(CellInfo),
    Route(Entry),
    Removed(Key),
    /// The cluster version was raised to this.
    ClusterVersion(String),
}

/// The effective route of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The entry the route comes from (the override, else the tenant's).
    pub entry: Entry,
    pub cell_address: String,
    /// Seq must be assigned strictly above this (and, after a failover,
    /// above the owner's high-water mark plus `entry.floor_margin`).
    pub seq_floor: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteTable {
    pub cells: BTreeMap<String, CellInfo>,
    pub routes: BTreeMap<Key, Entry>,
    /// Log index of the last applied command.
    pub applied: u64,
    /// The release every process runs, as `ctl upgrade finalize` last
    /// raised it ("" = never; see `cellmesh_proto::version`).
    pub cluster_version: String,
}

impl RouteTable {
    /// Validates `command` at log `index` and applies its changes; an error
    /// leaves the table as it was (except the applied index).
    pub fn apply(&mut self, command: &Command, index: u64) -> Result<Vec<Change>, RouteError> {
        let result = command.plan(self, index);
        if let Ok(changes) = &result {
            for change in changes {
                self.apply_change(change);
            }
        }
        self.applied = self.applied.max(index);
        result
    }

    /// Applies one change (the route client's path: changes come validated).
    pub fn apply_change(&mut self, change: &Change) {
        match change {
            Change::Cell(cell) => {
                self.cells.insert(cell.id.clone(), cell.clone());
            }
            Change::Route(entry) => {
                self.routes.insert(entry.key, entry.clone());
            }
            Change::Removed(key) => {
                self.routes.remove(key);
            }
            Change::ClusterVersion(version) => {
                self.cluster_version = version.clone();
            }
        }
    }

    /// The entry stored under exactly `key`.
    pub fn entry(&self, key: &Key) -> Option<&Entry> {
        self.routes.get(key)
    }

    /// The entry that decides `key`: its override, else its tenant's.
    pub fn effective(&self, key: &Key) -> Option<&Entry> {
        self.routes
            .get(key)
            .or_else(|| self.routes.get(&key.tenant_key()))
    }

    /// Where `key` lives now, with the floor its owner must respect.
    pub fn resolve(&self, key: &Key) -> Option<Resolved> {
        let entry = self.effective(key)?;
        Some(Resolved {
            entry: entry.clone(),
            cell_address: self
                .cells
                .get(&entry.cell)
                .map(|c| c.address.clone())
                .unwrap_or_default(),
            seq_floor: entry.seq_floor,
        })
    }

    /// Where new conversations of `tenant` are created: its owner, or the
    /// target while the tenant migrates (the new conversation's override is
    /// placed there first, see [`Transition::Place`]).
    pub fn creation_cell(&self, tenant: TenantId) -> Option<&CellInfo> {
        let entry = self.entry(&Key::tenant(tenant))?;
        match &entry.state {
            RouteState::Active => self.cells.get(&entry.cell),
            RouteState::Migrating { to, .. } | RouteState::Frozen { to } => self.cells.get(to),
        }
    }

    pub fn cell(&self, id: &str) -> Option<&CellInfo> {
        self.cells.get(id)
    }

    /// Where `cell`'s data goes ahead of a failover: the first other cell
    /// that is Up in its region, else the first Up cell anywhere (by id).
    /// Cells replicate conversation meta and push their high-water marks to
    /// it (see [`Self::standbys_for`]).
    pub fn fallback_for(&self, cell: &str) -> Option<&CellInfo> {
        let region = self.cells.get(cell).map(|c| c.region.as_str());
        let up = || {
            self.cells
                .values()
                .filter(move |c| c.id != cell && c.status == CellStatus::Up)
        };
        up().find(|c| Some(c.region.as_str()) == region)
            .or_else(|| up().next())
    }

    /// Where `cell` copies conversation meta ahead of a failover: its
    /// fallback, and the first Up cell of another region — where failovers
    /// end up when its whole region is cut off (the fallback's own
    /// fallback is then that same cell).
    pub fn standbys_for(&self, cell: &str) -> Vec<&CellInfo> {
        let region = self.cells.get(cell).map(|c| c.region.as_str());
        let mut out: Vec<&CellInfo> = self.fallback_for(cell).into_iter().collect();
        if let Some(other) = self.cells.values().find(|c| {
            c.id != cell && c.status == CellStatus::Up && Some(c.region.as_str()) != region
        }) && !out.iter().any(|c| c.id == other.id)
        {
            out.push(other);
        }
        out
    }

    /// Where `cell`'s routes go when it fails: an Up cell that holds its
    /// high-water marks (same region first), so every floor can be put
    /// above what the failed cell acknowledged. A cell that owns no route
    /// needs no marks: its [fallback](Self::fallback_for).
    pub fn failover_target(&self, cell: &str) -> Option<&CellInfo> {
        if !self.routes.values().any(|e| e.cell == cell) {
            return self.fallback_for(cell);
        }
        let failed = self.cells.get(cell)?;
        let holders = || {
            failed
                .mark_holders
                .iter()
                .filter_map(|id| self.cells.get(id))
                .filter(|c| c.status == CellStatus::Up)
        };
        holders()
            .find(|c| c.region == failed.region)
            .or_else(|| holders().next())
    }

    /// Every change that rebuilds this table from empty (snapshots, resets).
    pub fn as_changes(&self) -> Vec<Change> {
        let cells = self.cells.values().cloned().map(Change::Cell);
        let routes = self.routes.values().cloned().map(Change::Route);
        let version = (!self.cluster_version.is_empty())
            .then(|| Change::ClusterVersion(self.cluster_version.clone()));
        cells.chain(routes).chain(version).collect()
    }
}

#[cfg(test)]
mod tests;

/// How far past its last acknowledged high-water mark a conversation's seq
/// can move: the burst plus the sustained rate over two checkpoint
/// intervals (one may have been in flight when the owner died). Cells stop
/// assigning seq beyond the mark their standbys acknowledged plus this; a
/// failover puts floors this far above the mark the new owner holds.
pub fn safety_margin(
    conversation_per_sec: u64,
    conversation_burst: u64,
    checkpoint_interval_ms: u64,
) -> u64 {
    conversation_burst + (conversation_per_sec * checkpoint_interval_ms * 2).div_ceil(1000)
}
