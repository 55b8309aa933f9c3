//! gRPC handlers of the cell-to-cell API: fan-out deliveries and the
//! migration calls (export, seal, digest on the source; copy on the target).

use cellmesh_proto::reason::Reason;
use std::sync::Arc;
use std::time::Duration;

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
use cellmesh_proto::v1::cell_peer_server::CellPeer;
use cellmesh_proto::v1::*;
use cellmesh_telemetry::trace::grpc::Channel;
use tonic::{Request, Response, Status};

use crate::error::{CellError, blocking};
use crate::failpoints::Action;
use crate::message::MessageService;
use crate::pipeline::{PeerInbound, UserImport};
use crate::sync::SyncService;
use crate::sync::moving::sync_checksum;
use crate::user::UserKey;
use cellmesh_proto::storage::v1::SyncRecord;

/// Messages per export chunk unless the caller asks otherwise.
const DEFAULT_CHUNK: u32 = 10_000;
/// How long after a tenant's seal its keys are marked for cleanup one by
/// one (the move's switch comes first).
const EXPAND_SEALED_AFTER: Duration = Duration::from_secs(5);
/// How long a delivery of replicated meta waits for this cell's route
/// table to reach the sender's index.
const STANDBY_ROUTE_WAIT: Duration = Duration::from_secs(2);

pub struct PeerApi {
    inbound: PeerInbound,
    service: Arc<MessageService>,
    sync: Arc<SyncService>,
    secret: ClusterSecret,
    /// Where this cell's `/metrics` answers ("" when off), for the console.
    metrics_address: String,
}

impl PeerApi {
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
            metrics_address: String::new(),
        }
    }

    /// Reports `address` as where this cell's metrics are scraped.
    pub fn with_metrics_address(mut self, address: String) -> Self {
        self.metrics_address = address;
        self
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
}

fn pipeline_unavailable(e: crate::pipeline::PipelineError) -> CellError {
    CellError::RetryLater {
        reason: Reason::PipelineUnavailable,
        message: e.to_string(),
        retry_after: Duration::from_millis(200),
    }
}

