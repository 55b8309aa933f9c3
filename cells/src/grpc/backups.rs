//! gRPC handlers of the Backups API: this cell's backups, taken, listed,
//! verified and deleted through [`crate::backup::Backups`].

use std::sync::Arc;

use cellmesh_proto::ids::{ConversationId, TenantId};
use cellmesh_proto::reason::Reason;
use cellmesh_proto::status::to_status;
use cellmesh_proto::v1::backups_server::Backups as BackupsService;
use cellmesh_proto::v1::*;
use tonic::{Request, Response, Status};

use super::Reply;
use crate::backup::{BackupError, Backups};
use crate::message::MessageService;

pub struct BackupsApi {
    backups: Arc<Backups>,
    service: Arc<MessageService>,
}

impl BackupsApi {
    pub fn new(backups: Arc<Backups>, service: Arc<MessageService>) -> Self {
        Self { backups, service }
    }
}

fn status(e: BackupError) -> Status {
    let e = match e {
        BackupError::Cell(e) => return Status::from(*e),
        e => e,
    };
    let (code, reason) = match &e {
        BackupError::NotFound(_) => (ErrorCode::NotFound, Reason::BackupNotFound),
        BackupError::Running => (ErrorCode::RetryLater, Reason::BackupRunning),
        _ => (ErrorCode::Internal, Reason::BackupFailed),
    };
    let retry_ms = if reason == Reason::BackupRunning {
        1000
    } else {
        0
    };
    to_status(code, reason, e.to_string(), retry_ms, None)
}

impl BackupsApi {
    /// Refuses a backup into a store outside the regions of a tenant bound
    /// to them whose data this cell may hold.
    fn resident(&self) -> Result<(), Status> {
        let config = self.service.config();
        let store_region = crate::config::store_region(&config.backup.region, &config.cell_id);
        let conflicts = self.service.ownership().residency_conflicts(store_region);
        let Some((tenant, regions)) = conflicts.first() else {
            return Ok(());
        };
        Err(to_status(
            ErrorCode::PermissionDenied,
            Reason::ResidencyViolation,
            format!(
                "tenant {tenant} may live only in {}: this cell's backups go to {store_region} \
                 (backup.region); {} tenant(s) bound so",
                regions.join(", "),
                conflicts.len()
            ),
            0,
            None,
        ))
    }
}

fn missing(what: &str) -> Status {
    to_status(
        ErrorCode::InvalidArgument,
        Reason::MissingId,
        format!("name the {what}"),
        0,
        None,
    )
}

fn list(manifests: Vec<crate::backup::Manifest>) -> ListBackupsResponse {
    ListBackupsResponse {
        backups: manifests.iter().map(|m| m.info()).collect(),
    }
}

#[tonic::async_trait]
impl BackupsService for BackupsApi {
    async fn create(&self, request: Request<CreateBackupRequest>) -> Reply<BackupInfo> {
        let keep = request.into_inner().keep as usize;
        self.resident()?;
        let (backups, service) = (self.backups.clone(), self.service.clone());
        // Runs to its end even if the caller goes away.
        let taken = tokio::spawn(async move {
            let now = service.now_ms();
            backups
                .create(service.store(), service.route_index(), keep, now)
                .await
        })
        .await
        .map_err(|e| Status::internal(format!("backup task: {e}")))?
        .map_err(status)?;
        tracing::info!(
            backup = %taken.id,
            files = taken.files.len(),
            uploaded_bytes = taken.uploaded_bytes,
            "backup stored"
        );
        Ok(Response::new(taken.info()))
    }

    async fn list(&self, _: Request<ListBackupsRequest>) -> Reply<ListBackupsResponse> {
        Ok(Response::new(list(
            self.backups.list().await.map_err(status)?,
        )))
    }

    async fn verify(&self, request: Request<BackupRequest>) -> Reply<VerifyBackupResponse> {
        let id = request.into_inner().id;
        let started = std::time::Instant::now();
        let storage = self.service.config().storage.clone();
        let (manifest, problems, bytes_read) = self
            .backups
            .verify(&id, &storage, self.service.cold().map(|c| c.as_ref()))
            .await
            .map_err(status)?;
        Ok(Response::new(VerifyBackupResponse {
            backup: Some(manifest.info()),
            problems,
            bytes_read,
            millis: started.elapsed().as_millis() as u64,
        }))
    }

