//! Every RocksDB key a cell writes, in one place. Integers are big-endian so
//! that byte order is numeric order: a conversation's messages sort by seq,
//! its members by user id, and a range scan is a key range.

/// Column families, one per record kind.
pub mod cf {
    /// conversation id → `ConversationRecord`
    pub const CONVERSATIONS: &str = "conversations";
    /// conversation id → `ConversationSeq` (rewritten by every send)
    pub const CONV_SEQ: &str = "conv_seq";
    /// conversation id | user id → `MemberRecord`
    pub const MEMBERS: &str = "members";
    /// conversation id | seq → `MessageRecord`
    pub const MESSAGES: &str = "messages";
    /// kind | tenant | user | client_req_id → `IdempotencyRecord`
    pub const IDEMPOTENCY: &str = "idempotency";
    /// conversation id | user id → read seq (u64, merged with max)
    pub const READ_STATE: &str = "read_state";
    /// conversation id | user id | seq → empty: the delete-for-me overlay
    pub const HIDDEN: &str = "hidden";
    /// outbox id → `OutboxEvent`, consumed by the fan-out relay
    pub const OUTBOX: &str = "outbox";
    /// named cell-level values (see [`super::meta`])
    pub const META: &str = "meta";
    /// partition (u32) | offset → `QueuedEvent`: the embedded event log
    pub const QUEUE: &str = "queue";
    /// consumer group | 0 | partition (u32) → last processed offset
    pub const QUEUE_OFFSETS: &str = "queue_offsets";
    /// user | pts → `SyncRecord`: each user's sync queue
    pub const SYNC: &str = "sync";
    /// user | conversation → `ConvListEntry`
    pub const CONV_LIST: &str = "conv_list";
    /// user | conversation → muted flag (1 byte)
    pub const MUTED: &str = "muted";
    /// user | device id → cursor pts (u64, merged with max)
    pub const DEVICE_CURSOR: &str = "device_cursor";
    /// notification batch id → `NotificationBatch`
    pub const NOTIFY: &str = "notify_batch";
    /// forward id → `ForwardRecord`: events for users homed in other cells
    pub const FORWARD: &str = "forward";
    /// user → the identity (u64) of their sync queue here: pts count in it
    pub const QUEUE_ID: &str = "queue_id";

    pub const ALL: [&str; 18] = [
        CONVERSATIONS,
        CONV_SEQ,
        MEMBERS,
        MESSAGES,
        IDEMPOTENCY,
        READ_STATE,
        HIDDEN,
        OUTBOX,
        META,
        QUEUE,
        QUEUE_OFFSETS,
        SYNC,
        CONV_LIST,
        MUTED,
        DEVICE_CURSOR,
        NOTIFY,
        FORWARD,
        QUEUE_ID,
    ];
}

/// Keys of the `meta` column family.
pub mod meta {
    /// Time (ms) up to which message ids may have been issued.
    pub const MSG_ID_RESERVED_UNTIL: &[u8] = b"msg_id_reserved_until_ms";
    /// Highest outbox id the relay has published to the queue.
    pub const RELAY_CURSOR: &[u8] = b"relay_cursor";
    /// Highest notification id issued.
    pub const NOTIFY_LAST_ID: &[u8] = b"notify_last_id";
    /// Highest forward id issued.
    pub const FORWARD_LAST_ID: &[u8] = b"forward_last_id";

    /// A conversation whose history below its failover floor was copied
    /// back from the failed cell (value: the last seq copied).
    pub fn backfilled(conversation: u64) -> Vec<u8> {
        [b"backfilled/".as_slice(), &conversation.to_be_bytes()].concat()
    }

    /// A conversation (`b'c'`) or user home (`b'u'`) this cell handed over
    /// by a move: the value is the tenant and when the source was sealed
    /// (ms), for cleanup after the grace period.
    pub fn moved(kind: u8, id: u64) -> Vec<u8> {
        [b"moved/".as_slice(), &[kind], &id.to_be_bytes()].concat()
    }

    /// How many times existing messages of a conversation were rewritten
    /// (recall, edit): a migration re-verifies old history only if it moved.
    pub fn rewrites(conversation: u64) -> Vec<u8> {
        [b"rewrites/".as_slice(), &conversation.to_be_bytes()].concat()
    }
}