impl PeerApi {
    /// After a migration chunk is stored: the drills' fail point for a
    /// target that crashes before it answers.
    fn stored_chunk(&self) {
        if self.service.failpoint("migration.copy_stored") == Some(Action::Abort) {
            tracing::error!("fail point migration.copy_stored: aborting");
            std::process::abort();
        }
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

/// One copied part of `user`'s home (of `tenant`) from cell `source`.
fn user_import(
    (tenant, user, source): (u64, u64, &str),
    reset: bool,
    events: Vec<(u64, SyncRecord)>,
    state: Option<UserState>,
) -> UserImport {
    UserImport {
        user: UserKey::new(tenant, user),
        source: source.to_string(),
        reset,
        events,
        state,
    }
}

/// The events of an exported chunk of a home, once its checksum agrees.
fn checked_events(chunk: UserChunk) -> Result<Vec<(u64, SyncRecord)>, CellError> {
    let sum = (chunk.events.iter())
        .filter_map(|e| e.record.as_ref().map(|x| sync_checksum(e.pts, x)))
        .fold(0u64, u64::wrapping_add);
    if sum != chunk.checksum {
        return Err(CellError::invalid(
            Reason::ChecksumMismatch,
            "a user chunk arrived corrupted",
        ));
    }
    Ok(chunk
        .events
        .into_iter()
        .filter_map(|e| Some((e.pts, e.record?)))
        .collect())
}

#[tonic::async_trait]
impl CellPeer for PeerApi {
    async fn deliver_batch(
        &self,
        request: Request<DeliverBatchRequest>,
    ) -> Result<Response<DeliverBatchResponse>, Status> {
        // With mutual TLS, a cell delivers only as itself.
        if let Some(peer) = cellmesh_proto::tls::caller(&request)
            && (peer.role != cellmesh_proto::tls::Role::Cell
                || peer.id != request.get_ref().source_cell)
        {
            return Err(cellmesh_proto::tls::denied(format!(
                "{peer} may not deliver as cell {:?}",
                request.get_ref().source_cell
            )));
        }
        let r = request.into_inner();
        tracing::debug!(source = %r.source_cell, events = r.events.len(), "deliver batch");
        // Who owns a replicated conversation is judged on a table at least
        // as new as the sender's; what a view that does not get there in
        // time would refuse, the sender keeps and delivers again.
        let view_behind = r.route_index > 0
            && r.events.iter().any(crate::pipeline::for_standby)
            && !(self.service.ownership())
                .await_route_index(r.route_index, STANDBY_ROUTE_WAIT)
                .await;
        let delivered = self
            .inbound
            .deliver(r.source_cell, r.events, view_behind)
            .await
            .map_err(pipeline_unavailable)?;
        Ok(Response::new(DeliverBatchResponse {
            applied: delivered.applied,
            refused: delivered
                .refused_users
                .iter()
                .map(|u| TenantUser {
                    tenant_id: u.tenant,
                    user_id: u.user,
                })
                .collect(),
            refused_standby_events: delivered.refused_standby,
            deferred_standby_events: delivered.deferred_standby,
        }))
    }

    async fn export_conversation(
        &self,
        request: Request<ExportRequest>,
    ) -> Result<Response<ExportChunk>, Status> {
        let r = request.into_inner();
        let limit = if r.limit == 0 { DEFAULT_CHUNK } else { r.limit } as usize;
        Ok(Response::new(self.service.export_conversation(
            r.tenant_id,
            r.conversation_id,
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
            .export_segment(r.tenant_id, r.conversation_id, &r.key)
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
            .seal_conversation(r.tenant_id, r.conversation_id, r.epoch)
            .await?;
        let delta = match r.delta_limit {
            0 => None,
            limit => Some(self.service.export_conversation(
                r.tenant_id,
                r.conversation_id,
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
        let d = self
            .service
            .digest_conversation(r.conversation_id, r.after_seq, r.through_seq)?;
        Ok(Response::new(DigestResponse {
            count: d.count,
            checksum: d.checksum,
            latest_seq: d.latest_seq,
            rewrites: d.rewrites,
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
            .tenant_conversations(r.tenant_id, r.after_id, limit, r.epoch)
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
        Ok(Response::new(self.sync.export_user(
            UserKey::new(r.tenant_id, r.user_id),
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
            .seal_user(UserKey::new(r.tenant_id, r.user_id), r.epoch, &self.inbound)
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
            UserKey::new(r.tenant_id, r.user_id),
            r.after_seq,
            r.through_seq,
        )?;
        Ok(Response::new(DigestResponse {
            count: d.count,
            checksum: d.checksum,
            latest_seq: d.latest_pts,
            rewrites: 0,
        }))
    }

    async fn copy_user(
        &self,
        request: Request<CopyUserRequest>,
    ) -> Result<Response<CopyResponse>, Status> {
        let r = request.into_inner();
        let mut source = self.source(&r.source_address).await?;
        let chunk = if r.chunk == 0 { DEFAULT_CHUNK } else { r.chunk };
        let export = |after_pts, with_state| {
            let mut export = Request::new(ExportUserRequest {
                tenant_id: r.tenant_id,
                user_id: r.user_id,
                after_pts,
                limit: chunk,
                with_state,
            });
            self.secret.attach(&mut export);
            export
        };
        let (mut after, mut copied, mut reset) = (r.after_pts, 0u64, r.reset);
        let home = (r.tenant_id, r.user_id, r.source_cell.as_str());
        let mut bytes = 0u64;
        // One round copies what the source held when it began; events
        // arriving meanwhile are the next round's.
        let mut until = u64::MAX;
        while after < until {
            let exported = source.export_user(export(after, false)).await?.into_inner();
            bytes += prost::Message::encoded_len(&exported) as u64;
            until = until.min(exported.latest_pts);
            let events = checked_events(exported)?;
            let Some(&(last, _)) = events.last() else {
                break;
            };
            copied += events.len() as u64;
            after = last;
            let import = user_import(home, std::mem::take(&mut reset), events, None);
            self.import_users(&r.source_cell, vec![import]).await?;
        }
        // The state last, so its dedupe positions cover the copied events.
        let state = source.export_user(export(after, true)).await?.into_inner();
        bytes += prost::Message::encoded_len(&state) as u64;
        let import = user_import(home, reset, Vec::new(), state.state);
        self.import_users(&r.source_cell, vec![import]).await?;
        Ok(Response::new(CopyResponse {
            copied_through: after,
            messages: copied,
            source_latest_seq: state.latest_pts,
            bytes,
        }))
    }

    async fn store_conversation_chunk(
        &self,
        request: Request<StoreChunkRequest>,
    ) -> Result<Response<CopyResponse>, Status> {
        let r = request.into_inner();
        let chunk = r.chunk.ok_or_else(|| {
            Status::from(CellError::invalid(
                Reason::EmptyChunk,
                "the request has no chunk",
            ))
        })?;
        let (n, latest) = (chunk.messages.len() as u64, chunk.latest_seq);
        let bytes = prost::Message::encoded_len(&chunk) as u64;
        let last = chunk.messages.last().map(|m| m.seq);
        self.service
            .import_chunk(r.tenant_id, r.conversation_id, chunk, true)
            .await?;
        self.stored_chunk();
        Ok(Response::new(CopyResponse {
            copied_through: last.unwrap_or(0),
            messages: n,
            source_latest_seq: latest,
            bytes,
        }))
    }

    async fn tenant_marks(
        &self,
        request: Request<TenantMarksRequest>,
    ) -> Result<Response<TenantMarksResponse>, Status> {
        let r = request.into_inner();
        let started = std::time::Instant::now();
        let (tenant, messages) = (r.tenant_id, &self.service);
        if r.seal {
            // After these waits every write of the frozen tenant is durable
            // and in the change log. Conversations and homes have gates of
            // their own.
            let conversations = async {
                if r.only_users {
                    return Ok(());
                }
                messages.seal_tenant_conversations(r.epoch).await
            };
            let users = (self.sync).seal_tenant_homes(r.epoch, &self.inbound);
            let (conversations, users) = tokio::join!(conversations, users);
            conversations?;
            users?;
        }
        let sealed = started.elapsed();
        // The cut comes before the reads: what is written after it is in
        // the next answer.
        let cut = (!r.only_users).then(|| messages.store().changes().cut(tenant, r.since));
        let changed = cut.as_ref().and_then(|c| c.changed.clone());
        let (service, sync, incremental, users) = (
            self.service.clone(),
            self.sync.clone(),
            changed.is_some(),
            r.users,
        );
        let (conversations, users) = blocking(move || {
            let (conversations, extra) = match changed {
                _ if r.only_users => (Vec::new(), users),
                Some(changed) => {
                    let mut extra = users;
                    extra.extend(changed.users);
                    (service.of_tenant(tenant, &changed.conversations)?, extra)
                }
                None => (service.tenant_conversation_ids(tenant)?, users),
            };
            let users = sync.tenant_user_ids(&conversations, &extra)?;
            Ok((conversations, users))
        })
        .await?;
        let listed = started.elapsed();
        if r.seal {
            if r.only_users {
                (self.sync)
                    .seal_tenant_users(tenant, &users, r.epoch, &self.inbound)
                    .await?;
            } else {
                messages.mark_tenant_sealed(tenant).await?;
                let sync = self.sync.clone();
                tokio::spawn(async move {
                    // Off the freeze: the switch comes first.
                    tokio::time::sleep(EXPAND_SEALED_AFTER).await;
                    if let Err(e) = sync.expand_sealed_tenants().await {
                        tracing::warn!(error = %e, "marking a sealed tenant's keys failed");
                    }
                });
            }
        }
        let marked = started.elapsed();
        // Scans (and digests) run off the request threads, which keep
        // answering probes and sends.
        let (service, sync, digest) = (self.service.clone(), self.sync.clone(), r.with_digest);
        let (conversations, users) = tokio::try_join!(
            blocking(move || service.conversation_marks(&conversations, digest)),
            blocking(move || sync.user_marks(tenant, &users, digest)),
        )?;
        if r.seal {
            tracing::info!(
                tenant,
                conversations = conversations.len(),
                users = users.len(),
                incremental,
                seal_ms = sealed.as_millis() as u64,
                list_ms = (listed - sealed).as_millis() as u64,
                mark_ms = (marked - listed).as_millis() as u64,
                marks_ms = (started.elapsed() - marked).as_millis() as u64,
                "tenant sealed"
            );
        }
        Ok(Response::new(TenantMarksResponse {
            conversations,
            users,
            token: cut.as_ref().map_or(0, |c| c.token),
            complete: cut.is_some_and(|c| c.changed.is_none()),
        }))
    }

    async fn export_conversations(
        &self,
        request: Request<ExportManyRequest>,
    ) -> Result<Response<ExportManyResponse>, Status> {
        const MAX_BYTES: usize = 16 << 20;
        let r = request.into_inner();
        let limit = if r.limit == 0 { DEFAULT_CHUNK } else { r.limit } as usize;
        let service = self.service.clone();
        let chunks = blocking(move || {
            let (mut chunks, mut bytes) = (Vec::new(), 0usize);
            for item in &r.items {
                if bytes >= MAX_BYTES {
                    break;
                }
                let chunk = service.export_conversation(
                    r.tenant_id,
                    item.conversation_id,
                    item.after_seq,
                    limit,
                )?;
                bytes += prost::Message::encoded_len(&chunk);
                chunks.push(chunk);
            }
            Ok(chunks)
        })
        .await?;
        Ok(Response::new(ExportManyResponse { chunks }))
    }

    async fn copy_conversations(
        &self,
        request: Request<CopyManyRequest>,
    ) -> Result<Response<CopyManyResponse>, Status> {
        let r = request.into_inner();
        let mut source = self.source(&r.source_address).await?;
        let mut export = Request::new(ExportManyRequest {
            tenant_id: r.tenant_id,
            items: r.items.clone(),
            limit: r.limit,
        });
        self.secret.attach(&mut export);
        let chunks = source
            .export_conversations(export)
            .await?
            .into_inner()
            .chunks;
        // Stored concurrently: their commits share fsyncs.
        let stores = r.items.iter().zip(chunks).map(|(item, chunk)| {
            let (n, latest) = (chunk.messages.len() as u64, chunk.latest_seq);
            let bytes = prost::Message::encoded_len(&chunk) as u64;
            let last = chunk.messages.last().map_or(item.after_seq, |m| m.seq);
            let id = item.conversation_id;
            let mut source = source.clone();
            async move {
                let (service, secret) = (&self.service, &self.secret);
                super::segments::fetch_missing(
                    service,
                    secret,
                    &mut source,
                    r.tenant_id,
                    id,
                    &chunk.segments,
                )
                .await?;
                self.service
                    .import_chunk(r.tenant_id, id, chunk, true)
                    .await?;
                Ok::<_, CellError>(Copied {
                    id,
                    copied_through: last,
                    messages: n,
                    source_latest_seq: latest,
                    bytes,
                })
            }
        });
        let results = futures::future::try_join_all(stores).await?;
        self.stored_chunk();
        Ok(Response::new(CopyManyResponse { results }))
    }

    async fn export_users(
        &self,
        request: Request<ExportUsersRequest>,
    ) -> Result<Response<ExportUsersResponse>, Status> {
        const MAX_BYTES: usize = 16 << 20;
        let r = request.into_inner();
        let limit = if r.limit == 0 { DEFAULT_CHUNK } else { r.limit } as usize;
        let sync = self.sync.clone();
        let chunks = blocking(move || {
            let (mut chunks, mut bytes) = (Vec::new(), 0usize);
            for item in &r.items {
                if bytes >= MAX_BYTES {
                    break;
                }
                let user = UserKey::new(r.tenant_id, item.user_id);
                let mut chunk = sync.export_user(user, item.after_pts, limit, false)?;
                chunk.state = sync.export_user(user, 0, 0, true)?.state;
                bytes += prost::Message::encoded_len(&chunk);
                chunks.push(chunk);
            }
            Ok(chunks)
        })
        .await?;
        Ok(Response::new(ExportUsersResponse { chunks }))
    }

    async fn copy_users(
        &self,
        request: Request<CopyUsersRequest>,
    ) -> Result<Response<CopyManyResponse>, Status> {
        let r = request.into_inner();
        // Checked before anything is asked of the source.
        let mut users = std::collections::HashSet::new();
        if let Some(twice) = r.items.iter().find(|i| !users.insert(i.user_id)) {
            return Err(CellError::invalid(
                Reason::MalformedRequest,
                format!("user {} is named twice in one batch", twice.user_id),
            )
            .into());
        }
        let mut source = self.source(&r.source_address).await?;
        let mut export = Request::new(ExportUsersRequest {
            tenant_id: r.tenant_id,
            items: r.items.clone(),
            limit: r.limit,
        });
        self.secret.attach(&mut export);
        let chunks = source.export_users(export).await?.into_inner().chunks;
        let (mut imports, mut results) = (Vec::new(), Vec::new());
        for (item, mut chunk) in r.items.iter().zip(chunks) {
            let (bytes, latest) = (prost::Message::encoded_len(&chunk) as u64, chunk.latest_pts);
            let state = chunk.state.take();
            let events = checked_events(chunk)?;
            let (n, last) = (events.len() as u64, events.last().map(|e| e.0));
            results.push(Copied {
                id: item.user_id,
                copied_through: last.unwrap_or(if item.reset { 0 } else { item.after_pts }),
                messages: n,
                source_latest_seq: latest,
                bytes,
            });
            // Events and state in one commit: the state's dedupe positions
            // cover the events.
            let home = (r.tenant_id, item.user_id, r.source_cell.as_str());
            imports.push(user_import(home, item.reset, events, state));
        }
        if !imports.is_empty() {
            self.import_users(&r.source_cell, imports).await?;
        }
        self.stored_chunk();
        Ok(Response::new(CopyManyResponse { results }))
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
                        hwm: held.held(r.tenant_id, c)?,
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
        let copies = self.service.file_copies(r.tenant_id, r.bytes_per_sec)?;
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
        }))
    }

    async fn copy_conversation(
        &self,
        request: Request<CopyRequest>,
    ) -> Result<Response<CopyResponse>, Status> {
        let r = request.into_inner();
        let mut source = self.source(&r.source_address).await?;
        let mut segment_source = source.clone();
        let chunk = if r.chunk == 0 { DEFAULT_CHUNK } else { r.chunk };
        // The next chunk is fetched while this one is stored.
        let (tx, mut chunks) = tokio::sync::mpsc::channel(2);
        let fetch = {
            let (secret, r) = (self.secret.clone(), r.clone());
            tokio::spawn(async move {
                let mut after = r.after_seq;
                let mut fetched = 0u64;
                // One call copies what the source held when it first
                // answered: no round trip just to learn that nothing follows.
                let mut until = u64::MAX;
                loop {
                    let mut export = Request::new(ExportRequest {
                        tenant_id: r.tenant_id,
                        conversation_id: r.conversation_id,
                        after_seq: after,
                        limit: chunk,
                    });
                    secret.attach(&mut export);
                    let exported = source
                        .export_conversation(export)
                        .await
                        .map(|e| e.into_inner());
                    let last = exported
                        .as_ref()
                        .ok()
                        .and_then(|e| e.messages.last().map(|m| m.seq));
                    if let Ok(e) = &exported {
                        fetched += e.messages.len() as u64;
                        until = until.min(e.latest_seq);
                    }
                    if tx.send(exported).await.is_err() {
                        return;
                    }
                    match last {
                        Some(last) => after = last,
                        None => return,
                    }
                    if after >= until
                        || (r.max_messages > 0 && fetched >= u64::from(r.max_messages))
                    {
                        return;
                    }
                }
            })
        };
        let mut after = r.after_seq;
        let (mut copied, mut bytes) = (0u64, 0u64);
        let mut source_latest = 0;
        // The round's first chunk describes the conversation to this
        // cell's standbys (see `import_chunk`).
        let mut first = true;
        while let Some(exported) = chunks.recv().await {
            let exported = exported?;
            source_latest = exported.latest_seq;
            bytes += prost::Message::encoded_len(&exported) as u64;
            let n = exported.messages.len() as u64;
            let last = exported.messages.last().map(|m| m.seq);
            super::segments::fetch_missing(
                &self.service,
                &self.secret,
                &mut segment_source,
                r.tenant_id,
                r.conversation_id,
                &exported.segments,
            )
            .await?;
            if r.backfill {
                self.service
                    .backfill_chunk(r.tenant_id, r.conversation_id, exported)
                    .await?;
            } else {
                self.service
                    .import_chunk(r.tenant_id, r.conversation_id, exported, first)
                    .await?;
            }
            copied += n;
            first = false;
            if let Some(last) = last {
                after = last;
            }
            self.stored_chunk();
        }
        let _ = fetch.await;
        if r.backfill {
            self.service.mark_backfilled(r.conversation_id, after)?;
        }
        Ok(Response::new(CopyResponse {
            copied_through: after,
            messages: copied,
            source_latest_seq: source_latest,
            bytes,
        }))
    }
}
