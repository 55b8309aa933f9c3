//! Reading history across tiers: a page that reaches below the hot rows
//! continues from the conversation's cold segments, in seq order, with the
//! hot overlay rows (recalls and edits of cold messages) and the viewer's
//! delete-for-me rows applied, so a page reads the same before and after
//! tiering.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::storage::v1::{MessageRecord, SegmentEntry};

use super::MessageService;
use crate::cold::ColdTier;
use crate::error::{CellError, Result};
use crate::storage::{ScanDirection, ScanPage, visible};

/// What a page may still take.
struct Budget {
    limit: usize,
    bytes: usize,
}

impl MessageService {
    /// Up to `limit` messages of `conversation` beyond `from` in
    /// `direction` as `viewer` sees them, hot and cold (see
    /// [`Store::scan_messages`](crate::storage::Store::scan_messages)).
    pub(crate) async fn page(
        &self,
        conversation: ConversationId,
        viewer: UserId,
        from: u64,
        direction: ScanDirection,
        limit: usize,
        byte_budget: usize,
    ) -> Result<ScanPage> {
        let segments = match &self.cold {
            Some(_) => self.store.segments(conversation)?,
            None => Vec::new(),
        };
        let (Some(cold), Some(cold_end)) = (&self.cold, segments.last().map(|e| e.seq_end)) else {
            let scan = self.store.scan_messages(
                conversation,
                viewer,
                from,
                0,
                direction,
                limit,
                byte_budget,
            )?;
            return Ok(scan);
        };
        let hot = |page: &ScanPage, from: u64| {
            let budget = remaining(page, limit, byte_budget);
            self.store.scan_messages(
                conversation,
                viewer,
                from,
                cold_end,
                direction,
                budget.limit,
                budget.bytes,
            )
        };
        let mut page = ScanPage::default();
        match direction {
            ScanDirection::Forward => {
                if from < cold_end {
                    self.cold_page(
                        cold,
                        conversation,
                        viewer,
                        &segments,
                        from,
                        direction,
                        limit,
                        byte_budget,
                        &mut page,
                    )
                    .await?;
                    if page.more {
                        return Ok(page);
                    }
                }
                let tail = hot(&page, from.max(cold_end))?;
                page.messages.extend(tail.messages);
                page.last_seq = tail.last_seq.or(page.last_seq);
                page.more = tail.more;
            }
            ScanDirection::Backward => {
                page = hot(&page, from)?;
                if page.more || from <= 1 {
                    return Ok(page);
                }
                let below = from.min(cold_end.saturating_add(1));
                self.cold_page(
                    cold,
                    conversation,
                    viewer,
                    &segments,
                    below,
                    direction,
                    limit,
                    byte_budget,
                    &mut page,
                )
                .await?;
            }
        }
        Ok(page)
    }

    /// Adds to `page` the cold messages beyond `from` in `direction`.
    #[allow(clippy::too_many_arguments)]
    async fn cold_page(
        &self,
        cold: &ColdTier,
        conversation: ConversationId,
        viewer: UserId,
        segments: &[SegmentEntry],
        from: u64,
        direction: ScanDirection,
        limit: usize,
        byte_budget: usize,
        page: &mut ScanPage,
    ) -> Result<()> {
        crate::metrics::metrics().cold_pulls.inc();
        let forward = direction == ScanDirection::Forward;
        let wanted: Vec<&SegmentEntry> = match forward {
            true => segments.iter().filter(|e| e.seq_end > from).collect(),
            false => segments
                .iter()
                .rev()
                .filter(|e| e.seq_start < from)
                .collect(),
        };
        for entry in wanted {
            let messages = cold.read(conversation, entry).await?;
            let beyond = |s: &u64| if forward { *s > from } else { *s < from };
            let mut items: Vec<&(u64, MessageRecord)> =
                messages.iter().filter(|(s, _)| beyond(s)).collect();
            if !forward {
                items.reverse();
            }
            for (seq, record) in items {
                if remaining(page, limit, byte_budget).limit == 0 {
                    page.more = true;
                    return Ok(());
                }
                page.last_seq = Some(*seq);
                if self.store.is_hidden(conversation, viewer, *seq)? {
                    continue;
                }
                // A hot row below the hot tier is the message's current
                // state (recalled or edited after it was tiered).
                let record = self
                    .store
                    .message(conversation, *seq)?
                    .unwrap_or_else(|| record.clone());
                if visible(&record, viewer) {
                    page.messages.push((*seq, record));
                }
            }
        }
        Ok(())
    }

