//! Every RocksDB key a cell writes, in one place. Integers are big-endian so
//! that byte order is numeric order: a conversation's messages sort by seq,
//! its members by user id, and a range scan is a key range. Per-user keys
//! start with the tenant ([`user`]): user ids overlap between tenants.

use cellmesh_proto::ids::{ConversationId, Seq, TenantId, UserId};

use crate::user::UserKey;

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
    /// tenant | user | pts → `SyncRecord`: each user's sync queue
    pub const SYNC: &str = "sync";
    /// tenant | user | conversation → `ConvListEntry`
    pub const CONV_LIST: &str = "conv_list";
    /// tenant | user | conversation → muted flag (1 byte)
    pub const MUTED: &str = "muted";
    /// tenant | user | device id → cursor pts (u64, merged with max)
    pub const DEVICE_CURSOR: &str = "device_cursor";
    /// notification batch id → `NotificationBatch`
    pub const NOTIFY: &str = "notify_batch";
    /// forward id → `ForwardRecord`: events for users homed in other cells
    pub const FORWARD: &str = "forward";
    /// tenant | user → the identity (u64) of their sync queue here: pts
    /// count in it
    pub const QUEUE_ID: &str = "queue_id";
    /// tenant | conversation → the high-water mark other cells pushed here
    /// (u64, merged with max): the floor of a failover to this cell
    pub const HIGH_WATER_MARKS: &str = "high_water_marks";
    /// conversation id | seq_start → `SegmentEntry`: the cold tier's
    /// manifest
    pub const MANIFEST: &str = "manifest";
    /// tenant | upload id → `UploadRecord`: files reserved, completed,
    /// or waiting to be deleted
    pub const UPLOADS: &str = "uploads";

    pub const ALL: [&str; 21] = [
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
        HIGH_WATER_MARKS,
        MANIFEST,
        UPLOADS,
    ];
}

/// Keys of the `meta` column family.
pub mod meta {
    use cellmesh_proto::ids::{ConversationId, TenantId};

    /// Time (ms) up to which message ids may have been issued.
    pub const MSG_ID_RESERVED_UNTIL: &[u8] = b"msg_id_reserved_until_ms";
    /// Highest outbox id the outbox no longer needs: published to Kafka by
    /// the relay, or, on the embedded queue, processed by every group.
    pub const RELAY_CURSOR: &[u8] = b"relay_cursor";
    /// Highest notification id issued.
    pub const NOTIFY_LAST_ID: &[u8] = b"notify_last_id";
    /// Highest forward id issued (the homes' queue).
    pub const FORWARD_LAST_ID: &[u8] = b"forward_last_id";
    /// Highest forward id issued in the standbys' queue.
    pub const STANDBY_FORWARD_LAST_ID: &[u8] = b"standby_forward_last_id";
    /// The layout of the keys in this database (see [`super::FORMAT`]).
    pub const STORAGE_FORMAT: &[u8] = b"storage_format";
    /// The search index's first build: the last conversation it indexed
    /// (`u64::MAX`: done).
    pub const SEARCH_BUILT_THROUGH: &[u8] = b"search_built_through";

    /// A conversation whose history below its failover floor was copied
    /// back from the failed cell (value: the last seq copied).
    pub fn backfilled(conversation: ConversationId) -> Vec<u8> {
        [b"backfilled/".as_slice(), &conversation.to_be_bytes()].concat()
    }

    /// The failover floor a conversation's history below it is whole to
    /// (value): a takeover at a higher floor waits for its own backfill.
    /// Written beside [`backfilled`], which releases before 0.3.0 read.
    pub fn backfilled_floor(conversation: ConversationId) -> Vec<u8> {
        [b"backfilled-floor/".as_slice(), &conversation.to_be_bytes()].concat()
    }

    /// A conversation of another cell whose new messages this standby has
    /// stored synchronously since this seq (value), each before its owner
    /// acknowledged it (replication mode `sync`).
    pub fn replica_from(conversation: ConversationId) -> Vec<u8> {
        [b"replica_from/".as_slice(), &conversation.to_be_bytes()].concat()
    }

