//! gRPC handlers of the cell-to-cell API: fan-out deliveries, standby
//! replication, failover marks, and the move calls, which unwrap their
//! requests into the cell's [`Mover`] (`crate::migration`).

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::reason::Reason;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::cell_peer_server::CellPeer;
use cellmesh_proto::v1::*;
use tonic::{Request, Response, Status, Streaming};

use super::deliver;

use crate::error::{CellError, blocking};
use crate::message::MessageService;
use crate::migration::{DEFAULT_CHUNK, Mover};
use crate::pipeline::PeerInbound;
use crate::sync::SyncService;
use crate::user::UserKey;

pub struct PeerApi {
    inbound: PeerInbound,
    service: Arc<MessageService>,
    sync: Arc<SyncService>,
    /// The cell's half of moves, which most of these calls are.
    mover: Mover,
    /// Where this cell's `/metrics` answers ("" when off), for the console.
    metrics_address: String,
    /// Turns true when the cell begins to shut down.
    closing: tokio::sync::watch::Receiver<bool>,
}

impl PeerApi {
    pub fn new(
        inbound: PeerInbound,
        service: Arc<MessageService>,
        sync: Arc<SyncService>,
        secret: ClusterSecret,
    ) -> Self {
        Self {
            mover: Mover::new(inbound.clone(), service.clone(), sync.clone(), secret),
            inbound,
            service,
            sync,
            metrics_address: String::new(),
            closing: tokio::sync::watch::channel(false).1,
        }
    }

    /// Ends delivery streams once `closing` turns true.
    pub fn with_closing(mut self, closing: tokio::sync::watch::Receiver<bool>) -> Self {
        self.closing = closing;
        self
    }

    /// Reports `address` as where this cell's metrics are scraped.
    pub fn with_metrics_address(mut self, address: String) -> Self {
        self.metrics_address = address;
        self
    }
}

#[tonic::async_trait]
impl CellPeer for PeerApi {
    async fn deliver_batch(
        &self,
        request: Request<DeliverBatchRequest>,
    ) -> Result<Response<DeliverBatchResponse>, Status> {
        let peer = cellmesh_proto::tls::caller(&request).cloned();
        let r = request.into_inner();
        let mut refused = HashSet::new();
        let answer = deliver::deliver(&self.inbound, &self.service, peer.as_ref(), r, &mut refused);
        Ok(Response::new(answer.await?))
    }

    type DeliverStreamStream = deliver::AnswerStream;

    async fn deliver_stream(
        &self,
        request: Request<Streaming<DeliverBatchRequest>>,
    ) -> Result<Response<Self::DeliverStreamStream>, Status> {
        let peer = cellmesh_proto::tls::caller(&request).cloned();
        let batches = request.into_inner();
        let (inbound, service) = (self.inbound.clone(), self.service.clone());
        let closing = self.closing.clone();
        let answers = deliver::stream(inbound, service, peer, batches, closing);
        Ok(Response::new(answers))
    }

    async fn export_conversation(
        &self,
        request: Request<ExportRequest>,
    ) -> Result<Response<ExportChunk>, Status> {
        let r = request.into_inner();
        let limit = if r.limit == 0 { DEFAULT_CHUNK } else { r.limit } as usize;
        Ok(Response::new(self.service.export_conversation(
            TenantId(r.tenant_id),
            ConversationId(r.conversation_id),
            r.after_seq,
            limit,
        )?))
    }

    async fn fetch_segment(
        &self,
        request: Request<FetchSegmentRequest>,
    ) -> Result<Response<FetchSegmentResponse>, Status> {
        let r = request.into_inner();
        let data = (self.service)
            .export_segment(
                TenantId(r.tenant_id),
                ConversationId(r.conversation_id),
                &r.key,
            )
            .await?;
        Ok(Response::new(FetchSegmentResponse { data }))
    }

    async fn seal_conversation(
        &self,
        request: Request<SealRequest>,
    ) -> Result<Response<SealResponse>, Status> {
        let r = request.into_inner();
        let latest_seq = self
            .service
            .seal_conversation(
                TenantId(r.tenant_id),
                ConversationId(r.conversation_id),
                r.epoch,
            )
            .await?;
        let delta = match r.delta_limit {
            0 => None,
            limit => Some(self.service.export_conversation(
                TenantId(r.tenant_id),
                ConversationId(r.conversation_id),
                r.delta_after_seq,
                limit as usize,
            )?),
        };
        Ok(Response::new(SealResponse { latest_seq, delta }))
    }

