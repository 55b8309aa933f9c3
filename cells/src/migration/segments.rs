//! Cold segments between cells whose tiers are different buckets: before a
//! copied chunk is stored, the target fetches from the source the segments
//! its manifest names that its own tier lacks (checked against their
//! checksums), so the handed-over manifest only names objects it can read.

use cellmesh_proto::ids::{ConversationId, TenantId};
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::storage::v1::SegmentEntry;
use cellmesh_proto::v1::FetchSegmentRequest;
use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
use cellmesh_telemetry::trace::grpc::Channel;
use std::time::Duration;

use cellmesh_proto::reason::Reason;
use tonic::Request;

use crate::error::CellError;
use crate::message::MessageService;

/// Copies the segments of `segments` this cell's tier lacks from `source`.
pub(crate) async fn fetch_missing(
    service: &MessageService,
    secret: &ClusterSecret,
    source: &mut CellPeerClient<Channel>,
    tenant: TenantId,
    conversation: ConversationId,
    segments: &[SegmentEntry],
) -> Result<(), CellError> {
    for entry in service.segments_to_fetch(segments).await? {
        let mut request = Request::new(FetchSegmentRequest {
            tenant_id: tenant.get(),
            conversation_id: conversation.get(),
            key: entry.key.clone(),
        });
        secret.attach(&mut request);
        let data = source
            .fetch_segment(request)
            .await
            .map_err(|status| CellError::RetryLater {
                reason: Reason::SourceUnreachable,
                message: format!(
                    "segment {} from the source: {}",
                    entry.key,
                    status.message()
                ),
                retry_after: Duration::from_millis(500),
            })?
            .into_inner()
            .data;
        service
            .store_segment_copy(conversation, &entry, data)
            .await?;
    }
    Ok(())
}
