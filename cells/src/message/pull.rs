//! `Pull`: a page of a conversation's history in either direction, as the
//! caller sees it (recalled and edited messages in their current state,
//! delete-for-me hidden), hot and cold tiers alike, with `latest_seq` so the
//! client can detect gaps.

use cellmesh_proto::ids::ConversationId;
use cellmesh_proto::v1::{ConversationKind, PullResponse};

use super::{Caller, MessageService};
use crate::convert::message_to_proto;
use crate::error::Result;
use crate::storage::ScanDirection;

/// Page size when the request names none.
pub const DEFAULT_PULL_LIMIT: u32 = 50;

/// Stop filling a page once its bodies reach this many bytes, so a page
/// always fits a client's default 4 MiB message limit.
const PAGE_BYTE_BUDGET: usize = 3 * 1024 * 1024;

#[derive(Debug, Clone)]
pub struct PullCommand {
    pub caller: Caller,
    pub conversation: ConversationId,
    pub since_seq: u64,
    pub direction: ScanDirection,
    pub limit: u32,
}

impl MessageService {
    #[tracing::instrument(skip_all, fields(tenant = cmd.caller.tenant.get(), conversation = cmd.conversation.get(), user = cmd.caller.user.get()))]
    pub async fn pull(&self, cmd: PullCommand) -> Result<PullResponse> {
        let route_floor = self
            .ownership
            .check_read(cmd.caller.tenant, cmd.conversation)?;
        let entry = self.conversation(&cmd.caller, cmd.conversation.get())?;
        self.require_member(&cmd.caller, cmd.conversation)?;
        if entry.kind == ConversationKind::Group {
            self.keep_first_screen(cmd.conversation)?;
        }
        let limit = match cmd.limit {
            0 => DEFAULT_PULL_LIMIT,
            n => n.min(self.config.limits.max_pull_limit),
        } as usize;
        let seq = self.store.conv_seq(cmd.conversation)?;
        // The route's floor counts even before a send here stored it: a
        // quiet new owner after a failover holds backfilled history up to it.
        let floor = seq.seq_floor.max(route_floor);
        let from = match (cmd.direction, cmd.since_seq) {
            (ScanDirection::Backward, 0) => seq.latest_seq.max(floor).saturating_add(1),
            (_, since) => since,
        };
        let page = self
            .page(
                cmd.conversation,
                cmd.caller.user,
                from,
                cmd.direction,
                limit,
                PAGE_BYTE_BUDGET,
            )
            .await?;
        let unavailable_through = self.unavailable_through(cmd.conversation, floor)?;
        if unavailable_through > 0 {
            crate::metrics::metrics().pulls_unavailable.inc();
        }
        // The floor jumps the page spans, so a client closes those gaps.
        let (lo, hi) = match cmd.direction {
            ScanDirection::Forward => (
                cmd.since_seq.saturating_add(1),
                page.last_seq.filter(|_| page.more).unwrap_or(u64::MAX),
            ),
            ScanDirection::Backward => (
                page.last_seq.filter(|_| page.more).unwrap_or(1),
                from.saturating_sub(1),
            ),
        };
        let skipped = (seq.jumps.iter())
            .filter(|j| j.first <= hi && j.last >= lo)
            .map(crate::convert::skipped_to_proto)
            .collect();
        Ok(PullResponse {
            skipped,
            unavailable_through,
            messages: page
                .messages
                .into_iter()
                .map(|(s, record)| message_to_proto(cmd.conversation, s, record))
                .collect(),
            next_seq: page.last_seq.unwrap_or(cmd.since_seq),
            has_more: page.more,
            latest_seq: seq.latest_seq,
            seq_floor: floor,
        })
    }

    /// A group of at least `fanout.large_group_threshold` members keeps
    /// its newest messages in memory from its first pull on (see
    /// [`crate::storage::screen`]): its members' pulls after a hint, or on
    /// opening it, then read no history from storage.
    fn keep_first_screen(&self, conversation: ConversationId) -> Result<()> {
        if self.store.has_screen(conversation) {
            return Ok(());
        }
        let threshold = self.config.fanout.large_group_threshold;
        let record = self.store.conversation(conversation)?;
        if record.is_some_and(|c| c.member_count >= threshold) {
            self.store.keep_screen(conversation)?;
        }
        Ok(())
    }

    /// After a failover the history below the floor stays in the failed
    /// cell until it is backfilled: the last seq not held here (0: all of
    /// it is), so an answer says so instead of looking empty.
    pub(crate) fn unavailable_through(
        &self,
        conversation: ConversationId,
        floor: u64,
    ) -> Result<u64> {
        Ok(
            if floor == 0
                || self.backfilled(conversation, floor)?
                || self.is_cold(conversation, floor)?
            {
                0
            } else if let Some(from) = self.replicated_from(conversation)? {
                // A `sync` standby holds every acknowledged message from here.
                from.saturating_sub(1)
            } else if self
                .store
                .messages_after(conversation, floor.saturating_sub(1), 1, usize::MAX)?
                .first()
                .is_none_or(|(s, _)| *s > floor)
            {
                floor
            } else {
                0
            },
        )
    }
}
