//! Target side: copying conversations from the source — one at a time
//! with the next chunk fetched while this one is stored, many at a time in
//! one call, or a chunk the caller pushes.

use cellmesh_proto::ids::{ConversationId, TenantId};
use cellmesh_proto::v1::*;
use tonic::{Request, Status};

use super::*;

impl Mover {
    pub async fn copy_conversation(&self, r: CopyRequest) -> Result<CopyResponse, Status> {
        self.refused_backfill(&r)?;
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
                TenantId(r.tenant_id),
                ConversationId(r.conversation_id),
                &exported.segments,
            )
            .await?;
            if r.backfill {
                self.service
                    .backfill_chunk(
                        TenantId(r.tenant_id),
                        ConversationId(r.conversation_id),
                        exported,
                    )
                    .await?;
            } else {
                self.service
                    .import_chunk(
                        TenantId(r.tenant_id),
                        ConversationId(r.conversation_id),
                        exported,
                        first,
                    )
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
            self.service
                .mark_backfilled(
                    TenantId(r.tenant_id),
                    ConversationId(r.conversation_id),
                    after,
                )
                .await?;
        }
        Ok(CopyResponse {
            copied_through: after,
            messages: copied,
            source_latest_seq: source_latest,
            bytes,
        })
    }

    pub async fn copy_conversations(&self, r: CopyManyRequest) -> Result<CopyManyResponse, Status> {
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
                    TenantId(r.tenant_id),
                    ConversationId(id),
                    &chunk.segments,
                )
                .await?;
                self.service
                    .import_chunk(TenantId(r.tenant_id), ConversationId(id), chunk, true)
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
        Ok(CopyManyResponse { results })
    }

    pub async fn store_conversation_chunk(
        &self,
        r: StoreChunkRequest,
    ) -> Result<CopyResponse, Status> {
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
            .import_chunk(
                TenantId(r.tenant_id),
                ConversationId(r.conversation_id),
                chunk,
                true,
            )
            .await?;
        self.stored_chunk();
        Ok(CopyResponse {
            copied_through: last.unwrap_or(0),
            messages: n,
            source_latest_seq: latest,
            bytes,
        })
    }
}
