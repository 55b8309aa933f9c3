//! A whole tenant's conversations on this cell, for a tenant move: where
//! each one stands (latest seq, rewrites, and on request a digest of all
//! its history), and the seal of all of them at once once the tenant's
//! entry is frozen — the source's answer is then final, so the mover
//! copies only the conversations that changed since its last round.

use cellmesh_proto::reason::Reason;
use cellmesh_proto::v1::Mark;
use std::time::Instant;

use super::MessageService;
use super::migrate::SEAL_TIMEOUT;
use crate::error::{CellError, Result};
use crate::storage::moved;

impl MessageService {
    /// Every conversation of `tenant` stored here.
    pub async fn tenant_conversation_ids(&self, tenant: u64, epoch: u64) -> Result<Vec<u64>> {
        let (mut ids, mut after) = (Vec::new(), 0);
        loop {
            let (page, more) = self
                .tenant_conversations(tenant, after, 10_000, epoch)
                .await?;
            after = page.last().copied().unwrap_or(after);
            ids.extend(page);
            if !more {
                return Ok(ids);
            }
        }
    }

    /// Where each of `conversations` stands here; with `digest`, the count
    /// and checksum of all its history too.
    pub fn conversation_marks(&self, conversations: &[u64], digest: bool) -> Result<Vec<Mark>> {
        conversations
            .iter()
            .map(|&id| {
                let rewrites = self
                    .store
                    .meta_u64(&crate::storage::keys::meta::rewrites(id))?
                    .unwrap_or(0);
                let latest = self.store.conv_seq(id)?.latest_seq;
                let (count, checksum) = if digest {
                    let d = self.digest_conversation(id, 0, latest)?;
                    (d.count, d.checksum)
                } else {
                    (0, 0)
                };
                Ok(Mark {
                    id,
                    latest,
                    rewrites,
                    count,
                    checksum,
                    handed_over: false,
                })
            })
            .collect()
    }

    /// Seals every conversation of `tenant` stored here that this cell
    /// sees frozen at `epoch` (through the tenant's entry; one with an
    /// override of its own that keeps it here is left alone): no seq is
    /// assigned after, every assigned one is durable, no rewrite or
    /// membership change is in flight. One wait for the whole tenant, not
    /// one per conversation. How many were sealed.
    pub async fn seal_tenant_conversations(
        &self,
        tenant: u64,
        conversations: &[u64],
        epoch: u64,
    ) -> Result<u64> {
        self.await_route_epoch(epoch, Instant::now() + SEAL_TIMEOUT)
            .await?;
        let frozen: Vec<u64> = conversations
            .iter()
            .copied()
            .filter(|&c| {
                matches!(
                    self.ownership.check(tenant, c, 0),
                    Err(CellError::RetryLater {
                        reason: Reason::Frozen,
                        ..
                    })
                )
            })
            .collect();
        // Every write that checked ownership before this cell saw the
        // freeze holds the gate until it is durable.
        drop(self.writing.write().await);
        let now = self.clock.now_ms();
        super::cleanup::mark_all_sealed(&self.store, moved::CONVERSATION, tenant, &frozen, now)
            .await?;
        Ok(frozen.len() as u64)
    }
}
