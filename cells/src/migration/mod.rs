//! The cell's half of moves (DESIGN.md §5), whoever drives them (a
//! conversation or home move, a tenant move, a failover's backfill): on the
//! source, exports and the tenant's seal with its marks; on the target, the
//! copy loops that pull from the source and store what arrives, and the
//! cold segments a copy needs. The gRPC handlers in `grpc/peer.rs` only
//! unwrap their requests into these.

mod copy;
mod export;
mod homes;
mod seal;
pub(crate) mod segments;

use std::sync::Arc;
use std::time::Duration;

use cellmesh_proto::reason::Reason;
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
use cellmesh_telemetry::trace::grpc::Channel;

use crate::error::CellError;
use crate::message::MessageService;
use crate::pipeline::{PeerInbound, UserImport};
use crate::sync::SyncService;

/// Messages per export chunk unless the caller asks otherwise.
pub(crate) const DEFAULT_CHUNK: u32 = 10_000;
/// How long after a tenant's seal its keys are marked for cleanup one by
/// one (the move's switch comes first).
const EXPAND_SEALED_AFTER: Duration = Duration::from_secs(5);

/// The cell's half of moves, over its message and sync services.
pub struct Mover {
    inbound: PeerInbound,
    service: Arc<MessageService>,
    sync: Arc<SyncService>,
    secret: ClusterSecret,
}

impl Mover {
    pub fn new(
        inbound: PeerInbound,
        service: Arc<MessageService>,
        sync: Arc<SyncService>,
        secret: ClusterSecret,
    ) -> Self {
        Self {
            inbound,
            service,
            sync,
            secret,
        }
    }

    /// The source cell of a copy, at `address` (a registered cell's).
    async fn source(&self, address: &str) -> Result<CellPeerClient<Channel>, CellError> {
        // Never an address the caller makes up: it would have this cell
        // dial anywhere with the deployment's credentials.
        if !self.service.confirm_cell_address(address).await? {
            return Err(CellError::invalid(
                Reason::BadSourceAddress,
                format!("{address:?} is not the address of a cell in the route table"),
            ));
        }
        // Through this cell's links, like every other call to a cell.
        (self.service.peers().cell(address))
            .map_err(|e| CellError::invalid(Reason::BadSourceAddress, e.to_string()))
    }

    /// The fail point for an owner that cannot take a backfill copy now.
    fn refused_backfill(&self, r: &cellmesh_proto::v1::CopyRequest) -> Result<(), CellError> {
        let points = self.service.store().failpoints();
        if r.backfill && points.hit("backfill.copy") == Some(crate::failpoints::Action::Error) {
            return Err(CellError::RetryLater {
                reason: Reason::AwaitingBackfill,
                message: "fail point backfill.copy".into(),
                retry_after: Duration::from_millis(100),
            });
        }
        Ok(())
    }

    /// After a migration chunk is stored: the drills' fail point for a
    /// target that crashes before it answers.
    fn stored_chunk(&self) {
        self.service
            .store()
            .failpoints()
            .abort_at("migration.copy_stored");
    }

    /// Stores copied parts of moving homes (distinct users) from cell
    /// `source`, in one commit.
    async fn import_users(&self, source: &str, imports: Vec<UserImport>) -> Result<(), CellError> {
        if source.is_empty() {
            return Err(CellError::invalid(
                Reason::NoSourceCell,
                "source_cell is required",
            ));
        }
        self.inbound
            .import_users(imports)
            .await
            .map_err(pipeline_unavailable)
    }
}

pub(crate) fn pipeline_unavailable(e: crate::pipeline::PipelineError) -> CellError {
    CellError::RetryLater {
        reason: Reason::PipelineUnavailable,
        message: e.to_string(),
        retry_after: Duration::from_millis(200),
    }
}
