//! The lines of a tenant export, one type per file: a conversation (its
//! record, members, seq marks and floor jumps) in `conversations.jsonl` and
//! a message in `messages.jsonl`. Written by [`super::export`], read back
//! by [`super::import`]: one definition, so what is written is what a
//! restore reads. Bodies are UTF-8 text, or base64 when they are not.

use base64::Engine as _;
use cellmesh_proto::storage::v1::{ConversationRecord, ConversationSeq, MessageRecord, SeqJump};
use cellmesh_proto::v1::AttachmentRef;
use serde::{Deserialize, Serialize};

/// One conversation of the export.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConversationLine {
    pub conversation: u64,
    pub tenant: u64,
    pub kind: i32,
    pub title: String,
    pub created_by: u64,
    pub created_at_ms: u64,
    pub admins: Vec<u64>,
    pub members: Vec<u64>,
    pub latest_seq: u64,
    pub seq_floor: u64,
    /// Seq ranges skipped on purpose (failovers, restores): `[first, last,
    /// epoch, reason]`. Absent in exports written before they were kept.
    #[serde(default)]
    pub jumps: Vec<[u64; 4]>,
}

impl ConversationLine {
    pub fn new(
        conversation: u64,
        record: &ConversationRecord,
        members: Vec<u64>,
        seq: &ConversationSeq,
    ) -> Self {
        Self {
            conversation,
            tenant: record.tenant_id,
            kind: record.kind,
            title: record.title.clone(),
            created_by: record.created_by,
            created_at_ms: record.created_at_ms,
            admins: record.admins.clone(),
            members,
            latest_seq: seq.latest_seq,
            seq_floor: seq.seq_floor,
            jumps: seq
                .jumps
                .iter()
                .map(|j| [j.first, j.last, j.epoch, j.reason as u64])
                .collect(),
        }
    }

    /// The record as `tenant` holds it.
    pub fn record(&self, tenant: u64) -> ConversationRecord {
        ConversationRecord {
            tenant_id: tenant,
            kind: self.kind,
            title: self.title.clone(),
            created_by: self.created_by,
            created_at_ms: self.created_at_ms,
            member_count: self.members.len() as u32,
            admins: self.admins.clone(),
        }
    }

    /// The seq marks, with `latest` the highest seq restored.
    pub fn seq(&self, latest: u64) -> ConversationSeq {
        ConversationSeq {
            latest_seq: latest.max(self.latest_seq),
            seq_floor: self.seq_floor,
            jumps: self
                .jumps
                .iter()
                .map(|&[first, last, epoch, reason]| SeqJump {
                    first,
                    last,
                    epoch,
                    reason: reason as i32,
                })
                .collect(),
        }
    }
}

/// A file a message carries (its bytes stay where they were uploaded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentLine {
    pub id: u64,
    pub name: String,
    pub content_type: String,
    pub size: u64,
    pub sha256: String,
    pub object_key: String,
    #[serde(default)]
    pub region: String,
    #[serde(default)]
    pub width: u32,
    #[serde(default)]
    pub height: u32,
    #[serde(default)]
    pub thumbnail_key: String,
}

/// One message of the export.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageLine {
    pub conversation: u64,
    pub seq: u64,
    pub msg_id: u64,
    pub sender: u64,
    #[serde(rename = "type")]
    pub kind: i32,
    pub ts_ms: u64,
    pub state: i32,
    pub edited_at_ms: u64,
    pub edit_version: u32,
    pub visible_to: Vec<u64>,
    pub client_req_id: String,
    pub attachments: Vec<AttachmentLine>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_base64: Option<String>,
}

impl MessageLine {
    pub fn new(conversation: u64, seq: u64, m: &MessageRecord) -> Self {
        let (body, body_base64) = match std::str::from_utf8(&m.body) {
            Ok(text) => (Some(text.to_string()), None),
            Err(_) => (
                None,
                Some(base64::engine::general_purpose::STANDARD.encode(&m.body)),
            ),
        };
        Self {
            conversation,
            seq,
            msg_id: m.msg_id,
            sender: m.sender_id,
            kind: m.r#type,
            ts_ms: m.server_ts_ms,
            state: m.state,
            edited_at_ms: m.edited_at_ms,
            edit_version: m.edit_version,
            visible_to: m.visible_to.clone(),
            client_req_id: m.client_req_id.clone(),
            attachments: m
                .attachments
                .iter()
                .map(|a| AttachmentLine {
                    id: a.attachment_id,
                    name: a.name.clone(),
                    content_type: a.content_type.clone(),
                    size: a.size,
                    sha256: a.sha256.clone(),
                    object_key: a.object_key.clone(),
                    region: a.region.clone(),
                    width: a.width,
                    height: a.height,
                    thumbnail_key: a.thumbnail_key.clone(),
                })
                .collect(),
            body,
            body_base64,
        }
    }

    /// The stored message again; `None` when its base64 body is damaged.
    pub fn record(&self) -> Option<MessageRecord> {
        let body = match (&self.body, &self.body_base64) {
            (Some(text), _) => text.clone().into_bytes(),
            (None, Some(b64)) => base64::engine::general_purpose::STANDARD.decode(b64).ok()?,
            (None, None) => Vec::new(),
        };
        Some(MessageRecord {
            msg_id: self.msg_id,
            sender_id: self.sender,
            r#type: self.kind,
            body,
            server_ts_ms: self.ts_ms,
            state: self.state,
            edited_at_ms: self.edited_at_ms,
            edit_version: self.edit_version,
            visible_to: self.visible_to.clone(),
            client_req_id: self.client_req_id.clone(),
            attachments: self
                .attachments
                .iter()
                .map(|a| AttachmentRef {
                    attachment_id: a.id,
                    name: a.name.clone(),
                    content_type: a.content_type.clone(),
                    size: a.size,
                    sha256: a.sha256.clone(),
                    object_key: a.object_key.clone(),
                    region: a.region.clone(),
                    width: a.width,
                    height: a.height,
                    thumbnail_key: a.thumbnail_key.clone(),
                })
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_reads_back_as_written_text_or_binary() {
        for body in [b"hello".to_vec(), vec![0xff, 0x00, 0x80]] {
            let m = MessageRecord {
                msg_id: 7,
                sender_id: 3,
                body,
                server_ts_ms: 9,
                visible_to: vec![4],
                client_req_id: "r".into(),
                attachments: vec![AttachmentRef {
                    attachment_id: 5,
                    name: "a.png".into(),
                    size: 10,
                    width: 4,
                    object_key: "k".into(),
                    thumbnail_key: "t".into(),
                    ..Default::default()
                }],
                ..Default::default()
            };
            let line = serde_json::to_string(&MessageLine::new(1, 2, &m)).unwrap();
            let back: MessageLine = serde_json::from_str(&line).unwrap();
            assert_eq!(back.record().unwrap(), m, "{line}");
        }
    }

    #[test]
    fn a_damaged_binary_body_is_refused() {
        let mut line = MessageLine::new(1, 2, &MessageRecord::default());
        line.body = None;
        line.body_base64 = Some("not base64!".into());
        assert!(line.record().is_none());
    }
}
