//! Moving everything at once off or onto a cell by live migration:
//! draining a cell (no new placements, then every tenant, conversation and
//! user-home override it owns moves elsewhere) and failing back what a
//! failover took from a cell once it is Up again. Both resume when run again: their state
//! is the route table's.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::v1 as pb;
use cellmesh_route_client::commands::set_cell_status;
use cellmesh_route_client::table::{CellStatus, Entry, Key, Scope};

use super::tenant::TenantProgress;
use super::{MigrationError, Migrator, call};

/// The routes a bulk move covers.
#[derive(Debug, Default, Clone)]
pub struct Selection {
    pub tenants: Vec<u64>,
    pub conversations: Vec<(u64, u64)>,
    /// User-home overrides, as (tenant, user).
    pub users: Vec<(u64, u64)>,
}

/// What a bulk move did.
#[derive(Debug, Default)]
pub struct BulkReport {
    pub to: String,
    pub selection: Selection,
    pub conversations_moved: u64,
    /// Routes that did not move, with why; running again resumes them.
    pub failures: Vec<(Key, String)>,
}

/// One line of what a bulk move is doing (for an operator's terminal).
pub enum BulkEvent<'a> {
    Tenant(u64, &'a TenantProgress),
    Moved(Key),
    Failed(Key, &'a MigrationError),
}

impl Migrator {
    fn select(&self, pick: impl Fn(&Entry) -> bool) -> Selection {
        self.routes.read(|t| {
            let mut s = Selection::default();
            for e in t.routes.values().filter(|e| pick(e)) {
                match e.key.scope {
                    Scope::Tenant => s.tenants.push(e.key.tenant.get()),
                    Scope::Conversation(c) => s.conversations.push((e.key.tenant.get(), c)),
                    Scope::User(u) => s.users.push((e.key.tenant.get(), u)),
                }
            }
            s
        })
    }

    async fn move_all(
        &self,
        selection: Selection,
        to: &str,
        parallel: usize,
        mut events: impl FnMut(BulkEvent<'_>),
    ) -> BulkReport {
        let mut report = BulkReport {
            to: to.to_string(),
            ..Default::default()
        };
        for &tenant in &selection.tenants {
            let key = Key::tenant(TenantId(tenant));
            match self
                .migrate_tenant(TenantId(tenant), to, parallel, |p| {
                    events(BulkEvent::Tenant(tenant, p))
                })
                .await
            {
                Ok(r) => {
                    report.conversations_moved += r.conversations_moved;
                    events(BulkEvent::Moved(key));
                }
                Err(e) => {
                    events(BulkEvent::Failed(key, &e));
                    report.failures.push((key, e.to_string()));
                }
            }
        }
        let overrides = (selection.conversations.iter())
            .map(|&(t, c)| Key::conversation(TenantId(t), ConversationId(c)))
            .chain(
                selection
                    .users
                    .iter()
                    .map(|&(t, u)| Key::user(TenantId(t), UserId(u))),
            );
        for key in overrides {
            // A tenant move above may have taken it along already.
            if self
                .routes
                .resolve(&key)
                .is_some_and(|r| r.entry.cell == to)
            {
                continue;
            }
            let moved = match key.scope {
                Scope::User(user) => self
                    .migrate_user(key.tenant, UserId(user), to, |_| {})
                    .await
                    .map(|_| 0),
                Scope::Conversation(c) => self
                    .migrate_conversation(key.tenant, ConversationId(c), to, |_| {})
                    .await
                    .map(|_| 1),
                Scope::Tenant => continue,
            };
            match moved {
                Ok(n) => {
                    report.conversations_moved += n;
                    events(BulkEvent::Moved(key));
                }
                Err(e) => {
                    events(BulkEvent::Failed(key, &e));
                    report.failures.push((key, e.to_string()));
                }
            }
        }
        report.selection = selection;
        report
    }

    /// Marks `cell` Draining (nothing new is placed on it) and moves every
    /// tenant and override it owns to `to`, else its fallback.
    pub async fn drain(
        &self,
        cell: &str,
        to: Option<&str>,
        parallel: usize,
        events: impl FnMut(BulkEvent<'_>),
    ) -> Result<BulkReport, MigrationError> {
        if self.routes.read(|t| t.cell(cell).is_none()) {
            return Err(MigrationError::Refused(format!("unknown cell {cell}")));
        }
        let to = match to {
            Some(to) => to.to_string(),
            None => self
                .routes
                .read(|t| t.fallback_for(cell).map(|c| c.id.clone()))
                .ok_or_else(|| {
                    MigrationError::Refused(format!("no Up cell to drain {cell} into"))
                })?,
        };
        if to == cell {
            return Err(MigrationError::Refused(format!(
                "cannot drain {cell} into itself"
            )));
        }
        let applied = self
            .routes
            .apply(set_cell_status(cell, pb::CellStatus::Draining))
            .await
            .map_err(call("mark the cell Draining"))?;
        self.follow(applied.index).await;
        let selection = self.select(|e| e.cell == cell);
        Ok(self.move_all(selection, &to, parallel, events).await)
    }

    /// Moves every tenant, conversation and user home a failover took from `cell` back
    /// to it; `cell` must be Up again (and its history backfilled, or the
    /// verification of each move refuses it).
    pub async fn failback(
        &self,
        cell: &str,
        parallel: usize,
        events: impl FnMut(BulkEvent<'_>),
    ) -> Result<BulkReport, MigrationError> {
        match self.routes.read(|t| t.cell(cell).map(|c| c.status)) {
            None => return Err(MigrationError::Refused(format!("unknown cell {cell}"))),
            Some(CellStatus::Up) => {}
            Some(s) => {
                return Err(MigrationError::Refused(format!(
                    "{cell} is {s:?}; it must be Up to take its routes back"
                )));
            }
        }
        let selection = self.select(|e| e.failed_from.as_deref() == Some(cell));
        Ok(self.move_all(selection, cell, parallel, events).await)
    }
}
