//! Cleanup after a move (DESIGN.md §5, step 6): once a conversation this
//! cell handed over has been owned elsewhere for the grace period, its
//! history here is dropped (record and members stay: they may be a
//! standby's copy). A move that was cancelled, or came back, keeps it.

use std::time::Duration;

use cellmesh_proto::v1::RouteState;

use super::MessageService;
use crate::error::{CellError, Result};
use crate::storage::Mutation;
use crate::storage::moved::{self, Moved};

/// What the route table says about a key this cell handed over.
pub(crate) enum Handed {
    /// It is this cell's again: keep the copy, forget the mark.
    Back,
    /// Another cell owns it and is not moving it here: the copy may go.
    Away,
    /// Frozen, moving, or the route cannot be read now: ask again later.
    Unsettled,
}

impl Handed {
    /// From an ownership or home check of the key.
    pub(crate) fn of<T>(check: Result<T>) -> Self {
        match check {
            Ok(_) => Self::Back,
            Err(CellError::WrongCell { route, .. }) if route.state == RouteState::Active as i32 => {
                Self::Away
            }
            Err(_) => Self::Unsettled,
        }
    }
}

/// Whether `moved`, handed over `grace` ago or more, may be dropped now;
/// otherwise whether its mark goes.
pub(crate) fn verdict(handed: Handed, moved: &Moved, now_ms: u64, grace: Duration) -> Option<bool> {
    match handed {
        Handed::Back => Some(false),
        Handed::Away if now_ms >= moved.sealed_at_ms + grace.as_millis() as u64 => Some(true),
        _ => None,
    }
}

impl MessageService {
    /// Records that `conversation` was sealed here for a move.
    pub(crate) async fn mark_sealed(&self, tenant: u64, conversation: u64) -> Result<()> {
        let mut m = Mutation::new();
        let sealed_at_ms = self.clock.now_ms();
        m.mark_moved(
            moved::CONVERSATION,
            Moved {
                id: conversation,
                tenant,
                sealed_at_ms,
            },
        );
        Ok(self.store.commit(m).await?)
    }

    /// Drops the history of conversations owned elsewhere for `grace`;
    /// how many.
    pub async fn clean_moved(&self, grace: Duration) -> Result<u64> {
        let now = self.clock.now_ms();
        let mut dropped = 0;
        for moved in self.store.moved(moved::CONVERSATION)? {
            let handed = Handed::of(self.ownership.check(moved.tenant, moved.id, 0));
            let Some(drop) = verdict(handed, &moved, now, grace) else {
                continue;
            };
            let mut m = Mutation::new();
            if drop {
                m.drop_history(moved.id);
                dropped += 1;
            }
            m.unmark_moved(moved::CONVERSATION, moved.id);
            self.store.commit(m).await?;
            self.conversations.invalidate(moved.id);
        }
        if dropped > 0 {
            tracing::info!(dropped, "dropped the history of conversations moved away");
        }
        Ok(dropped)
    }
}
