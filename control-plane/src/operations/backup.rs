//! The backup operation: the cell takes the backup itself (it holds the
//! database) through its `Backups` API; the control plane asks for it, on
//! an operator's request or on the schedule of `[backups]`, and records
//! the outcome like any other operation.

use std::time::Duration;

use cellmesh_proto::v1::CreateBackupRequest;

use crate::migration::Migrator;

/// A backup may take this long (a large cell at its throttled rate).
const BACKUP_TIMEOUT: Duration = Duration::from_secs(6 * 3600);

/// Has `cell` take a backup, keeping its newest `keep`; a summary.
pub async fn take(migrator: &Migrator, cell: &str, keep: u32) -> Result<String, String> {
    let address = migrator
        .routes()
        .read(|t| t.cell(cell).map(|c| c.address.clone()))
        .ok_or_else(|| format!("cell {cell} is not registered"))?;
    let mut client = migrator
        .peers()
        .backups(&address)
        .map_err(|e| e.to_string())?;
    let mut request = tonic::Request::new(CreateBackupRequest { keep });
    request.set_timeout(BACKUP_TIMEOUT);
    migrator.secret().attach(&mut request);
    let info = client
        .create(request)
        .await
        .map_err(|e| format!("{cell}: {}", cellmesh_proto::status::describe(&e)))?
        .into_inner();
    Ok(format!(
        "backup {} of {}: {} files, {} bytes ({} files, {} bytes uploaded), {} conversations, {} users",
        info.id,
        info.cell_id,
        info.files,
        info.bytes,
        info.uploaded_files,
        info.uploaded_bytes,
        info.conversations,
        info.users
    ))
}

/// `[backups]`: a backup of every live cell on a schedule.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackupSchedule {
    /// A cell whose latest backup operation is older than this gets a new
    /// one (0: no schedule; backups only on request).
    pub interval_secs: u64,
    /// Backups kept per cell (0: all).
    pub keep: u32,
}

impl Default for BackupSchedule {
    fn default() -> Self {
        Self {
            interval_secs: 0,
            keep: 7,
        }
    }
}

/// While leading: starts a backup operation of each cell that is up and
/// due, one at a time per cell.
pub async fn schedule(
    schedule: BackupSchedule,
    routes: cellmesh_route_client::client::RouteClient,
    operations: cellmesh_operations::OperationStore,
) {
    if schedule.interval_secs == 0 {
        return std::future::pending().await;
    }
    let interval_ms = schedule.interval_secs * 1000;
    let tick = Duration::from_millis(interval_ms.clamp(200, 60_000) / 2);
    loop {
        match operations.list().await {
            Ok(ops) => {
                let cells: Vec<String> = routes.read(|t| {
                    t.cells
                        .values()
                        .filter(|c| c.status == cellmesh_route_client::table::CellStatus::Up)
                        .map(|c| c.id.clone())
                        .collect()
                });
                let now = cellmesh_operations::now_ms();
                if super::api::backups_enabled(&routes).is_err() {
                    tokio::time::sleep(tick).await;
                    continue;
                }
                for cell in due(&cells, ops.values(), now, interval_ms) {
                    let spec = cellmesh_operations::Spec::Backup {
                        cell: cell.clone(),
                        keep: schedule.keep,
                    };
                    match operations.create(spec).await {
                        Ok(op) => tracing::info!(%cell, id = %op.id, "scheduled backup"),
                        Err(e) => tracing::warn!(%cell, error = %e, "cannot schedule a backup"),
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "backup schedule: cannot list operations"),
        }
        tokio::time::sleep(tick).await;
    }
}

/// The cells without a backup operation running or started in the last
/// `interval_ms`.
fn due<'a>(
    cells: &[String],
    ops: impl Iterator<Item = &'a cellmesh_operations::Operation> + Clone,
    now_ms: u64,
    interval_ms: u64,
) -> Vec<String> {
    cells
        .iter()
        .filter(|cell| {
            !ops.clone().any(|op| {
                matches!(&op.spec, cellmesh_operations::Spec::Backup { cell: c, .. } if c == *cell)
                    && (!op.state.is_final() || op.created_ms + interval_ms > now_ms)
            })
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellmesh_operations::{Operation, Spec, State};

    fn op(cell: &str, state: State, created_ms: u64) -> Operation {
        let mut op = Operation::new(
            Spec::Backup {
                cell: cell.into(),
                keep: 0,
            },
            created_ms,
        );
        op.state = state;
        op
    }

    #[test]
    fn a_cell_is_due_when_its_last_backup_is_older_than_the_interval_and_none_runs() {
        let cells = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        let ops = [
            op("a", State::Succeeded, 1_000),
            op("b", State::Running, 0),
            op("c", State::Succeeded, 9_500),
        ];
        assert_eq!(
            due(&cells, ops.iter(), 10_000, 5_000),
            vec!["a".to_string()]
        );
        assert!(due(&cells, ops.iter(), 5_000, 5_000).is_empty());
        let none: [Operation; 0] = [];
        assert_eq!(due(&cells, none.iter(), 0, 5_000), cells);
    }
}