    /// One message, hot or cold (`None`: neither tier has it).
    pub(crate) async fn any_tier_message(
        &self,
        conversation: ConversationId,
        seq: u64,
    ) -> Result<Option<MessageRecord>> {
        if let Some(hot) = self.store.message(conversation, seq)? {
            return Ok(Some(hot));
        }
        let Some(cold) = &self.cold else {
            return Ok(None);
        };
        let segments = self.store.segments(conversation)?;
        let Some(entry) = segments
            .iter()
            .find(|e| e.seq_start <= seq && seq <= e.seq_end)
        else {
            return Ok(None);
        };
        let messages = cold.read(conversation, entry).await?;
        Ok(messages
            .binary_search_by_key(&seq, |(s, _)| *s)
            .ok()
            .map(|at| messages[at].1.clone()))
    }

    /// The bytes of `key`, a segment of `conversation` of `tenant` named by
    /// its manifest here (source side of a copy to another bucket).
    pub async fn export_segment(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
        key: &str,
    ) -> Result<Vec<u8>> {
        let owned = self
            .store
            .conversation(conversation)?
            .is_some_and(|c| c.tenant_id == tenant.get());
        let entry = match owned {
            true => self
                .store
                .segments(conversation)?
                .into_iter()
                .find(|e| e.key == key),
            false => None,
        };
        let (Some(cold), Some(entry)) = (&self.cold, entry) else {
            return Err(CellError::invalid(
                cellmesh_proto::reason::Reason::SegmentMissing,
                format!("conversation {conversation} of tenant {tenant} has no segment {key} here"),
            ));
        };
        Ok(cold.segment_bytes(conversation, &entry).await?.to_vec())
    }

    /// The segments of `chunk` this cell's cold tier does not hold (a
    /// target whose bucket is not the source's copies them first).
    pub async fn segments_to_fetch(
        &self,
        chunk_segments: &[SegmentEntry],
    ) -> Result<Vec<SegmentEntry>> {
        let Some(cold) = &self.cold else {
            return Ok(Vec::new());
        };
        let mut missing = Vec::new();
        for entry in chunk_segments {
            if cold.size_of(&entry.key).await? != Some(entry.size) {
                missing.push(entry.clone());
            }
        }
        Ok(missing)
    }

    /// Stores a segment copied from another cell.
    pub async fn store_segment_copy(
        &self,
        conversation: ConversationId,
        entry: &SegmentEntry,
        bytes: Vec<u8>,
    ) -> Result<()> {
        match &self.cold {
            Some(cold) => Ok(cold.store_copy(conversation, entry, bytes).await?),
            None => Ok(()),
        }
    }

    /// Checks that this cell's cold tier holds the objects of `segments`
    /// (handed over by a move or backfill), each at most `through`: cells
    /// that exchange history share the region's bucket.
    pub(crate) async fn adopt_segments(
        &self,
        conversation: ConversationId,
        segments: &[SegmentEntry],
        through: u64,
    ) -> Result<()> {
        if segments.is_empty() {
            return Ok(());
        }
        let Some(cold) = &self.cold else {
            return Err(CellError::invalid(
                cellmesh_proto::reason::Reason::SegmentMissing,
                format!(
                    "conversation {conversation} has cold history and this cell has no cold tier ([tiering] enabled = false)"
                ),
            ));
        };
        for entry in segments {
            if entry.seq_end > through || entry.seq_start > entry.seq_end {
                return Err(CellError::invalid(
                    cellmesh_proto::reason::Reason::MalformedRequest,
                    format!("segment {} is outside the range handed over", entry.key),
                ));
            }
            if cold.size_of(&entry.key).await? != Some(entry.size) {
                return Err(CellError::invalid(
                    cellmesh_proto::reason::Reason::SegmentMissing,
                    format!(
                        "this cell's cold tier does not hold segment {} of conversation {conversation}: cells that move history between them share one bucket",
                        entry.key
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The messages of one of `conversation`'s segments (none without a
    /// cold tier: [`adopt_segments`](Self::adopt_segments) refused those).
    pub(crate) async fn segment_messages(
        &self,
        conversation: ConversationId,
        entry: &SegmentEntry,
    ) -> Result<crate::cold::Messages> {
        match &self.cold {
            Some(cold) => Ok(cold.read(conversation, entry).await?),
            None => Ok(Default::default()),
        }
    }

    /// Whether `seq` of `conversation` is held in the cold tier.
    pub(crate) fn is_cold(
        &self,
        conversation: ConversationId,
        seq: u64,
    ) -> Result<bool, CellError> {
        Ok(self.cold.is_some() && seq > 0 && seq <= self.store.cold_through(conversation)?)
    }
}

fn remaining(page: &ScanPage, limit: usize, byte_budget: usize) -> Budget {
    let bytes: usize = page.messages.iter().map(|(_, m)| m.body.len()).sum();
    Budget {
        limit: limit.saturating_sub(page.messages.len()),
        bytes: byte_budget.saturating_sub(bytes),
    }
}