    /// A conversation (`b'c'`) or user home (`b'u'`) of `tenant` this cell
    /// handed over by a move: the value is when the source was sealed (ms),
    /// for cleanup after the grace period.
    pub fn moved(kind: u8, tenant: TenantId, id: u64) -> Vec<u8> {
        [MOVED, &[kind], &tenant.to_be_bytes(), &id.to_be_bytes()].concat()
    }

    /// A segment object uploaded for `conversation` at `seq_start` whose
    /// manifest entry may not have committed (value: when, ms); the entry's
    /// commit removes it, the sweep deletes the object of one left behind.
    pub fn tier_pending(conversation: ConversationId, seq_start: u64, object: &str) -> Vec<u8> {
        [
            TIER_PENDING,
            &conversation.to_be_bytes(),
            &seq_start.to_be_bytes(),
            object.as_bytes(),
        ]
        .concat()
    }

    /// Prefix of [`tier_pending`] keys.
    pub const TIER_PENDING: &[u8] = b"tier_pending/";

    /// Prefix of [`moved`] keys.
    pub const MOVED: &[u8] = b"moved/";

    /// How many times existing messages of a conversation were rewritten
    /// (recall, edit): a migration re-verifies old history only if it moved.
    pub fn rewrites(conversation: ConversationId) -> Vec<u8> {
        [REWRITES, &conversation.to_be_bytes()].concat()
    }

    /// Prefix of [`rewrites`] keys.
    pub const REWRITES: &[u8] = b"rewrites/";

    /// An open upload of `conversation` (reserved, or completed and not
    /// sent yet; the value is its state): what a move carries to the new
    /// owner.
    pub fn open_upload(conversation: ConversationId, id: u64) -> Vec<u8> {
        [open_uploads_of(conversation).as_slice(), &id.to_be_bytes()].concat()
    }

    /// The prefix of `conversation`'s [`open_upload`] keys.
    pub fn open_uploads_of(conversation: ConversationId) -> Vec<u8> {
        [OPEN_UPLOADS, &conversation.get().to_be_bytes()].concat()
    }

    /// Prefix of [`open_upload`] keys.
    pub const OPEN_UPLOADS: &[u8] = b"open_upload/";

    /// Set once every open upload record has its [`open_upload`] key
    /// (stores written before those keys existed get them at start).
    pub const OPEN_UPLOADS_INDEXED: &[u8] = b"open_uploads_indexed";
}

/// The key layout this code reads and writes. 1: per-user keys started
/// with the user id alone; 2: with the tenant, then the user.
pub const FORMAT: u64 = 2;

/// What an idempotency record answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum IdemKind {
    Send = 1,
    CreateConversation = 2,
    CreateUpload = 3,
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

/// `messages` (and `manifest`: a segment by its first seq) key.
pub fn message(conversation: ConversationId, seq: Seq) -> [u8; 16] {
    pair_key(conversation.get(), seq.get())
}

/// `members` and `read_state` key.
pub fn member(conversation: ConversationId, user: UserId) -> [u8; 16] {
    pair_key(conversation.get(), user.get())
}

/// `uploads` key: a tenant's upload `id`.
pub fn upload(tenant: TenantId, id: u64) -> [u8; 16] {
    pair_key(tenant.get(), id)
}

/// `hidden` key.
pub fn hidden(conversation: ConversationId, user: UserId, seq: Seq) -> [u8; 24] {
    triple_key(conversation.get(), user.get(), seq.get())
}

