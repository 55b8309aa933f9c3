//! Target side: copying users' homes (sync queue, conversation list,
//! cursors) from the source, checksummed chunk by chunk, one home or many.

use cellmesh_proto::ids::{TenantId, UserId};
use cellmesh_proto::storage::v1::SyncRecord;
use cellmesh_proto::v1::*;
use tonic::{Request, Status};

use super::*;
use crate::sync::moving::sync_checksum;
use crate::user::UserKey;

impl Mover {
    pub async fn copy_user(&self, r: CopyUserRequest) -> Result<CopyResponse, Status> {
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
        Ok(CopyResponse {
            copied_through: after,
            messages: copied,
            source_latest_seq: state.latest_pts,
            bytes,
        })
    }

    pub async fn copy_users(&self, r: CopyUsersRequest) -> Result<CopyManyResponse, Status> {
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
        Ok(CopyManyResponse { results })
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
        user: UserKey::new(TenantId(tenant), UserId(user)),
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
