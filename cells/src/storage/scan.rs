//! Paging through a conversation's messages in either direction, merged with
//! the viewer's delete-for-me overlay so hidden messages never leave storage.

use cellmesh_proto::ids::{ConversationId, Seq, UserId};
use cellmesh_proto::storage::v1::MessageRecord;
use prost::Message as _;
use rocksdb::{DBRawIterator, ReadOptions};

use super::keys::{self, cf};
use super::{Result, Store, corrupt};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanDirection {
    /// seq > from, ascending.
    Forward,
    /// seq < from, descending.
    Backward,
}

#[derive(Debug, Default)]
pub struct ScanPage {
    /// Visible messages, in scan order.
    pub messages: Vec<(u64, MessageRecord)>,
    /// The last seq examined (visible or hidden); resume from here.
    pub last_seq: Option<u64>,
    /// Whether stored messages exist beyond `last_seq` in this direction.
    pub more: bool,
}

impl Store {
    /// Up to `limit` messages of `conversation` strictly beyond `from` in
    /// `direction` and above seq `above` (below it the hot rows are overlays
    /// of cold history), skipping those `viewer` deleted for themselves or
    /// may not see (directed to others); the page ends early once its
    /// bodies reach `byte_budget` bytes.
    #[allow(clippy::too_many_arguments)]
    pub fn scan_messages(
        &self,
        conversation: ConversationId,
        viewer: UserId,
        from: u64,
        above: u64,
        direction: ScanDirection,
        limit: usize,
        byte_budget: usize,
    ) -> Result<ScanPage> {
        if direction == ScanDirection::Backward && from == 0 {
            return Ok(ScanPage::default());
        }
        let window = self.views.screens.read(conversation, false, |screen| {
            let take = limit.saturating_mul(2).max(limit.saturating_add(1));
            screen.window(from, above, direction, take)
        });
        // The message lane notes its batches in order: a screen that has
        // heard of the latest seq holds every row up to it.
        if let Some(Some(window)) = window
            && window.top >= self.conv_seq(conversation)?.latest_seq
        {
            let mut pager = self.pager(conversation, viewer, from, direction, limit, byte_budget);
            let mut rows = window.rows.into_iter();
            // Answered: the page filled before a row left, or no row lies
            // beyond the last one.
            let answered = loop {
                let Some((seq, record)) = rows.next() else {
                    break window.covered;
                };
                if pager.full() {
                    pager.page.more = true;
                    break true;
                }
                pager.take(seq, || Ok(record.as_ref().clone()))?;
            };
            if answered {
                crate::metrics::metrics().screen_pages.inc();
                return Ok(pager.page);
            }
        }
        self.scan_stored(
            conversation,
            viewer,
            from,
            above,
            direction,
            limit,
            byte_budget,
        )
    }

    /// [`scan_messages`](Self::scan_messages) from storage.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn scan_stored(
        &self,
        conversation: ConversationId,
        viewer: UserId,
        from: u64,
        above: u64,
        direction: ScanDirection,
        limit: usize,
        byte_budget: usize,
    ) -> Result<ScanPage> {
        let mut pager = self.pager(conversation, viewer, from, direction, limit, byte_budget);
        let mut messages =
            self.bounded_iter(cf::MESSAGES, conversation_bounds(conversation, above));
        let at = Seq(first_after(from, direction));
        let message_key = keys::message(conversation, at);
        match direction {
            ScanDirection::Forward => messages.seek(message_key),
            ScanDirection::Backward => messages.seek_for_prev(message_key),
        }
        while messages.valid() {
            if pager.full() {
                pager.page.more = true;
                break;
            }
            let key = messages.key().unwrap_or_default();
            let seq = keys::last_u64(key).ok_or_else(|| corrupt(cf::MESSAGES, "short key"))?;
            pager.take(seq, || {
                let value = messages.value().unwrap_or_default();
                MessageRecord::decode(value).map_err(|e| corrupt(cf::MESSAGES, e))
            })?;
            match direction {
                ScanDirection::Forward => messages.next(),
                ScanDirection::Backward => messages.prev(),
            }
        }
        messages.status()?;
        pager.hidden.status()?;
        Ok(pager.page)
    }

    /// A page under way for `viewer`, its delete-for-me rows positioned at
    /// the first seq beyond `from`.
    fn pager(
        &self,
        conversation: ConversationId,
        viewer: UserId,
        from: u64,
        direction: ScanDirection,
        limit: usize,
        byte_budget: usize,
    ) -> Pager<'_> {
        let mut hidden = self.bounded_iter(cf::HIDDEN, hidden_bounds(conversation, viewer));
        let hidden_key = keys::hidden(conversation, viewer, Seq(first_after(from, direction)));
        match direction {
            ScanDirection::Forward => hidden.seek(hidden_key),
            ScanDirection::Backward => hidden.seek_for_prev(hidden_key),
        }
        Pager {
            hidden,
            viewer,
            direction,
            limit,
            byte_budget,
            bytes: 0,
            page: ScanPage::default(),
        }
    }

    /// Up to `limit` stored messages of `conversation` with seq > `after`,
    /// ascending, whatever their visibility (migration copies them all);
    /// stops early once they hold `max_bytes` (at least one is returned).
    pub fn messages_after(
        &self,
        conversation: ConversationId,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<(u64, MessageRecord)>> {
        let lower = keys::message(conversation, Seq(after.saturating_add(1))).to_vec();
        let upper = keys::message(conversation, Seq(u64::MAX)).to_vec();
        let mut it = self.bounded_iter(cf::MESSAGES, (lower, upper));
        it.seek_to_first();
        let (mut out, mut bytes) = (Vec::new(), 0usize);
        while it.valid() && out.len() < limit && (out.is_empty() || bytes < max_bytes) {
            let (Some(key), Some(value)) = (it.key(), it.value()) else {
                break;
            };
            bytes += value.len();
            let seq = keys::last_u64(key).ok_or_else(|| corrupt(cf::MESSAGES, "short key"))?;
            let record = MessageRecord::decode(value).map_err(|e| corrupt(cf::MESSAGES, e))?;
            out.push((seq, record));
            it.next();
        }
        it.status()?;
        Ok(out)
    }

    pub(super) fn bounded_iter(
        &self,
        name: &'static str,
        (lower, upper): (Vec<u8>, Vec<u8>),
    ) -> DBRawIterator<'_> {
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(lower);
        opts.set_iterate_upper_bound(upper);
        self.db.raw_iterator_cf_opt(self.cf(name), opts)
    }
}

