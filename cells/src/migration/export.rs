//! Source side: many conversations' or homes' next chunks in one answer,
//! read off the request threads.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::v1::*;
use tonic::Status;

use super::*;
use crate::error::blocking;
use crate::user::UserKey;

impl Mover {
    pub async fn export_conversations(
        &self,
        r: ExportManyRequest,
    ) -> Result<ExportManyResponse, Status> {
        const MAX_BYTES: usize = 16 << 20;
        let limit = if r.limit == 0 { DEFAULT_CHUNK } else { r.limit } as usize;
        let service = self.service.clone();
        let chunks = blocking(move || {
            let (mut chunks, mut bytes) = (Vec::new(), 0usize);
            for item in &r.items {
                if bytes >= MAX_BYTES {
                    break;
                }
                let chunk = service.export_conversation(
                    TenantId(r.tenant_id),
                    ConversationId(item.conversation_id),
                    item.after_seq,
                    limit,
                )?;
                bytes += prost::Message::encoded_len(&chunk);
                chunks.push(chunk);
            }
            Ok(chunks)
        })
        .await?;
        Ok(ExportManyResponse { chunks })
    }

    pub async fn export_users(&self, r: ExportUsersRequest) -> Result<ExportUsersResponse, Status> {
        const MAX_BYTES: usize = 16 << 20;
        let limit = if r.limit == 0 { DEFAULT_CHUNK } else { r.limit } as usize;
        let sync = self.sync.clone();
        for item in &r.items {
            let user = UserKey::new(TenantId(r.tenant_id), UserId(item.user_id));
            sync.settle_home(user).await?;
        }
        let chunks = blocking(move || {
            let (mut chunks, mut bytes) = (Vec::new(), 0usize);
            for item in &r.items {
                if bytes >= MAX_BYTES {
                    break;
                }
                let user = UserKey::new(TenantId(r.tenant_id), UserId(item.user_id));
                let mut chunk = sync.export_user(user, item.after_pts, limit, false)?;
                chunk.state = sync.export_user(user, 0, 0, true)?.state;
                bytes += prost::Message::encoded_len(&chunk);
                chunks.push(chunk);
            }
            Ok(chunks)
        })
        .await?;
        Ok(ExportUsersResponse { chunks })
    }
}
