//! Operation records (DESIGN.md §5): what the control plane runs on an
//! operator's behalf — moves, drains, failbacks — and what cells do on
//! their own that an operator must be able to audit (deletions of history
//! past a tenant's retention). Each one is a durable record in the
//! coordination store (`cellmesh/operations/<id>`: what, its state, its
//! progress), read and written through [`OperationStore`]; the control
//! plane lists them, runs the unfinished ones it owns, and serves them.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use std::collections::BTreeMap;
use std::sync::Arc;

use cellmesh_coord::{CoordError, Coordination, OPERATIONS_PREFIX};
use cellmesh_proto::v1 as pb;
use cellmesh_route_client::table::Key;
use serde::{Deserialize, Serialize};

/// What an operation does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Spec {
    MoveConversation {
        tenant: u64,
        conversation: u64,
        to: String,
    },
    MoveUser {
        tenant: u64,
        user: u64,
        to: String,
    },
    MoveTenant {
        tenant: u64,
        to: String,
        parallel: usize,
        /// Messages and sync events copied per second at most (0: any).
        #[serde(default)]
        rate: u64,
        /// File bytes copied per second at most (0: the target's limit).
        #[serde(default)]
        file_rate: u64,
    },
    Drain {
        cell: String,
        to: Option<String>,
        parallel: usize,
    },
    Failback {
        cell: String,
        parallel: usize,
    },
    /// A backup of a cell's database into its backup store; then only the
    /// newest `keep` of its backups are kept (0: all).
    Backup {
        cell: String,
        #[serde(default)]
        keep: u32,
    },
    /// A cell deleted (or is deleting) a tenant's cold history past its
    /// `retention_days`. Recorded by the cell itself, never run by the
    /// control plane: `done`/`total` count segments, `rows` messages.
    ExpireHistory {
        tenant: u64,
        cell: String,
        retention_days: u32,
    },
}

impl Spec {
    pub fn describe(&self) -> String {
        match self {
            Spec::MoveConversation {
                tenant,
                conversation,
                to,
            } => format!("move conversation {conversation} of tenant {tenant} to {to}"),
            Spec::MoveUser { tenant, user, to } => {
                format!("move the home of user {user} of tenant {tenant} to {to}")
            }
            Spec::MoveTenant { tenant, to, .. } => format!("move tenant {tenant} to {to}"),
            Spec::Drain { cell, to, .. } => match to {
                Some(to) => format!("drain {cell} into {to}"),
                None => format!("drain {cell} into its fallback"),
            },
            Spec::Failback { cell, .. } => format!("fail back to {cell}"),
            Spec::Backup { cell, .. } => format!("back up {cell}"),
            Spec::ExpireHistory {
                tenant,
                cell,
                retention_days,
            } => format!(
                "delete history of tenant {tenant} older than {retention_days} days on {cell}"
            ),
        }
    }

    /// The route a cancel rolls back (a single move's key).
    pub fn key(&self) -> Option<Key> {
        match self {
            Spec::MoveConversation {
                tenant,
                conversation,
                ..
            } => Some(Key::conversation(
                TenantId(*tenant),
                ConversationId(*conversation),
            )),
            Spec::MoveUser { tenant, user, .. } => {
                Some(Key::user(TenantId(*tenant), UserId(*user)))
            }
            Spec::MoveTenant { tenant, .. } => Some(Key::tenant(TenantId(*tenant))),
            Spec::Drain { .. }
            | Spec::Failback { .. }
            | Spec::Backup { .. }
            | Spec::ExpireHistory { .. } => None,
        }
    }

    /// Whether a cell, not the control plane, runs it (the control plane
    /// only lists it: no runner takes it up, no cancel or pause).
    pub fn runs_in_cell(&self) -> bool {
        matches!(self, Spec::ExpireHistory { .. })
    }

    /// The cell a move goes to.
    pub fn target(&self) -> Option<&str> {
        match self {
            Spec::MoveConversation { to, .. }
            | Spec::MoveUser { to, .. }
            | Spec::MoveTenant { to, .. } => Some(to),
            Spec::Drain { .. }
            | Spec::Failback { .. }
            | Spec::Backup { .. }
            | Spec::ExpireHistory { .. } => None,
        }
    }

    fn is_tenant_move(&self) -> bool {
        matches!(self, Spec::MoveTenant { .. })
    }

