//! What retention deleted, where an operator can audit it: each tierer
//! pass that deletes segments of a tenant is one operation
//! (`ExpireHistory`) in the deployment's coordination store, listed with
//! the control plane's moves (`cellmesh ops list`). The record is opened
//! (running, with the plan) before the first deletion and closed with
//! what was deleted; when the store cannot take it, nothing is deleted
//! that pass. A record a crash left open is closed as interrupted when
//! the cell starts again. A cell without a coordination store
//! (standalone) logs its deletions only.

use cellmesh_proto::ids::TenantId;
use std::sync::Arc;

use cellmesh_coord::Coordination;
use cellmesh_operations::{OperationStore, Spec, State, StoreError, now_ms};

/// One pass's deletions of one tenant.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub segments: u64,
    pub messages: u64,
    pub conversations: u64,
    /// The newest message deleted (ms since the epoch).
    pub newest_ms: u64,
}

pub struct Journal {
    store: Option<OperationStore>,
    cell: String,
}

/// An open record (`None`: nothing records).
pub struct Record(Option<String>);

impl Journal {
    pub fn new(coordination: Option<Arc<dyn Coordination>>, cell: &str) -> Self {
        Self {
            store: coordination.map(OperationStore::new),
            cell: cell.to_string(),
        }
    }

    /// Opens the record of deleting `plan` of `tenant`; an error when the
    /// coordination store cannot take it (delete nothing then).
    pub async fn open(
        &self,
        tenant: TenantId,
        retention_days: u32,
        plan: Plan,
    ) -> Result<Record, StoreError> {
        let Some(store) = &self.store else {
            return Ok(Record(None));
        };
        let spec = Spec::ExpireHistory {
            tenant: tenant.get(),
            cell: self.cell.clone(),
            retention_days,
        };
        let op = store.create(spec).await?;
        let newest = humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(plan.newest_ms),
        );
        store
            .update(&op.id, |op| {
                op.state = State::Running;
                op.runner = self.cell.clone();
                op.phase = "deleting".into();
                op.total = plan.segments;
                op.message = format!(
                    "{} segments, {} messages of {} conversations, the newest sent {newest}",
                    plan.segments, plan.messages, plan.conversations
                );
                op.updated_ms = now_ms();
            })
            .await?;
        Ok(Record(Some(op.id)))
    }

    /// Closes `record`: `segments` segments (`messages` messages) deleted,
    /// and how the pass ended. A failure to write it is logged.
    pub async fn close(
        &self,
        record: Record,
        segments: u64,
        messages: u64,
        outcome: Result<(), &crate::error::CellError>,
    ) {
        let (Some(store), Some(id)) = (&self.store, record.0) else {
            return;
        };
        let written = store
            .update(&id, |op| {
                op.done = segments;
                op.rows = messages;
                op.phase.clear();
                op.updated_ms = now_ms();
                match &outcome {
                    Ok(()) => {
                        op.state = State::Succeeded;
                        op.message = format!("deleted {segments} segments, {messages} messages");
                    }
                    Err(e) => {
                        op.state = State::Failed;
                        op.message = format!(
                            "deleted {segments} segments, {messages} messages, then: {e}; the next pass deletes the rest"
                        );
                    }
                }
            })
            .await;
        if let Err(e) = written {
            tracing::warn!(operation = %id, error = %e, "cannot close a retention record");
        }
    }

    /// Closes this cell's records a crash left open.
    pub async fn close_interrupted(&self) {
        let Some(store) = &self.store else { return };
        let ops = match store.list().await {
            Ok(ops) => ops,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read retention records");
                return;
            }
        };
        for op in ops.into_values().filter(|op| {
            !op.state.is_final()
                && matches!(&op.spec, Spec::ExpireHistory { cell, .. } if *cell == self.cell)
        }) {
            let closed = store
                .update(&op.id, |op| {
                    if !op.state.is_final() {
                        op.state = State::Failed;
                        op.phase.clear();
                        op.message = format!(
                            "{}; interrupted by a restart of the cell (the next pass deletes the rest)",
                            op.message
                        );
                        op.updated_ms = now_ms();
                    }
                })
                .await;
            if let Err(e) = closed {
                tracing::warn!(operation = %op.id, error = %e, "cannot close a retention record");
            }
        }
    }
}
