//! Read receipts as counts (`ReadCount`): for each seq a member asks about,
//! how many of the conversation's current members have read it. Counted
//! from the members' read positions, so a group of any size answers with
//! numbers, never a member list; a sender has read what it sent.
//!
//! Counting walks every member, so the positions of a group at or above
//! `fanout.large_group_threshold` are kept for [`FRESH_FOR`] and shared by
//! every request meanwhile: its counts may be that much behind. Smaller
//! conversations are counted afresh each time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellmesh_proto::ids::ConversationId;
use cellmesh_proto::v1::ReadCountResponse;

use super::{Caller, MessageService};
use crate::error::Result;
use crate::storage::StorageError;

/// Most seqs one request may ask about.
pub const MAX_READ_COUNT_SEQS: usize = 100;
/// How long a large group's read positions are reused.
const FRESH_FOR: Duration = Duration::from_secs(1);
/// Large groups whose positions are kept at once.
const MAX_KEPT: usize = 256;

/// A group's sorted read positions and when they were read.
type Kept = (Instant, Arc<Vec<u64>>);

/// The read positions of large groups.
#[derive(Default)]
pub(crate) struct ReadPositions {
    kept: Mutex<HashMap<ConversationId, Kept>>,
}

impl ReadPositions {
    fn fresh(&self, conversation: ConversationId) -> Option<Arc<Vec<u64>>> {
        let kept = self.kept.lock().expect("read positions");
        let (at, positions) = kept.get(&conversation)?;
        (at.elapsed() < FRESH_FOR).then(|| positions.clone())
    }

    fn keep(&self, conversation: ConversationId, positions: Arc<Vec<u64>>) {
        let mut kept = self.kept.lock().expect("read positions");
        if kept.len() >= MAX_KEPT {
            kept.retain(|_, (at, _)| at.elapsed() < FRESH_FOR);
        }
        if kept.len() < MAX_KEPT {
            kept.insert(conversation, (Instant::now(), positions));
        }
    }
}

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
        let positions = match self.read_positions.fresh(cmd.conversation) {
            Some(kept) => kept,
            None => {
                let positions = Arc::new(self.walk_read_positions(cmd.conversation).await?);
                let large = self.config.fanout.large_group_threshold as usize;
                if positions.len() >= large {
                    self.read_positions
                        .keep(cmd.conversation, positions.clone());
                }
                positions
            }
        };
        Ok(ReadCountResponse {
            read: cmd
                .seqs
                .iter()
                .map(|seq| read_by(&positions, *seq))
                .collect(),
            member_count: positions.len() as u32,
        })
    }

    /// The members' read positions, walked off the async workers (a group
    /// of 100,000 takes tens of milliseconds).
    async fn walk_read_positions(&self, conversation: ConversationId) -> Result<Vec<u64>> {
        let store = self.store.clone();
        match tokio::task::spawn_blocking(move || store.member_read_positions(conversation)).await {
            Ok(walked) => Ok(walked?),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Cancelled: the runtime is shutting down, and the store with it.
            Err(_) => Err(StorageError::Closed.into()),
        }
    }
}

/// How many of the sorted `positions` are at or above `seq`.
fn read_by(positions: &[u64], seq: u64) -> u32 {
    (positions.len() - positions.partition_point(|p| *p < seq)) as u32
}

#[cfg(test)]
mod tests {
    use super::read_by;

    #[test]
    fn counts_positions_at_or_above_the_seq() {
        let positions = [0, 3, 3, 7, 9];
        assert_eq!(read_by(&positions, 0), 5);
        assert_eq!(read_by(&positions, 1), 4);
        assert_eq!(read_by(&positions, 3), 4);
        assert_eq!(read_by(&positions, 4), 2);
        assert_eq!(read_by(&positions, 9), 1);
        assert_eq!(read_by(&positions, 10), 0);
        assert_eq!(read_by(&[], 1), 0);
    }
}
