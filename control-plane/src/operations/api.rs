//! The `cellmesh.v1.Operations` gRPC service, on every control-plane
//! replica: starting an operation records it (the active replica runs it),
//! reads and watches come from the records, and a cancel, pause or resume
//! is recorded for the runner to carry out. Failover holds (planned
//! restarts, [`crate::failover::holds`]) are recorded and listed here too.

use cellmesh_proto::reason::Reason;
use std::pin::Pin;
use std::time::Duration;

use cellmesh_proto::status::to_status;
use cellmesh_proto::v1::operations_server::Operations;
use cellmesh_proto::v1::start_operation_request::Spec as PbSpec;
use cellmesh_proto::v1::{self as pb, ErrorCode};
use cellmesh_route_client::client::RouteClient;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::{Operation, OperationStore, Spec, StoreError};
use crate::failover::holds::{Hold, Holds, MAX_HOLD};

/// How often a watch reads the record.
const WATCH_POLL: Duration = Duration::from_millis(250);

pub struct OperationsApi {
    store: OperationStore,
    holds: Holds,
    routes: RouteClient,
}

impl OperationsApi {
    pub fn new(store: OperationStore, holds: Holds, routes: RouteClient) -> Self {
        Self {
            store,
            holds,
            routes,
        }
    }

    /// Every live hold.
    async fn holds(&self) -> Result<pb::FailoverHolds, Status> {
        let live = self
            .holds
            .live(super::now_ms())
            .await
            .map_err(|e| unavailable(StoreError::Coordination(e)))?;
        Ok(pb::FailoverHolds {
            holds: live.values().map(Hold::to_pb).collect(),
        })
    }

    async fn find(&self, id: &str) -> Result<Operation, Status> {
        self.store
            .get(id)
            .await
            .map_err(unavailable)?
            .ok_or_else(|| {
                to_status(
                    ErrorCode::NotFound,
                    Reason::OperationNotFound,
                    format!("no operation {id:?}"),
                    0,
                    None,
                )
            })
    }
}

impl OperationsApi {
    /// Records an operator's request (`ask`) on an unfinished operation; a
    /// finished one is answered as it is. What a cell runs takes no requests.
    async fn request(&self, id: &str, ask: impl Fn(&mut Operation)) -> Result<Operation, Status> {
        let found = self.find(id).await?;
        if found.spec.runs_in_cell() {
            return Err(to_status(
                ErrorCode::InvalidArgument,
                Reason::RunsInCell,
                format!(
                    "{} is the cell's own record; it cannot be cancelled, paused or resumed",
                    found.spec.describe()
                ),
                0,
                None,
            ));
        }
        let op = self
            .store
            .update(id, |op| {
                if !op.state.is_final() {
                    ask(op);
                    op.updated_ms = super::now_ms();
                }
            })
            .await
            .map_err(unavailable)?;
        match op {
            Some(op) => Ok(op),
            None => self.find(id).await,
        }
    }
}

fn unavailable(e: StoreError) -> Status {
    to_status(
        ErrorCode::RetryLater,
        Reason::CoordinationUnavailable,
        e.to_string(),
        500,
        None,
    )
}

fn invalid(reason: Reason, message: String) -> Status {
    to_status(ErrorCode::InvalidArgument, reason, message, 0, None)
}

/// Refuses a backup operation until every process can read its record.
pub fn backups_enabled(routes: &RouteClient) -> Result<(), Status> {
    let gate = cellmesh_proto::version::BACKUP_OPERATIONS;
    let cluster = routes.read(|t| t.cluster_version.clone());
    if cellmesh_proto::version::enabled(&cluster, gate) {
        return Ok(());
    }
    Err(to_status(
        ErrorCode::InvalidArgument,
        Reason::VersionBehind,
        format!(
            "backup operations wait for cluster version {gate} (now {cluster:?}): `ctl upgrade finalize` once every process runs it"
        ),
        0,
        None,
    ))
}

/// The spec of a start request, checked field by field.
fn spec_from_pb(spec: Option<PbSpec>) -> Result<Spec, Status> {
    let parallel = |p: u32| if p == 0 { 8 } else { p as usize };
    let spec = match spec {
        None => return Err(invalid(Reason::MissingSpec, "say what to do".into())),
        Some(PbSpec::MoveConversation(m)) => Spec::MoveConversation {
            tenant: m.tenant_id,
            conversation: m.conversation_id,
            to: m.to_cell,
        },
        Some(PbSpec::MoveUser(m)) => Spec::MoveUser {
            tenant: m.tenant_id,
            user: m.user_id,
            to: m.to_cell,
        },
        Some(PbSpec::MoveTenant(m)) => Spec::MoveTenant {
            tenant: m.tenant_id,
            to: m.to_cell,
            parallel: parallel(m.parallel),
            rate: m.rate,
            file_rate: m.file_rate,
        },
        Some(PbSpec::Drain(d)) => Spec::Drain {
            cell: d.cell_id,
            to: (!d.to_cell.is_empty()).then_some(d.to_cell),
            parallel: parallel(d.parallel),
        },
        Some(PbSpec::Failback(f)) => Spec::Failback {
            cell: f.cell_id,
            parallel: parallel(f.parallel),
        },
        Some(PbSpec::Backup(b)) => Spec::Backup {
            cell: b.cell_id,
            keep: b.keep,
        },
    };
    let ids_set = match &spec {
        Spec::MoveConversation {
            tenant,
            conversation,
            ..
        } => *tenant > 0 && *conversation > 0,
        Spec::MoveUser { tenant, user, .. } => *tenant > 0 && *user > 0,
        Spec::MoveTenant { tenant, .. } => *tenant > 0,
        Spec::Drain { .. } | Spec::Failback { .. } | Spec::Backup { .. } => true,
        Spec::ExpireHistory { .. } => false,
    };
    if !ids_set {
        return Err(invalid(
            Reason::MissingId,
            "tenant and conversation or user ids are required".into(),
        ));
    }
    Ok(spec)
}

