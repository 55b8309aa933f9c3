//! The segment object format: a magic header, then an LZ4-compressed
//! [`SegmentBody`]; named by conversation, seq range and the SHA-256 of its
//! bytes, so a retried upload writes the same object and never overwrites
//! a different one.

use cellmesh_proto::ids::{ConversationId, TenantId};
use cellmesh_proto::storage::v1::{MessageRecord, SegmentBody, SegmentMessage};
use prost::Message as _;
use sha2::{Digest, Sha256};

/// First bytes of every segment object (format version 1).
const MAGIC: &[u8; 6] = b"CMSEG1";

/// A segment ready to upload.
#[derive(Debug, Clone)]
pub struct Encoded {
    pub bytes: Vec<u8>,
    pub checksum: Vec<u8>,
}

/// Encodes the messages of one conversation (ascending seq).
pub fn encode(
    tenant: TenantId,
    conversation: ConversationId,
    messages: &[(u64, MessageRecord)],
) -> Encoded {
    let body = SegmentBody {
        conversation_id: conversation.get(),
        tenant_id: tenant.get(),
        messages: messages
            .iter()
            .map(|(seq, record)| SegmentMessage {
                seq: *seq,
                record: Some(record.clone()),
            })
            .collect(),
    };
    let mut bytes = MAGIC.to_vec();
    bytes.extend(lz4_flex::compress_prepend_size(&body.encode_to_vec()));
    let checksum = Sha256::digest(&bytes).to_vec();
    Encoded { bytes, checksum }
}

/// Why stored bytes are not the segment the manifest names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SegmentFault {
    #[error("checksum mismatch")]
    Checksum,
    #[error("not a segment: {0}")]
    Format(String),
    #[error("segment of conversation {found}, expected {expected}")]
    WrongConversation { expected: u64, found: u64 },
}

/// Checks `bytes` against `checksum` and decodes them.
pub fn decode(
    bytes: &[u8],
    checksum: &[u8],
    conversation: ConversationId,
) -> Result<Vec<(u64, MessageRecord)>, SegmentFault> {
    if Sha256::digest(bytes).as_slice() != checksum {
        return Err(SegmentFault::Checksum);
    }
    let payload = bytes
        .strip_prefix(MAGIC.as_slice())
        .ok_or_else(|| SegmentFault::Format("bad magic".into()))?;
    let raw = lz4_flex::decompress_size_prepended(payload)
        .map_err(|e| SegmentFault::Format(e.to_string()))?;
    let body =
        SegmentBody::decode(raw.as_slice()).map_err(|e| SegmentFault::Format(e.to_string()))?;
    if body.conversation_id != conversation.get() {
        return Err(SegmentFault::WrongConversation {
            expected: conversation.get(),
            found: body.conversation_id,
        });
    }
    Ok(body
        .messages
        .into_iter()
        .map(|m| (m.seq, m.record.unwrap_or_default()))
        .collect())
}

/// The object key of a segment: grouped by tenant and conversation (so a
/// tenant's objects list under one prefix), then seq range and content.
pub fn object_key(
    tenant: TenantId,
    conversation: ConversationId,
    first: u64,
    last: u64,
    checksum: &[u8],
) -> String {
    let digest: String = checksum[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("segments/t{tenant}/c{conversation}/{first:020}-{last:020}-{digest}.seg")
}

/// The UTC day of a timestamp (segments do not span days, so retention
/// deletes whole segments).
pub fn day_of(ts_ms: u64) -> u64 {
    ts_ms / 86_400_000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(seq: u64) -> (u64, MessageRecord) {
        let record = MessageRecord {
            msg_id: seq * 10,
            sender_id: 1,
            body: format!("message {seq}").into_bytes(),
            server_ts_ms: 1_000 + seq,
            ..Default::default()
        };
        (seq, record)
    }

    #[test]
    fn a_segment_round_trips_and_is_named_by_its_content() {
        let messages: Vec<_> = (1..=50).map(message).collect();
        let encoded = encode(TenantId(3), ConversationId(9), &messages);
        assert_eq!(
            decode(&encoded.bytes, &encoded.checksum, ConversationId(9)).unwrap(),
            messages
        );
        let again = encode(TenantId(3), ConversationId(9), &messages);
        assert_eq!(again.bytes, encoded.bytes);
        let other = encode(TenantId(3), ConversationId(9), &messages[..49]);
        let key = |e: &Encoded| object_key(TenantId(3), ConversationId(9), 1, 50, &e.checksum);
        assert_eq!(key(&again), key(&encoded));
        assert_ne!(key(&other), key(&encoded));
        assert!(key(&encoded).starts_with("segments/t3/c9/"));
    }

    #[test]
    fn damaged_or_misplaced_bytes_are_refused() {
        let encoded = encode(TenantId(3), ConversationId(9), &[message(1)]);
        let mut damaged = encoded.bytes.clone();
        let last = damaged.len() - 1;
        damaged[last] ^= 1;
        assert_eq!(
            decode(&damaged, &encoded.checksum, ConversationId(9)),
            Err(SegmentFault::Checksum)
        );
        assert!(matches!(
            decode(&encoded.bytes, &encoded.checksum, ConversationId(10)),
            Err(SegmentFault::WrongConversation { .. })
        ));
        let junk = b"not a segment".to_vec();
        let sum = Sha256::digest(&junk).to_vec();
        assert!(matches!(
            decode(&junk, &sum, ConversationId(9)),
            Err(SegmentFault::Format(_))
        ));
    }
}
