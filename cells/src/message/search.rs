//! `Search` on one cell: the caller's conversations here that match, newest
//! first. The tenant's index only proposes candidates; each is read back
//! through `Pull`'s path for this caller (membership now, directed
//! messages, delete-for-me, recalls, hot and cold tiers alike) and kept only
//! if `Pull` would show it with the text that matched — so a stale index
//! entry can make a page shorter, never show what the caller may not see.

use cellmesh_proto::ids::{ConversationId, UserId};
use cellmesh_proto::reason::Reason;
use cellmesh_proto::v1::{HighlightRange, Message, SearchHit, SearchResponse};

use super::{Caller, MessageService};
use crate::convert::message_to_proto;
use crate::error::{CellError, Result};
use crate::search::indexer::text_of;
use crate::search::{Lookup, Prepared, SearchError};
use crate::storage::ScanDirection;

pub const MAX_QUERY_BYTES: usize = 512;
pub const DEFAULT_PAGE: u32 = 20;
pub const MAX_PAGE: u32 = 100;
pub const MAX_CONTEXT: u32 = 20;
/// Conversations one call may name.
pub const MAX_CONVERSATIONS: usize = 20_000;
/// Candidates one call reads back at most before it answers with what it
/// has (the next page goes on from there).
const MAX_EXAMINED: usize = 2_000;

#[derive(Debug, Clone)]
pub struct SearchCommand {
    pub caller: Caller,
    pub query: String,
    /// One conversation the caller named (errors as `Pull`'s), or none.
    pub conversation: Option<ConversationId>,
    /// The caller's conversations to look in (those not here are skipped).
    pub conversations: Vec<ConversationId>,
    pub sender: Option<UserId>,
    pub from_ms: Option<u64>,
    pub to_ms: Option<u64>,
    pub page_size: u32,
    pub before_msg_id: Option<u64>,
    pub context: u32,
}

impl SearchCommand {
    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(CellError::invalid(Reason::SearchQueryInvalid, m));
        if self.query.trim().is_empty() {
            return bad("the query is empty".into());
        }
        if self.query.len() > MAX_QUERY_BYTES {
            return bad(format!("the query is over {MAX_QUERY_BYTES} bytes"));
        }
        if self.page_size > MAX_PAGE {
            return bad(format!("page_size is over {MAX_PAGE}"));
        }
        if self.context > MAX_CONTEXT {
            return bad(format!("context is over {MAX_CONTEXT}"));
        }
        if self.conversations.len() > MAX_CONVERSATIONS {
            return bad(format!("more than {MAX_CONVERSATIONS} conversations"));
        }
        if let (Some(from), Some(to)) = (self.from_ms, self.to_ms)
            && from > to
        {
            return bad("from_ms is after to_ms".into());
        }
        Ok(())
    }
}

fn unavailable(e: SearchError) -> CellError {
    match e {
        SearchError::Query(m) => CellError::invalid(Reason::SearchQueryInvalid, m),
        e => CellError::RetryLater {
            reason: Reason::SearchUnavailable,
            message: e.to_string(),
            retry_after: std::time::Duration::from_secs(1),
        },
    }
}