/// A page being filled, row by row in scan order.
struct Pager<'a> {
    hidden: DBRawIterator<'a>,
    viewer: UserId,
    direction: ScanDirection,
    limit: usize,
    byte_budget: usize,
    bytes: usize,
    page: ScanPage,
}

impl Pager<'_> {
    fn full(&self) -> bool {
        self.page.messages.len() == self.limit || self.bytes >= self.byte_budget
    }

    /// Examines the row at `seq`: the page takes its record (read only
    /// then) unless the viewer deleted it or may not see it.
    fn take(&mut self, seq: u64, record: impl FnOnce() -> Result<MessageRecord>) -> Result<()> {
        self.page.last_seq = Some(seq);
        if !is_hidden(&mut self.hidden, seq, self.direction) {
            let record = record()?;
            if visible(&record, self.viewer) {
                self.bytes += record.body.len();
                self.page.messages.push((seq, record));
            }
        }
        Ok(())
    }
}

/// The first seq after `from` in a scan's direction.
fn first_after(from: u64, direction: ScanDirection) -> u64 {
    match direction {
        ScanDirection::Forward => from.saturating_add(1),
        ScanDirection::Backward => from.saturating_sub(1),
    }
}

/// The viewer that sees every message, directed or not, with no
/// delete-for-me rows (user ids are below it): the search indexer.
pub const EVERY_MESSAGE: u64 = u64::MAX;

/// Whether `viewer` may see a message: everyone, unless it is directed.
pub fn visible(record: &MessageRecord, viewer: UserId) -> bool {
    viewer == UserId(EVERY_MESSAGE)
        || record.visible_to.is_empty()
        || record.sender_id == viewer.get()
        || record.visible_to.contains(&viewer.get())
}

/// Advances the overlay iterator up to `seq` and says whether `seq` is hidden.
fn is_hidden(hidden: &mut DBRawIterator<'_>, seq: u64, direction: ScanDirection) -> bool {
    while hidden.valid() {
        let Some(h) = hidden.key().and_then(keys::last_u64) else {
            return false;
        };
        match direction {
            ScanDirection::Forward if h < seq => hidden.next(),
            ScanDirection::Backward if h > seq => hidden.prev(),
            _ => return h == seq,
        }
    }
    false
}

fn conversation_bounds(conversation: ConversationId, above: u64) -> (Vec<u8>, Vec<u8>) {
    (
        keys::message(conversation, Seq(above.saturating_add(1))).to_vec(),
        keys::message(conversation, Seq(u64::MAX)).to_vec(),
    )
}

fn hidden_bounds(conversation: ConversationId, viewer: UserId) -> (Vec<u8>, Vec<u8>) {
    (
        keys::hidden(conversation, viewer, Seq(0)).to_vec(),
        keys::hidden(conversation, viewer, Seq(u64::MAX)).to_vec(),
    )
}
