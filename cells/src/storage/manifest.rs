//! The cold tier's manifest: per conversation, the segments (seq range,
//! time range, object key, checksum, size) that hold its history below the
//! hot rows. An entry and the deletion of the hot rows it covers commit in
//! one batch, so a crash leaves either the hot rows or a committed entry
//! whose object was read back — never neither. Hot rows at or below the
//! newest entry's end are overlays (recalls and edits of cold messages)
//! and win over the segment's copy.

use cellmesh_proto::ids::{ConversationId, Seq, UserId};
use cellmesh_proto::storage::v1::SegmentEntry;
use prost::Message as _;

use super::keys::{self, cf};
use super::{Mutation, Op, Result, Store};

/// An upload whose manifest entry may not have committed.
#[derive(Debug, Clone)]
pub struct PendingUpload {
    pub meta_key: Vec<u8>,
    pub conversation: ConversationId,
    pub seq_start: u64,
    pub object: String,
    pub at_ms: u64,
}

impl Mutation {
    /// Commits a segment and removes the hot rows `(after, through]` it
    /// now holds.
    pub fn tier_segment(&mut self, conversation: ConversationId, entry: &SegmentEntry, after: u64) {
        self.put(
            cf::MANIFEST,
            keys::message(conversation, Seq(entry.seq_start)),
            entry.encode_to_vec(),
        );
        self.ops.push(Op::DeleteRange(
            cf::MESSAGES,
            keys::message(conversation, Seq(after.saturating_add(1))).to_vec(),
            keys::message(conversation, Seq(entry.seq_end.saturating_add(1))).to_vec(),
        ));
    }

    /// Forgets a pending upload (see [`keys::meta::tier_pending`]).
    pub fn clear_pending_upload(&mut self, key: Vec<u8>) {
        self.ops.push(Op::Delete(cf::META, key));
    }

    /// Adopts a segment another cell wrote (a move or backfill hands the
    /// manifest over; the object is shared).
    pub fn put_segment(&mut self, conversation: ConversationId, entry: &SegmentEntry) {
        self.put(
            cf::MANIFEST,
            keys::message(conversation, Seq(entry.seq_start)),
            entry.encode_to_vec(),
        );
    }

    /// Drops a segment from the manifest (retention), with any overlay
    /// rows in its range.
    pub fn drop_segment(&mut self, conversation: ConversationId, entry: &SegmentEntry) {
        let key = keys::message(conversation, Seq(entry.seq_start)).to_vec();
        self.ops.push(Op::Delete(cf::MANIFEST, key));
        self.ops.push(Op::DeleteRange(
            cf::MESSAGES,
            keys::message(conversation, Seq(entry.seq_start)).to_vec(),
            keys::message(conversation, Seq(entry.seq_end.saturating_add(1))).to_vec(),
        ));
    }
}

impl Store {
    /// The manifest of `conversation`, ascending seq.
    pub fn segments(&self, conversation: ConversationId) -> Result<Vec<SegmentEntry>> {
        Ok(self
            .records(
                cf::MANIFEST,
                keys::message(conversation, Seq(0)).to_vec(),
                keys::message(conversation, Seq(u64::MAX)).to_vec(),
                usize::MAX,
            )?
            .into_iter()
            .map(|(_, entry)| entry)
            .collect())
    }

    /// The highest seq held cold (0: none).
    pub fn cold_through(&self, conversation: ConversationId) -> Result<u64> {
        let mut it = self.bounded_iter(
            cf::MANIFEST,
            (
                keys::message(conversation, Seq(0)).to_vec(),
                keys::message(conversation, Seq(u64::MAX)).to_vec(),
            ),
        );
        it.seek_to_last();
        let Some(value) = it.value() else {
            it.status()?;
            return Ok(0);
        };
        SegmentEntry::decode(value)
            .map(|e| e.seq_end)
            .map_err(|e| super::corrupt(cf::MANIFEST, e))
    }

    /// Every manifest entry with its conversation, for sweeps and
    /// retention, after `(conversation, seq_start)`.
    pub fn all_segments(
        &self,
        after: (u64, u64),
        limit: usize,
    ) -> Result<Vec<(u64, SegmentEntry)>> {
        let lower = keys::message(ConversationId(after.0), Seq(after.1.saturating_add(1))).to_vec();
        self.range(cf::MANIFEST, lower, vec![0xff; 17], limit)?
            .into_iter()
            .map(|(k, v)| {
                let conversation =
                    keys::first_u64(&k).ok_or_else(|| super::corrupt(cf::MANIFEST, "short key"))?;
                let entry = SegmentEntry::decode(v.as_ref())
                    .map_err(|e| super::corrupt(cf::MANIFEST, e))?;
                Ok((conversation, entry))
            })
            .collect()
    }

    /// Uploads not known to have committed: (meta key, conversation,
    /// seq_start, object key, when in ms).
    pub fn pending_uploads(&self) -> Result<Vec<PendingUpload>> {
        let prefix = keys::meta::TIER_PENDING;
        let upper = [prefix, &[0xff]].concat();
        self.range(cf::META, prefix.to_vec(), upper, usize::MAX)?
            .into_iter()
            .map(|(k, v)| {
                let rest = &k[prefix.len()..];
                let bad = || super::corrupt(cf::META, "bad pending upload key");
                let conversation = keys::first_u64(rest).ok_or_else(bad)?;
                let seq_start = rest.get(8..16).and_then(keys::decode_u64).ok_or_else(bad)?;
                let object = String::from_utf8(rest[16..].to_vec()).map_err(|_| bad())?;
                Ok(PendingUpload {
                    meta_key: k.to_vec(),
                    conversation: ConversationId(conversation),
                    seq_start,
                    object,
                    at_ms: keys::decode_u64(&v).unwrap_or(0),
                })
            })
            .collect()
    }

    /// Whether `viewer` deleted `seq` of `conversation` for themselves.
    pub fn is_hidden(
        &self,
        conversation: ConversationId,
        viewer: UserId,
        seq: u64,
    ) -> Result<bool> {
        let key = keys::hidden(conversation, viewer, Seq(seq));
        Ok(self.db.get_pinned_cf(self.cf(cf::HIDDEN), key)?.is_some())
    }
}