    /// The cells the operation names (checked to exist before it starts).
    pub fn cells(&self) -> Vec<&str> {
        match self {
            Spec::MoveConversation { to, .. }
            | Spec::MoveUser { to, .. }
            | Spec::MoveTenant { to, .. } => vec![to],
            Spec::Drain { cell, to, .. } => std::iter::once(cell.as_str())
                .chain(to.as_deref())
                .collect(),
            Spec::Failback { cell, .. }
            | Spec::Backup { cell, .. }
            | Spec::ExpireHistory { cell, .. } => vec![cell],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Pending,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl State {
    pub fn is_final(self) -> bool {
        matches!(self, State::Succeeded | State::Failed | State::Cancelled)
    }
}

/// One operation as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation {
    pub id: String,
    pub spec: Spec,
    pub state: State,
    pub phase: String,
    pub done: u64,
    pub total: u64,
    pub message: String,
    pub created_ms: u64,
    pub updated_ms: u64,
    /// The replica that runs (or ran) it.
    pub runner: String,
    pub cancel_requested: bool,
    /// An operator holds the operation (its move waits at the next point
    /// where writes flow: before a copy round or before the freeze).
    #[serde(default)]
    pub pause_requested: bool,
    /// Rows (messages and sync events) copied so far, rows behind, and how
    /// long writes were refused (tenant moves).
    #[serde(default)]
    pub rows: u64,
    #[serde(default)]
    pub lag: u64,
    #[serde(default)]
    pub frozen_ms: u64,
    /// Bytes the target stored, and the time left at the copy's rate.
    #[serde(default)]
    pub bytes: u64,
    #[serde(default)]
    pub eta_ms: u64,
    /// Files a tenant move copied into the target's region.
    #[serde(default)]
    pub files: FileProgress,
    /// The runner has set the move's route to `Paused` (and must set it
    /// back when the pause is lifted).
    #[serde(default)]
    pub route_paused: bool,
}

impl Operation {
    /// A pending operation, created at `now_ms`.
    pub fn new(spec: Spec, now_ms: u64) -> Self {
        Self {
            id: format!("op-{now_ms}-{:04x}", rand::random::<u16>()),
            spec,
            state: State::Pending,
            phase: String::new(),
            done: 0,
            total: 0,
            message: String::new(),
            created_ms: now_ms,
            updated_ms: now_ms,
            runner: String::new(),
            cancel_requested: false,
            pause_requested: false,
            route_paused: false,
            rows: 0,
            lag: 0,
            frozen_ms: 0,
            bytes: 0,
            eta_ms: 0,
            files: FileProgress::default(),
        }
    }

    pub fn to_pb(&self) -> pb::OperationInfo {
        let state = match self.state {
            State::Pending | State::Running if self.pause_requested => pb::OperationState::Paused,
            State::Pending => pb::OperationState::Pending,
            State::Running => pb::OperationState::Running,
            State::Succeeded => pb::OperationState::Succeeded,
            State::Failed => pb::OperationState::Failed,
            State::Cancelled => pb::OperationState::Cancelled,
        };
        pb::OperationInfo {
            id: self.id.clone(),
            description: self.spec.describe(),
            state: state as i32,
            phase: self.phase.clone(),
            done: self.done,
            total: self.total,
            message: self.message.clone(),
            created_ms: self.created_ms,
            updated_ms: self.updated_ms,
            runner: self.runner.clone(),
            cancel_requested: self.cancel_requested,
            pause_requested: self.pause_requested,
            rows_copied: self.rows,
            lag: self.lag,
            frozen_ms: self.frozen_ms,
            bytes_copied: self.bytes,
            eta_ms: self.eta_ms,
            files_copied: self.files.copied,
            files_total: self.files.total,
            file_bytes_copied: self.files.bytes_copied,
            file_bytes_total: self.files.bytes_total,
        }
    }

    /// The state as shown to an operator: `paused` while a pause holds an
    /// unfinished operation.
    pub fn shown_state(&self) -> &'static str {
        match self.state {
            _ if self.pause_requested && !self.state.is_final() => "paused",
            State::Pending => "pending",
            State::Running => "running",
            State::Succeeded => "succeeded",
            State::Failed => "failed",
            State::Cancelled => "cancelled",
        }
    }

    /// Whether it can be paused: a move of one key or of a tenant (a drain
    /// or failback picks its keys as it goes; cancel it instead).
    pub fn pausable(&self) -> bool {
        self.spec.key().is_some() && !self.spec.runs_in_cell()
    }
}

/// Files a tenant move copied into the target's region, of how many.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileProgress {
    pub copied: u64,
    pub total: u64,
    pub bytes_copied: u64,
    pub bytes_total: u64,
}