/// `idempotency` key.
pub fn idempotency(kind: IdemKind, tenant: TenantId, user: UserId, client_req_id: &str) -> Vec<u8> {
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

/// The 16-byte prefix of every key of `user`'s own state (sync queue,
/// conversation list, mute flags, device cursors, queue id).
pub fn user(user: UserKey) -> [u8; 16] {
    pair_key(user.tenant.get(), user.user.get())
}

/// `sync` (item: pts), `conv_list` and `muted` (item: conversation) key.
pub fn user_item(user: UserKey, item: u64) -> [u8; 24] {
    triple_key(user.tenant.get(), user.user.get(), item)
}

/// The key range `[from, to)` of `user`'s items in `sync`, `conv_list`
/// or `muted`.
pub fn user_items(user: UserKey) -> ([u8; 24], [u8; 24]) {
    (user_item(user, 0), user_item(user, u64::MAX))
}

/// `device_cursor` key.
pub fn device(user: UserKey, device: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(16 + device.len());
    k.extend_from_slice(&self::user(user));
    k.extend_from_slice(device.as_bytes());
    k
}

/// The device id of a `device_cursor` key.
pub fn device_of(key: &[u8]) -> Option<&[u8]> {
    key.get(16..)
}

/// The key range `[from, to)` of all of `user`'s device cursors.
pub fn devices_of(user: UserKey) -> (Vec<u8>, Vec<u8>) {
    let from = self::user(user).to_vec();
    let to = match user.user.get().checked_add(1) {
        Some(next) => pair_key(user.tenant.get(), next).to_vec(),
        None => {
            let mut to = user.tenant.to_be_bytes().to_vec();
            to.extend_from_slice(&[0xff; 9]);
            to
        }
    };
    (from, to)
}

/// The key range `[from, to)` of every key that starts with `id`.
pub fn prefixed_by(id: u64) -> (Vec<u8>, Vec<u8>) {
    let to = match id.checked_add(1) {
        Some(next) => next.to_be_bytes().to_vec(),
        None => vec![0xff; 9],
    };
    (id.to_be_bytes().to_vec(), to)
}

/// The u64 a key starts with.
pub fn first_u64(key: &[u8]) -> Option<u64> {
    decode_u64(key.get(..8)?)
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
        let (c1, c2) = (ConversationId(1), ConversationId(2));
        assert!(message(c1, Seq(255)) < message(c1, Seq(256)));
        assert!(message(c1, Seq(u64::MAX)) < message(c2, Seq(0)));
        let c = ConversationId(5);
        assert!(hidden(c, UserId(9), Seq(1)) < hidden(c, UserId(9), Seq(2)));
        assert!(hidden(c, UserId(9), Seq(u64::MAX)) < hidden(c, UserId(10), Seq(0)));
    }

    #[test]
    fn trailing_integer_round_trips() {
        assert_eq!(last_u64(&message(ConversationId(3), Seq(42))), Some(42));
        assert_eq!(
            last_u64(&hidden(ConversationId(3), UserId(4), Seq(77))),
            Some(77)
        );
        assert_eq!(last_u64(b"short"), None);
        assert_eq!(decode_u64(&9u64.to_be_bytes()), Some(9));
        assert_eq!(decode_u64(b"bad"), None);
    }

    #[test]
    fn user_keys_separate_tenants_with_the_same_user_id() {
        let (a, b) = (
            UserKey::new(TenantId(1), UserId(2)),
            UserKey::new(TenantId(2), UserId(2)),
        );
        assert_ne!(user_item(a, 7), user_item(b, 7));
        assert_ne!(device(a, "phone"), device(b, "phone"));
        let (from, to) = user_items(a);
        assert!(from.as_slice() <= user_item(a, 7).as_slice());
        assert!(user_item(b, 0).as_slice() >= to.as_slice());
        let (from, to) = devices_of(a);
        let key = device(a, "phone");
        assert!(from <= key && key < to);
        let other = device(b, "phone");
        assert!(!(from <= other && other < to));
        // The next user of the same tenant is outside the range too.
        let next = device(UserKey::new(TenantId(1), UserId(3)), "");
        assert!(next >= to);
        assert_eq!(device_of(&key), Some(b"phone".as_slice()));
    }

    #[test]
    fn idempotency_keys_separate_kind_tenant_and_user() {
        let a = idempotency(IdemKind::Send, TenantId(1), UserId(2), "r");
        assert_ne!(
            a,
            idempotency(IdemKind::CreateConversation, TenantId(1), UserId(2), "r")
        );
        assert_ne!(a, idempotency(IdemKind::Send, TenantId(2), UserId(2), "r"));
        assert_ne!(a, idempotency(IdemKind::Send, TenantId(1), UserId(3), "r"));
    }
}
