//! Read receipts as counts (`ReadCount`): for each seq a member asks about,
//! how many of the conversation's current members have read it. Counted
//! from the members' read positions, so a group of any size answers with
//! numbers, never a member list; a sender has read what it sent.
//!
//! A group at or above `fanout.large_group_threshold` is walked once; its
//! tally is then kept up by every commit (see `storage::tally`), so its
//! counts are exact and cost no walk. Smaller conversations are walked
//! each time.

use cellmesh_proto::ids::ConversationId;
use cellmesh_proto::v1::ReadCountResponse;

use super::{Caller, MessageService};
use crate::error::Result;
use crate::storage::StorageError;

/// Most seqs one request may ask about.
pub const MAX_READ_COUNT_SEQS: usize = 100;

#[derive(Debug, Clone)]
pub struct ReadCountCommand {
    pub caller: Caller,
    pub conversation: ConversationId,
    pub seqs: Vec<u64>,
}

impl MessageService {
    pub async fn read_count(&self, cmd: ReadCountCommand) -> Result<ReadCountResponse> {
        Self::check_seq_list(&cmd.seqs, MAX_READ_COUNT_SEQS)?;
        self.check_member_call(&cmd.caller, cmd.conversation)?;
        let kept = (self.store.read_tallies()).kept_counts(cmd.conversation, &cmd.seqs);
        if let Some((read, member_count)) = kept {
            return Ok(ReadCountResponse { read, member_count });
        }
        let store = self.store.clone();
        let keep_from = self.config.fanout.large_group_threshold;
        let conversation = cmd.conversation;
        let counted = tokio::task::spawn_blocking(move || {
            store.read_counts(conversation, &cmd.seqs, keep_from)
        });
        let (read, member_count) = match counted.await {
            Ok(counted) => counted?,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Cancelled: the runtime is shutting down, and the store with it.
            Err(_) => return Err(StorageError::Closed.into()),
        };
        Ok(ReadCountResponse { read, member_count })
    }
}