    async fn export_tenant(&self, request: Request<ExportTenantRequest>) -> Reply<ExportInfo> {
        let tenant = request.into_inner().tenant_id;
        if tenant == 0 {
            return Err(missing("tenant to export"));
        }
        let (backups, service) = (self.backups.clone(), self.service.clone());
        let m = tokio::spawn(async move {
            let now = service.now_ms();
            backups
                .export_tenant(&service, cellmesh_proto::ids::TenantId(tenant), now)
                .await
        })
        .await
        .map_err(|e| Status::internal(format!("export task: {e}")))?
        .map_err(status)?;
        Ok(Response::new(ExportInfo {
            id: m.id,
            tenant_id: m.tenant,
            cell_id: m.cell,
            created_ms: m.created_ms,
            conversations: m.conversations,
            messages: m.messages,
            bytes: m.files.iter().map(|f| f.size).sum(),
            keys: m.files.into_iter().map(|f| f.key).collect(),
        }))
    }

    async fn delete(&self, request: Request<BackupRequest>) -> Reply<ListBackupsResponse> {
        let id = request.into_inner().id;
        if id.is_empty() {
            return Err(missing("backup to delete"));
        }
        self.backups.delete(&id).await.map_err(status)?;
        Ok(Response::new(list(
            self.backups.list().await.map_err(status)?,
        )))
    }

    async fn audit(&self, request: Request<AuditRequest>) -> Reply<AuditResponse> {
        let AuditRequest { tenant_id, needles } = request.into_inner();
        let bad = needles.iter().find(|n| !(6..=256).contains(&n.len()));
        if needles.is_empty() || needles.len() > 16 || bad.is_some() {
            return Err(to_status(
                ErrorCode::InvalidArgument,
                Reason::MalformedRequest,
                format!(
                    "name 1 to 16 needles of 6 to 256 bytes each, not {} (shortest {})",
                    needles.len(),
                    needles.iter().map(Vec::len).min().unwrap_or(0)
                ),
                0,
                None,
            ));
        }
        let store = self.service.store().clone();
        let rows = tokio::task::spawn_blocking(move || store.rows_containing(&needles))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| Status::from(crate::error::CellError::from(e)))?;
        let cold_segments = match (self.service.cold(), tenant_id) {
            (Some(cold), tenant @ 1..) => cold
                .list(Some(TenantId(tenant)))
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?
                .len() as u64,
            _ => 0,
        };
        Ok(Response::new(AuditResponse {
            rows: rows
                .into_iter()
                .map(|(column_family, rows)| AuditRows {
                    column_family: column_family.into(),
                    rows,
                })
                .collect(),
            cold_segments,
            cell_id: self.service.config().cell_id.clone(),
        }))
    }

    async fn restore_export(
        &self,
        request: Request<RestoreExportRequest>,
    ) -> Reply<RestoreExportResponse> {
        let r = request.into_inner();
        if r.tenant_id == 0 || r.export_id.is_empty() {
            return Err(missing("tenant and the export to restore"));
        }
        let from = TenantId(r.tenant_id);
        let into = TenantId(if r.into_tenant_id == 0 {
            r.tenant_id
        } else {
            r.into_tenant_id
        });
        let only = (r.conversation_id != 0).then_some(ConversationId(r.conversation_id));
        let (backups, service) = (self.backups.clone(), self.service.clone());
        // Runs to its end even if the caller goes away.
        let restored = tokio::spawn(async move {
            backups
                .restore_export(&service, from, &r.export_id, into, only)
                .await
        })
        .await
        .map_err(|e| Status::internal(format!("restore task: {e}")))?
        .map_err(status)?;
        tracing::info!(
            tenant = from.get(),
            into = into.get(),
            conversations = restored.len(),
            "export restored"
        );
        Ok(Response::new(RestoreExportResponse {
            cell_id: self.service.config().cell_id.clone(),
            into_tenant_id: into.get(),
            conversations: restored
                .into_iter()
                .map(|c| RestoredConversation {
                    from_conversation_id: c.from.get(),
                    to_conversation_id: c.to.get(),
                    messages: c.messages,
                })
                .collect(),
        }))
    }
}
