//! gRPC handler of the cell-to-cell API.

use cellmesh_proto::v1::cell_peer_server::CellPeer;
use cellmesh_proto::v1::{DeliverBatchRequest, DeliverBatchResponse};
use tonic::{Request, Response, Status};

use crate::pipeline::PeerInbound;

pub struct PeerApi {
    inbound: PeerInbound,
}

impl PeerApi {
    pub fn new(inbound: PeerInbound) -> Self {
        Self { inbound }
    }
}

#[tonic::async_trait]
impl CellPeer for PeerApi {
    async fn deliver_batch(
        &self,
        request: Request<DeliverBatchRequest>,
    ) -> Result<Response<DeliverBatchResponse>, Status> {
        let r = request.into_inner();
        tracing::debug!(source = %r.source_cell, events = r.events.len(), "deliver batch");
        let applied =
            self.inbound
                .deliver(r.events)
                .await
                .map_err(|e| crate::CellError::RetryLater {
                    reason: "PIPELINE_UNAVAILABLE",
                    message: e.to_string(),
                    retry_after: std::time::Duration::from_millis(200),
                })?;
        Ok(Response::new(DeliverBatchResponse { applied }))
    }
}