/// Whether an unfinished operation among `ops` drives (or may drive) the
/// move of `key`: a move of that key or of its tenant, or any drain or
/// failback (they pick their keys as they go). The orphan resumer leaves
/// such keys to the operations runner. A cell's deletion moves nothing.
pub fn drives<'a>(ops: impl IntoIterator<Item = &'a Operation>, key: &Key) -> bool {
    ops.into_iter()
        .filter(|op| !op.state.is_final() && !op.spec.runs_in_cell())
        .any(|op| match op.spec.key() {
            Some(k) => k == *key || (k == Key::tenant(key.tenant) && op.spec.is_tenant_move()),
            None => true,
        })
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The operations in the coordination store.
#[derive(Clone)]
pub struct OperationStore {
    coordination: Arc<dyn Coordination>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Coordination(#[from] CoordError),
    #[error("operation record {0} is unreadable: {1}")]
    Corrupt(String, serde_json::Error),
}

impl OperationStore {
    pub fn new(coordination: Arc<dyn Coordination>) -> Self {
        Self { coordination }
    }

    /// Records a new, pending operation.
    pub async fn create(&self, spec: Spec) -> Result<Operation, StoreError> {
        let op = Operation::new(spec, now_ms());
        let value = serde_json::to_string(&op).expect("operations serialize");
        let key = format!("{OPERATIONS_PREFIX}{}", op.id);
        if !self
            .coordination
            .compare_and_put(&key, None, &value)
            .await?
        {
            return Err(StoreError::Coordination(CoordError::Store(format!(
                "operation id {} is taken",
                op.id
            ))));
        }
        Ok(op)
    }

    /// Applies `change` to the stored operation `id` and writes it back
    /// only if no other writer changed the record meanwhile (otherwise it
    /// reads it again and applies `change` again): an operator's cancel or
    /// pause and the runner's progress never undo each other. The record as
    /// written, or `None` without such an operation.
    pub async fn update(
        &self,
        id: &str,
        mut change: impl FnMut(&mut Operation),
    ) -> Result<Option<Operation>, StoreError> {
        let key = format!("{OPERATIONS_PREFIX}{id}");
        loop {
            let Some(read) = self.coordination.records(&key).await?.remove(&key) else {
                return Ok(None);
            };
            let mut op: Operation =
                serde_json::from_str(&read).map_err(|e| StoreError::Corrupt(key.clone(), e))?;
            change(&mut op);
            let value = serde_json::to_string(&op).expect("operations serialize");
            if value == read
                || self
                    .coordination
                    .compare_and_put(&key, Some(&read), &value)
                    .await?
            {
                return Ok(Some(op));
            }
        }
    }

    /// One operation, read by its own key (not the whole list).
    pub async fn get(&self, id: &str) -> Result<Option<Operation>, StoreError> {
        let key = format!("{OPERATIONS_PREFIX}{id}");
        match self.coordination.records(&key).await?.remove(&key) {
            None => Ok(None),
            Some(value) => serde_json::from_str(&value)
                .map(Some)
                .map_err(|e| StoreError::Corrupt(key, e)),
        }
    }

    /// Every operation by id (ids sort by creation time).
    pub async fn list(&self) -> Result<BTreeMap<String, Operation>, StoreError> {
        let mut out = BTreeMap::new();
        for (key, value) in self.coordination.records(OPERATIONS_PREFIX).await? {
            let op: Operation =
                serde_json::from_str(&value).map_err(|e| StoreError::Corrupt(key.clone(), e))?;
            out.insert(op.id.clone(), op);
        }
        Ok(out)
    }
}

/// The finished operations last changed `retain_ms` or longer before
/// `now_ms`, but for each cell's newest backup (the backup schedule counts
/// from it).
pub fn expired(ops: &BTreeMap<String, Operation>, now_ms: u64, retain_ms: u64) -> Vec<&Operation> {
    let mut newest_backup: BTreeMap<&str, &str> = BTreeMap::new();
    for op in ops.values() {
        if let Spec::Backup { cell, .. } = &op.spec {
            // Ids sort by creation time: the last one seen is the newest.
            newest_backup.insert(cell, &op.id);
        }
    }
    ops.values()
        .filter(|op| op.state.is_final() && op.updated_ms.saturating_add(retain_ms) <= now_ms)
        .filter(|op| !newest_backup.values().any(|id| *id == op.id))
        .collect()
}

impl OperationStore {
    /// Deletes the operations [`expired`] names; one that changed since it
    /// was read stays. How many went.
    pub async fn prune(&self, now_ms: u64, retain_ms: u64) -> Result<usize, StoreError> {
        let records = self.coordination.records(OPERATIONS_PREFIX).await?;
        let mut ops = BTreeMap::new();
        for (key, value) in &records {
            let op: Operation =
                serde_json::from_str(value).map_err(|e| StoreError::Corrupt(key.clone(), e))?;
            ops.insert(op.id.clone(), op);
        }
        let mut deleted = 0;
        for op in expired(&ops, now_ms, retain_ms) {
            let key = format!("{OPERATIONS_PREFIX}{}", op.id);
            let Some(read) = records.get(&key) else {
                continue;
            };
            if self.coordination.compare_and_delete(&key, read).await? {
                deleted += 1;
            }
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellmesh_coord::embedded::EmbeddedCoordination;

    #[tokio::test]
    async fn finished_operations_past_their_retention_are_pruned_but_each_cells_newest_backup() {
        let store = OperationStore::new(Arc::new(EmbeddedCoordination::default()));
        let backup = |cell: &str| Spec::Backup {
            cell: cell.into(),
            keep: 0,
        };
        let mut ids = Vec::new();
        for (spec, state, updated_ms) in [
            (backup("eu/c1"), State::Succeeded, 1_000),
            (backup("eu/c1"), State::Succeeded, 2_000),
            (backup("eu/c2"), State::Failed, 1_000),
            (
                Spec::Failback {
                    cell: "eu/c1".into(),
                    parallel: 1,
                },
                State::Cancelled,
                1_000,
            ),
            (
                Spec::Failback {
                    cell: "eu/c2".into(),
                    parallel: 1,
                },
                State::Running,
                1_000,
            ),
            (
                Spec::Failback {
                    cell: "eu/c3".into(),
                    parallel: 1,
                },
                State::Succeeded,
                9_500,
            ),
        ] {
            let op = store.create(spec).await.unwrap();
            store
                .update(&op.id, |op| (op.state, op.updated_ms) = (state, updated_ms))
                .await
                .unwrap();
            ids.push(op.id);
            // Ids carry the creation millisecond: keep them in order.
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        assert_eq!(store.prune(10_000, 1_000).await.unwrap(), 2);
        let left: Vec<String> = store.list().await.unwrap().into_keys().collect();
        // The older eu/c1 backup and the cancelled failback went; the newest
        // backup of each cell, the running failback and the recent one stay.
        assert_eq!(
            left,
            [&ids[1], &ids[2], &ids[4], &ids[5]].map(|s| s.to_string())
        );
        assert_eq!(store.prune(10_000, 1_000).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn operations_round_trip_through_the_store() {
        let store = OperationStore::new(Arc::new(EmbeddedCoordination::default()));
        let spec = Spec::MoveTenant {
            tenant: 7,
            to: "eu-west/c2".into(),
            parallel: 4,
            rate: 0,
            file_rate: 0,
        };
        let op = store.create(spec.clone()).await.unwrap();
        assert_eq!(op.state, State::Pending);
        let op = store
            .update(&op.id, |op| {
                op.state = State::Running;
                op.done = 3;
            })
            .await
            .unwrap()
            .unwrap();
        let back = store.get(&op.id).await.unwrap().unwrap();
        assert_eq!(back, op);
        assert_eq!((back.state, back.done), (State::Running, 3));
        assert!(store.update("op-none", |_| {}).await.unwrap().is_none());
        assert_eq!(back.spec.key(), Some(Key::tenant(TenantId(7))));
        assert_eq!(back.to_pb().description, "move tenant 7 to eu-west/c2");
        assert!(store.get("op-none").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn unfinished_operations_drive_their_keys_and_their_tenants_keys() {
        let store = OperationStore::new(Arc::new(EmbeddedCoordination::default()));
        let tenant = store
            .create(Spec::MoveTenant {
                tenant: 7,
                to: "eu-west/c2".into(),
                parallel: 4,
                rate: 0,
                file_rate: 0,
            })
            .await
            .unwrap();
        let mut conversation = store
            .create(Spec::MoveConversation {
                tenant: 8,
                conversation: 3,
                to: "eu-west/c2".into(),
            })
            .await
            .unwrap();
        let ops = [tenant, conversation.clone()];
        assert!(drives(&ops, &Key::tenant(TenantId(7))));
        assert!(
            drives(&ops, &Key::conversation(TenantId(7), ConversationId(99))),
            "a tenant move's conversation"
        );
        assert!(drives(
            &ops,
            &Key::conversation(TenantId(8), ConversationId(3))
        ));
        assert!(
            !drives(&ops, &Key::conversation(TenantId(8), ConversationId(4))),
            "another conversation of tenant 8"
        );
        conversation.state = State::Failed;
        assert!(
            !drives(
                [&conversation],
                &Key::conversation(TenantId(8), ConversationId(3))
            ),
            "finished"
        );
        let drain = store
            .create(Spec::Drain {
                cell: "eu-west/c1".into(),
                to: None,
                parallel: 1,
            })
            .await
            .unwrap();
        assert!(
            drives([&drain], &Key::user(TenantId(1), UserId(2))),
            "a drain may move anything"
        );
        let expiring = store
            .create(Spec::ExpireHistory {
                tenant: 1,
                cell: "eu-west/c1".into(),
                retention_days: 30,
            })
            .await
            .unwrap();
        assert!(
            !drives([&expiring], &Key::user(TenantId(1), UserId(2))),
            "a cell's deletion moves nothing"
        );
        assert!(!expiring.pausable());
    }
}
