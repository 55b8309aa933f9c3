//! What a tenant export reads: the conversations of a tenant this cell
//! owns, and a conversation's whole history across the tiers (cold
//! segments, then the hot rows, a hot overlay of a cold message winning).

use std::collections::BTreeMap;

use cellmesh_proto::ids::{ConversationId, Epoch, TenantId};
use cellmesh_proto::storage::v1::MessageRecord;

use super::MessageService;
use crate::error::{CellError, Result};

/// Hot rows read at a time.
const PAGE: usize = 10_000;

impl MessageService {
    /// The conversations of `tenant` stored here whose route names this
    /// cell (not the copies a move left behind).
    pub fn exportable(&self, tenant: TenantId) -> Result<Vec<ConversationId>> {
        let ids = self.tenant_conversation_ids(tenant)?;
        Ok(ids
            .into_iter()
            .filter(|&id| {
                !matches!(
                    self.ownership.check(tenant, id, Epoch(0)),
                    Err(CellError::WrongCell { .. })
                )
            })
            .collect())
    }

    /// Every message of `conversation` by seq, hot and cold.
    pub async fn whole_history(
        &self,
        conversation: ConversationId,
    ) -> Result<Vec<(u64, MessageRecord)>> {
        let conversation = conversation.get();
        let mut all = BTreeMap::new();
        if let Some(cold) = &self.cold {
            for entry in self.store.segments(ConversationId(conversation))? {
                for (seq, record) in cold
                    .read(ConversationId(conversation), &entry)
                    .await?
                    .iter()
                {
                    all.insert(*seq, record.clone());
                }
            }
        }
        let mut after = 0;
        loop {
            let page =
                self.store
                    .messages_after(ConversationId(conversation), after, PAGE, usize::MAX)?;
            let Some(&(last, _)) = page.last() else {
                break;
            };
            after = last;
            all.extend(page);
        }
        Ok(all.into_iter().collect())
    }
}
