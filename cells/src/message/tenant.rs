//! A whole tenant's conversations on this cell, for a tenant move: where
//! each one stands (latest seq, rewrites, and on request a digest of all
//! its history), and the seal of all of them at once once the tenant's
//! entry is frozen — the source's answer is then final, so the mover
//! copies only the conversations that changed since its last round (the
//! store's change log names them: nothing is listed under the freeze).

use cellmesh_proto::ids::{ConversationId, TenantId};
use cellmesh_proto::v1::Mark;
use std::time::Instant;

use super::MessageService;
use super::migrate::SEAL_TIMEOUT;
use crate::error::Result;
use crate::storage::moved;

impl MessageService {
    /// Where each of `conversations` stands here; with `digest`, the count
    /// and checksum of all its history too.
    pub fn conversation_marks(
        &self,
        conversations: &[ConversationId],
        digest: bool,
    ) -> Result<Vec<Mark>> {
        let mut walk = self.store.walk();
        let mut sorted = conversations.to_vec();
        sorted.sort_unstable();
        sorted
            .iter()
            .map(|&id| {
                let latest = walk.conv_seq(id)?.latest_seq;
                let (rewrites, count, checksum) = if digest {
                    let d = super::migrate::digest_conversation(&mut walk, id, 0, latest)?;
                    (d.rewrites, d.count, d.checksum)
                } else {
                    let rewrites = crate::storage::keys::meta::rewrites(id);
                    (walk.meta_u64(&rewrites)?.unwrap_or(0), 0, 0)
                };
                Ok(Mark {
                    id: id.get(),
                    latest,
                    rewrites,
                    count,
                    checksum,
                    handed_over: false,
                    uploads: (self.store).open_uploads_digest(id)?,
                })
            })
            .collect()
    }

    /// Those of `conversations` (changed ones, of any tenant) that belong
    /// to `tenant` here.
    pub fn of_tenant(
        &self,
        tenant: TenantId,
        conversations: &[ConversationId],
    ) -> Result<Vec<ConversationId>> {
        let mut ids = Vec::new();
        for &id in conversations {
            if self
                .store
                .conversation(id)?
                .is_some_and(|r| r.tenant_id == tenant.get())
            {
                ids.push(id);
            }
        }
        Ok(ids)
    }

    /// Once this cell has seen route epoch `epoch` (a tenant's freeze):
    /// every write that checked ownership before — sends, rewrites,
    /// membership changes, creations — is durable. One wait for the whole
    /// tenant, not one per conversation; the tenant's conversations are
    /// frozen here from then on.
    pub async fn seal_tenant_conversations(&self, epoch: u64) -> Result<()> {
        self.await_route_epoch(epoch, Instant::now() + SEAL_TIMEOUT)
            .await?;
        drop(self.creating.write().await);
        drop(self.writing.write().await);
        Ok(())
    }

    /// Records that `tenant` was sealed whole here: its conversations and
    /// homes are marked for cleanup one by one later, off the freeze (see
    /// `SyncService::expand_sealed_tenants`).
    pub async fn mark_tenant_sealed(&self, tenant: TenantId) -> Result<()> {
        let now = self.clock.now_ms();
        super::cleanup::mark_sealed(
            &self.store,
            moved::TENANT,
            tenant,
            (ConversationId(0)).get(),
            now,
        )
        .await
    }
}