    async fn conversation_digest(
        &self,
        request: Request<DigestRequest>,
    ) -> Result<Response<DigestResponse>, Status> {
        let r = request.into_inner();
        let d = self.service.digest_conversation(
            ConversationId(r.conversation_id),
            r.after_seq,
            r.through_seq,
        )?;
        Ok(Response::new(DigestResponse {
            count: d.count,
            checksum: d.checksum,
            latest_seq: d.latest_seq,
            rewrites: d.rewrites,
            awaiting_backfill: (self.service)
                .history_awaits_backfill(ConversationId(r.conversation_id))?,
        }))
    }

    async fn tenant_conversations(
        &self,
        request: Request<TenantConversationsRequest>,
    ) -> Result<Response<TenantConversationsResponse>, Status> {
        let r = request.into_inner();
        let limit = if r.limit == 0 { DEFAULT_CHUNK } else { r.limit } as usize;
        let (conversation_ids, has_more) = self
            .service
            .tenant_conversations(TenantId(r.tenant_id), r.after_id, limit, r.epoch)
            .await?;
        Ok(Response::new(TenantConversationsResponse {
            conversation_ids,
            has_more,
        }))
    }

    async fn export_user(
        &self,
        request: Request<ExportUserRequest>,
    ) -> Result<Response<UserChunk>, Status> {
        let r = request.into_inner();
        let limit = if r.limit == 0 { DEFAULT_CHUNK } else { r.limit } as usize;
        let user = UserKey::new(TenantId(r.tenant_id), UserId(r.user_id));
        if r.with_state {
            self.sync.settle_home(user).await?;
        }
        Ok(Response::new(self.sync.export_user(
            user,
            r.after_pts,
            limit,
            r.with_state,
        )?))
    }

    async fn seal_user(
        &self,
        request: Request<SealRequest>,
    ) -> Result<Response<SealResponse>, Status> {
        let r = request.into_inner();
        let latest_seq = self
            .sync
            .seal_user(
                UserKey::new(TenantId(r.tenant_id), UserId(r.user_id)),
                r.epoch,
                &self.inbound,
            )
            .await?;
        Ok(Response::new(SealResponse {
            latest_seq,
            delta: None,
        }))
    }

    async fn user_digest(
        &self,
        request: Request<UserDigestRequest>,
    ) -> Result<Response<DigestResponse>, Status> {
        let r = request.into_inner();
        let d = self.sync.digest_user(
            UserKey::new(TenantId(r.tenant_id), UserId(r.user_id)),
            r.after_seq,
            r.through_seq,
        )?;
        Ok(Response::new(DigestResponse {
            count: d.count,
            checksum: d.checksum,
            latest_seq: d.latest_pts,
            ..Default::default()
        }))
    }

    async fn copy_user(
        &self,
        request: Request<CopyUserRequest>,
    ) -> Result<Response<CopyResponse>, Status> {
        Ok(Response::new(
            self.mover.copy_user(request.into_inner()).await?,
        ))
    }

    async fn store_conversation_chunk(
        &self,
        request: Request<StoreChunkRequest>,
    ) -> Result<Response<CopyResponse>, Status> {
        Ok(Response::new(
            self.mover
                .store_conversation_chunk(request.into_inner())
                .await?,
        ))
    }

    async fn tenant_marks(
        &self,
        request: Request<TenantMarksRequest>,
    ) -> Result<Response<TenantMarksResponse>, Status> {
        Ok(Response::new(
            self.mover.tenant_marks(request.into_inner()).await?,
        ))
    }

    async fn export_conversations(
        &self,
        request: Request<ExportManyRequest>,
    ) -> Result<Response<ExportManyResponse>, Status> {
        Ok(Response::new(
            self.mover
                .export_conversations(request.into_inner())
                .await?,
        ))
    }

    async fn copy_conversations(
        &self,
        request: Request<CopyManyRequest>,
    ) -> Result<Response<CopyManyResponse>, Status> {
        Ok(Response::new(
            self.mover.copy_conversations(request.into_inner()).await?,
        ))
    }