/// What an idempotency record answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum IdemKind {
    Send = 1,
    CreateConversation = 2,
}

pub fn u64_key(a: u64) -> [u8; 8] {
    a.to_be_bytes()
}

pub fn pair_key(a: u64, b: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&a.to_be_bytes());
    k[8..].copy_from_slice(&b.to_be_bytes());
    k
}

pub fn triple_key(a: u64, b: u64, c: u64) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..8].copy_from_slice(&a.to_be_bytes());
    k[8..16].copy_from_slice(&b.to_be_bytes());
    k[16..].copy_from_slice(&c.to_be_bytes());
    k
}

/// `messages` / `members` / `read_state` key.
pub fn conv_item(conversation: u64, item: u64) -> [u8; 16] {
    pair_key(conversation, item)
}

/// `hidden` key.
pub fn hidden(conversation: u64, user: u64, seq: u64) -> [u8; 24] {
    triple_key(conversation, user, seq)
}

/// `idempotency` key.
pub fn idempotency(kind: IdemKind, tenant: u64, user: u64, client_req_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(17 + client_req_id.len());
    k.push(kind as u8);
    k.extend_from_slice(&tenant.to_be_bytes());
    k.extend_from_slice(&user.to_be_bytes());
    k.extend_from_slice(client_req_id.as_bytes());
    k
}

/// `queue` key.
pub fn queue(partition: u32, offset: u64) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..4].copy_from_slice(&partition.to_be_bytes());
    k[4..].copy_from_slice(&offset.to_be_bytes());
    k
}

/// `queue_offsets` key.
pub fn queue_offset(group: &str, partition: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(group.len() + 5);
    k.extend_from_slice(group.as_bytes());
    k.push(0);
    k.extend_from_slice(&partition.to_be_bytes());
    k
}

/// `device_cursor` key.
pub fn device(user: u64, device: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + device.len());
    k.extend_from_slice(&user.to_be_bytes());
    k.extend_from_slice(device.as_bytes());
    k
}

/// The key range `[from, to)` of every key that starts with `id`.
pub fn prefixed_by(id: u64) -> (Vec<u8>, Vec<u8>) {
    let to = match id.checked_add(1) {
        Some(next) => next.to_be_bytes().to_vec(),
        None => vec![0xff; 9],
    };
    (id.to_be_bytes().to_vec(), to)
}

/// The key range `[from, to)` of all of `user`'s device cursors.
pub fn devices_of(user: u64) -> (Vec<u8>, Vec<u8>) {
    prefixed_by(user)
}

/// The trailing u64 of a key (seq in `messages`/`hidden`, user in `members`).
pub fn last_u64(key: &[u8]) -> Option<u64> {
    let tail = key.len().checked_sub(8).map(|at| &key[at..])?;
    Some(u64::from_be_bytes(tail.try_into().ok()?))
}

pub fn decode_u64(value: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(value.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_numerically() {
        assert!(conv_item(1, 255) < conv_item(1, 256));
        assert!(conv_item(1, u64::MAX) < conv_item(2, 0));
        assert!(hidden(5, 9, 1) < hidden(5, 9, 2));
        assert!(hidden(5, 9, u64::MAX) < hidden(5, 10, 0));
    }

    #[test]
    fn trailing_integer_round_trips() {
        assert_eq!(last_u64(&conv_item(3, 42)), Some(42));
        assert_eq!(last_u64(&hidden(3, 4, 77)), Some(77));
        assert_eq!(last_u64(b"short"), None);
        assert_eq!(decode_u64(&9u64.to_be_bytes()), Some(9));
        assert_eq!(decode_u64(b"bad"), None);
    }

    #[test]
    fn idempotency_keys_separate_kind_tenant_and_user() {
        let a = idempotency(IdemKind::Send, 1, 2, "r");
        assert_ne!(a, idempotency(IdemKind::CreateConversation, 1, 2, "r"));
        assert_ne!(a, idempotency(IdemKind::Send, 2, 2, "r"));
        assert_ne!(a, idempotency(IdemKind::Send, 1, 3, "r"));
    }
}