type InfoStream = Pin<Box<dyn Stream<Item = Result<pb::OperationInfo, Status>> + Send>>;

#[tonic::async_trait]
impl Operations for OperationsApi {
    async fn start(
        &self,
        request: Request<pb::StartOperationRequest>,
    ) -> Result<Response<pb::OperationInfo>, Status> {
        let spec = spec_from_pb(request.into_inner().spec)?;
        if matches!(spec, Spec::Backup { .. }) {
            backups_enabled(&self.routes)?;
        }
        for cell in spec.cells() {
            if self.routes.read(|t| t.cell(cell).is_none()) {
                return Err(invalid(
                    Reason::UnknownCell,
                    format!("no cell {cell:?} is registered"),
                ));
            }
        }
        let op = self.store.create(spec).await.map_err(unavailable)?;
        tracing::info!(id = %op.id, what = %op.spec.describe(), "operation recorded");
        Ok(Response::new(op.to_pb()))
    }

    async fn get(
        &self,
        request: Request<pb::OperationRequest>,
    ) -> Result<Response<pb::OperationInfo>, Status> {
        Ok(Response::new(
            self.find(&request.into_inner().id).await?.to_pb(),
        ))
    }

    async fn list(
        &self,
        _request: Request<pb::ListOperationsRequest>,
    ) -> Result<Response<pb::ListOperationsResponse>, Status> {
        let ops = self.store.list().await.map_err(unavailable)?;
        Ok(Response::new(pb::ListOperationsResponse {
            operations: ops.values().map(Operation::to_pb).collect(),
        }))
    }

    async fn cancel(
        &self,
        request: Request<pb::OperationRequest>,
    ) -> Result<Response<pb::OperationInfo>, Status> {
        let id = request.into_inner().id;
        let op = self.request(&id, |op| op.cancel_requested = true).await?;
        Ok(Response::new(op.to_pb()))
    }

    async fn pause(
        &self,
        request: Request<pb::OperationRequest>,
    ) -> Result<Response<pb::OperationInfo>, Status> {
        let id = request.into_inner().id;
        let op = self.find(&id).await?;
        if !op.pausable() && !op.spec.runs_in_cell() {
            return Err(to_status(
                ErrorCode::InvalidArgument,
                Reason::NotPausable,
                format!(
                    "{} picks its moves as it goes and cannot be held; cancel it (what moved stays moved) and start it again",
                    op.spec.describe()
                ),
                0,
                None,
            ));
        }
        let op = self.request(&id, |op| op.pause_requested = true).await?;
        Ok(Response::new(op.to_pb()))
    }

    async fn resume(
        &self,
        request: Request<pb::OperationRequest>,
    ) -> Result<Response<pb::OperationInfo>, Status> {
        let id = request.into_inner().id;
        let op = self.request(&id, |op| op.pause_requested = false).await?;
        Ok(Response::new(op.to_pb()))
    }

    async fn hold_failover(
        &self,
        request: Request<pb::HoldFailoverRequest>,
    ) -> Result<Response<pb::FailoverHolds>, Status> {
        let r = request.into_inner();
        if self.routes.read(|t| t.cell(&r.cell_id).is_none()) {
            return Err(invalid(
                Reason::UnknownCell,
                format!("no cell {:?} is registered", r.cell_id),
            ));
        }
        let length = Duration::from_secs(r.seconds.into());
        if length > MAX_HOLD {
            return Err(invalid(
                Reason::HoldTooLong,
                format!(
                    "a failover hold lasts {} s at most (asked: {} s); a restart that takes longer is failed over",
                    MAX_HOLD.as_secs(),
                    r.seconds
                ),
            ));
        }
        self.holds
            .set(&r.cell_id, length, &r.reason, super::now_ms())
            .await
            .map_err(|e| unavailable(StoreError::Coordination(e)))?;
        if length.is_zero() {
            tracing::info!(cell = %r.cell_id, "failover hold released");
        } else {
            tracing::info!(cell = %r.cell_id, seconds = r.seconds, reason = %r.reason, "failover held");
        }
        Ok(Response::new(self.holds().await?))
    }

    async fn list_failover_holds(
        &self,
        _request: Request<pb::ListFailoverHoldsRequest>,
    ) -> Result<Response<pb::FailoverHolds>, Status> {
        Ok(Response::new(self.holds().await?))
    }

    type WatchStream = InfoStream;

    async fn watch(
        &self,
        request: Request<pb::OperationRequest>,
    ) -> Result<Response<InfoStream>, Status> {
        let id = request.into_inner().id;
        let first = self.find(&id).await?;
        let store = self.store.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            let mut last = first;
            if tx.send(Ok(last.to_pb())).await.is_err() {
                return;
            }
            while !last.state.is_final() {
                tokio::time::sleep(WATCH_POLL).await;
                let now = match store.get(&id).await {
                    Ok(Some(op)) => op,
                    Ok(None) => return,
                    Err(e) => {
                        let _ = tx.send(Err(unavailable(e))).await;
                        return;
                    }
                };
                if now != last {
                    if tx.send(Ok(now.to_pb())).await.is_err() {
                        return;
                    }
                    last = now;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}