    async fn export_users(
        &self,
        request: Request<ExportUsersRequest>,
    ) -> Result<Response<ExportUsersResponse>, Status> {
        Ok(Response::new(
            self.mover.export_users(request.into_inner()).await?,
        ))
    }

    async fn copy_users(
        &self,
        request: Request<CopyUsersRequest>,
    ) -> Result<Response<CopyManyResponse>, Status> {
        Ok(Response::new(
            self.mover.copy_users(request.into_inner()).await?,
        ))
    }

    async fn store_high_water_marks(
        &self,
        request: Request<HighWaterMarks>,
    ) -> Result<Response<HighWaterMarksAck>, Status> {
        let r = request.into_inner();
        let marks: Vec<_> = r
            .marks
            .iter()
            .map(|m| (m.tenant_id, m.conversation_id, m.hwm))
            .collect();
        let service = self.service.clone();
        let stored = marks.len() as u32;
        blocking(move || service.store_pushed_marks(&r.source_cell, marks)).await?;
        Ok(Response::new(HighWaterMarksAck { stored }))
    }

    async fn get_high_water_marks(
        &self,
        request: Request<GetHighWaterMarksRequest>,
    ) -> Result<Response<HighWaterMarks>, Status> {
        let r = request.into_inner();
        if r.conversation_ids.len() > crate::hwm::MAX_PUSH {
            return Err(
                CellError::invalid(Reason::BadHighWaterMark, "too many conversations").into(),
            );
        }
        let held = self.service.marks().clone();
        let marks = blocking(move || {
            r.conversation_ids
                .iter()
                .map(|&c| {
                    Ok(HighWaterMark {
                        tenant_id: r.tenant_id,
                        conversation_id: c,
                        hwm: held.held(TenantId(r.tenant_id), ConversationId(c))?,
                    })
                })
                .collect::<Result<Vec<_>, CellError>>()
        })
        .await?;
        Ok(Response::new(HighWaterMarks {
            source_cell: self.service.cell_id().to_string(),
            marks,
        }))
    }

    async fn flush_high_water_marks(
        &self,
        _request: Request<FlushHighWaterMarksRequest>,
    ) -> Result<Response<HighWaterMarksAck>, Status> {
        if self.service.marks().flush(Duration::from_secs(10)).await {
            Ok(Response::new(HighWaterMarksAck { stored: 0 }))
        } else {
            Err(CellError::RetryLater {
                reason: Reason::StandbyUnreachable,
                message: "this cell's standbys did not acknowledge its high-water marks".into(),
                retry_after: Duration::from_millis(500),
            }
            .into())
        }
    }

    async fn replicate(
        &self,
        request: Request<ReplicateRequest>,
    ) -> Result<Response<ReplicateResponse>, Status> {
        let r = request.into_inner();
        let stored = self
            .service
            .store_replicated(&r.source_cell, r.writes)
            .await?;
        Ok(Response::new(ReplicateResponse { stored }))
    }

    async fn file_copies(
        &self,
        request: Request<FileCopiesRequest>,
    ) -> Result<Response<FileCopiesResponse>, Status> {
        let r = request.into_inner();
        let copies = self
            .service
            .file_copies(TenantId(r.tenant_id), r.bytes_per_sec)?;
        Ok(Response::new(copies))
    }

    async fn stats(&self, _request: Request<StatsRequest>) -> Result<Response<CellStats>, Status> {
        let (uptime_ms, sends, queue_lag, route_index) = self.service.stats()?;
        Ok(Response::new(CellStats {
            cell_id: self.service.cell_id().to_string(),
            uptime_ms,
            sends,
            queue_lag,
            route_index,
            metrics_address: self.metrics_address.clone(),
            files: (self.service.file_bytes()?.into_iter())
                .map(|(tenant_id, bytes)| TenantFiles { tenant_id, bytes })
                .collect(),
        }))
    }

    async fn copy_conversation(
        &self,
        request: Request<CopyRequest>,
    ) -> Result<Response<CopyResponse>, Status> {
        Ok(Response::new(
            self.mover.copy_conversation(request.into_inner()).await?,
        ))
    }
}