impl MessageService {
    #[tracing::instrument(skip_all, fields(tenant = cmd.caller.tenant.get(), user = cmd.caller.user.get()))]
    pub async fn search(&self, cmd: SearchCommand) -> Result<SearchResponse> {
        cmd.validate()?;
        let Some(search) = &self.search else {
            return Err(CellError::RetryLater {
                reason: Reason::SearchUnavailable,
                message: "search is off on this cell ([search] enabled = false)".into(),
                retry_after: std::time::Duration::from_secs(5),
            });
        };
        let tenant = cmd.caller.tenant;
        if !search.config.searchable(tenant) {
            return Err(CellError::denied(
                Reason::SearchDisabled,
                format!("tenant {tenant} encrypts end to end: the server holds no text to search"),
            ));
        }
        self.check_call(&cmd.caller)?;
        let (allowed, unsearched) = self.searchable_conversations(&cmd)?;
        let mut out = SearchResponse {
            partial: !unsearched.is_empty(),
            unsearched: unsearched.into_iter().map(ConversationId::get).collect(),
            ..Default::default()
        };
        if allowed.is_empty() {
            return Ok(out);
        }
        let index = search.tenant(tenant).map_err(unavailable)?;
        let lookup = Lookup {
            text: &cmd.query,
            conversations: &allowed,
            sender: cmd.sender,
            from_ms: cmd.from_ms,
            to_ms: cmd.to_ms,
            before_msg_id: cmd.before_msg_id,
        };
        let prepared = index.prepare(&lookup).map_err(unavailable)?;
        let want = match cmd.page_size {
            0 => DEFAULT_PAGE,
            n => n,
        } as usize;
        let batch = (want * 2).max(50);
        let mut offset = 0;
        'pages: loop {
            let candidates = index.page(&prepared, offset, batch).map_err(unavailable)?;
            let exhausted = candidates.len() < batch;
            offset += candidates.len();
            for (i, c) in candidates.iter().enumerate() {
                if let Some(hit) = self.hit(&cmd, &prepared, c.conversation, c.seq).await? {
                    out.hits.push(hit);
                }
                let last = i + 1 == candidates.len();
                if out.hits.len() == want || offset >= MAX_EXAMINED && last {
                    if !(exhausted && last) {
                        out.examined_down_to = c.msg_id;
                    }
                    break 'pages;
                }
            }
            if exhausted {
                break;
            }
        }
        Ok(out)
    }

    /// The conversations of `cmd` to look in, and those the answer does not
    /// fully cover: owned by another cell, or taken over by a failover
    /// whose history below the floor has not come back yet (searched for
    /// what is here).
    fn searchable_conversations(
        &self,
        cmd: &SearchCommand,
    ) -> Result<(Vec<ConversationId>, Vec<ConversationId>)> {
        let (mut allowed, mut uncovered) = (Vec::new(), Vec::new());
        let single = cmd.conversation.map(|id| vec![id]);
        for &id in single.as_ref().unwrap_or(&cmd.conversations) {
            let route_floor = match self.ownership.check_read(cmd.caller.tenant, id) {
                Ok(floor) => floor,
                Err(CellError::WrongCell { .. } | CellError::RetryLater { .. })
                    if single.is_none() =>
                {
                    uncovered.push(id);
                    continue;
                }
                Err(e) => return Err(e),
            };
            // Not a member (or not this tenant's): nothing to find there.
            match self.check_member(&cmd.caller, id) {
                Ok(()) => allowed.push(id),
                Err(CellError::NotFound { .. } | CellError::PermissionDenied { .. })
                    if single.is_none() =>
                {
                    continue;
                }
                Err(e) => return Err(e),
            }
            let floor = self.store.conv_seq(id)?.seq_floor.max(route_floor);
            if self.unavailable_through(id, floor)? > 0 {
                uncovered.push(id);
            }
        }
        Ok((allowed, uncovered))
    }

    /// The hit at (conversation, seq) as the caller sees it, if they may.
    async fn hit(
        &self,
        cmd: &SearchCommand,
        prepared: &Prepared,
        conversation: ConversationId,
        seq: u64,
    ) -> Result<Option<SearchHit>> {
        let user = cmd.caller.user;
        let page = self
            .page(
                conversation,
                user,
                seq - 1,
                ScanDirection::Forward,
                1,
                usize::MAX,
            )
            .await?;
        let Some((at, record)) = page.messages.into_iter().next() else {
            return Ok(None);
        };
        let Some(text) = text_of(&record).filter(|_| at == seq) else {
            return Ok(None);
        };
        // The index may lag an edit: the text as it is now must match.
        let (snippet, ranges) = prepared.snippet(&text);
        if ranges.is_empty() && !prepared.matches_without_terms() {
            return Ok(None);
        }
        let mut hit = SearchHit {
            message: Some(message_to_proto(conversation, seq, record)),
            snippet,
            highlights: ranges
                .into_iter()
                .map(|r| HighlightRange {
                    start: r.start as u32,
                    end: r.end as u32,
                })
                .collect(),
            ..Default::default()
        };
        if cmd.context > 0 {
            let k = cmd.context as usize;
            hit.before = self
                .context(conversation, user, seq, ScanDirection::Backward, k)
                .await?;
            hit.before.reverse();
            hit.after = self
                .context(conversation, user, seq, ScanDirection::Forward, k)
                .await?;
        }
        Ok(Some(hit))
    }

    async fn context(
        &self,
        conversation: ConversationId,
        user: UserId,
        seq: u64,
        direction: ScanDirection,
        k: usize,
    ) -> Result<Vec<Message>> {
        let page = self
            .page(conversation, user, seq, direction, k, 1 << 20)
            .await?;
        Ok(page
            .messages
            .into_iter()
            .map(|(s, r)| message_to_proto(conversation, s, r))
            .collect())
    }

    /// Up to a page of `conversation`'s stored messages after `after`
    /// through `last`, whoever they are directed to (the indexer's read).
    pub(crate) async fn history_for_index(
        &self,
        conversation: ConversationId,
        after: u64,
        last: u64,
    ) -> Result<Vec<(u64, cellmesh_proto::storage::v1::MessageRecord)>> {
        let page = self
            .page(
                conversation,
                UserId(crate::storage::EVERY_MESSAGE),
                after,
                ScanDirection::Forward,
                last.saturating_sub(after).min(500) as usize,
                4 << 20,
            )
            .await?;
        Ok(page
            .messages
            .into_iter()
            .filter(|(s, _)| *s <= last)
            .collect())
    }
}
