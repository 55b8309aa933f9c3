//! The key layout a database was written in, and upgrading it on open.
//!
//! Format 1 keyed each user's own state (sync queue, conversation list,
//! mute flags, device cursors, queue id, moved-home marks) by the user id
//! alone, so the same id in two tenants shared one queue. Format 2
//! ([`keys::FORMAT`]) starts those keys with the tenant. A format-1
//! database is rewritten in one synced batch when it is opened: each record
//! goes to the tenant of the conversation it is about; a record whose
//! conversation is not stored here goes to the user's only tenant (from the
//! conversations they are a member of here), or the store's only tenant.
//! A record that none of these attributes refuses the open with
//! [`StorageError::Format`], naming the user, before anything is written.

use cellmesh_proto::ids::{TenantId, UserId};
use std::collections::{BTreeSet, HashMap};

use cellmesh_proto::storage::v1::{ConversationRecord, SyncRecord};
use prost::Message as _;
use rocksdb::{DB, IteratorMode, WriteBatch, WriteOptions};

use super::keys::{self, cf};
use super::{Result, StorageError, corrupt};
use crate::user::UserKey;

/// Brings the database at `db` to [`keys::FORMAT`], or refuses it.
pub(super) fn ensure(db: &DB) -> Result<()> {
    match read_u64(db, cf::META, keys::meta::STORAGE_FORMAT)? {
        Some(keys::FORMAT) => Ok(()),
        Some(found) => Err(StorageError::Format(format!(
            "the data dir holds storage format {found}; this build reads format {} \
             (run the release that wrote it, or start from an empty data dir)",
            keys::FORMAT
        ))),
        None => {
            let mut batch = WriteBatch::default();
            let upgraded = upgrade_v1(db, &mut batch)?;
            batch.put_cf(
                handle(db, cf::META),
                keys::meta::STORAGE_FORMAT,
                keys::FORMAT.to_be_bytes(),
            );
            let mut opts = WriteOptions::default();
            opts.set_sync(true);
            db.write_opt(batch, &opts)?;
            if upgraded > 0 {
                tracing::info!(
                    records = upgraded,
                    "storage upgraded to per-tenant user keys"
                );
            }
            Ok(())
        }
    }
}

/// Who each user and conversation belongs to, as far as this store knows.
struct Tenancy {
    conversations: HashMap<u64, u64>,
    /// The tenants of the conversations each user is a member of here.
    users: HashMap<u64, BTreeSet<u64>>,
    tenants: BTreeSet<u64>,
}

impl Tenancy {
    fn load(db: &DB) -> Result<Self> {
        let mut conversations = HashMap::new();
        for item in db.iterator_cf(handle(db, cf::CONVERSATIONS), IteratorMode::Start) {
            let (key, value) = item?;
            let id = keys::decode_u64(&key).ok_or_else(|| corrupt(cf::CONVERSATIONS, "key"))?;
            let record = ConversationRecord::decode(value.as_ref())
                .map_err(|e| corrupt(cf::CONVERSATIONS, e))?;
            conversations.insert(id, record.tenant_id);
        }
        let mut users: HashMap<u64, BTreeSet<u64>> = HashMap::new();
        for item in db.iterator_cf(handle(db, cf::MEMBERS), IteratorMode::Start) {
            let (key, _) = item?;
            let (conversation, user) =
                split_pair(&key).ok_or_else(|| corrupt(cf::MEMBERS, "key"))?;
            if let Some(tenant) = conversations.get(&conversation) {
                users.entry(user).or_default().insert(*tenant);
            }
        }
        let tenants = conversations.values().copied().collect();
        Ok(Self {
            conversations,
            users,
            tenants,
        })
    }

    /// The tenants a record of `user` belongs to: that of `conversation`
    /// when it is known here, else the user's or the store's only tenant.
    fn of(&self, user: UserId, conversation: Option<u64>) -> Result<Vec<u64>> {
        if let Some(tenant) = conversation.and_then(|c| self.conversations.get(&c)) {
            return Ok(vec![*tenant]);
        }
        let only = |set: &BTreeSet<u64>| (set.len() == 1).then(|| set.iter().copied().collect());
        if conversation.is_none()
            && let Some(known) = self.users.get(&user.get()).filter(|s| !s.is_empty())
        {
            // State of the user as a whole (cursors, queue id): every
            // tenant they have records in keeps a copy.
            return Ok(known.iter().copied().collect());
        }
        if let Some(tenants) = self.users.get(&user.get()).and_then(only) {
            return Ok(tenants);
        }
        if let Some(tenants) = only(&self.tenants) {
            return Ok(tenants);
        }
        Err(StorageError::Format(format!(
            "storage format 1 holds state of user {user} that cannot be attributed to a \
             tenant (the store has tenants {:?}); move that user's home off this cell with \
             the release that wrote it, or start this cell from an empty data dir",
            self.tenants
        )))
    }
}

/// Rewrites every format-1 key into `batch`; how many records it moved.
fn upgrade_v1(db: &DB, batch: &mut WriteBatch) -> Result<u64> {
    let per_user = [
        cf::SYNC,
        cf::CONV_LIST,
        cf::MUTED,
        cf::DEVICE_CURSOR,
        cf::QUEUE_ID,
    ];
    let has_moved = moved_marks(db).next().is_some();
    let empty = |name| {
        db.iterator_cf(handle(db, name), IteratorMode::Start)
            .next()
            .is_none()
    };
    if !has_moved && per_user.into_iter().all(empty) {
        return Ok(0);
    }
    let tenancy = Tenancy::load(db)?;
    let mut moved = 0;
    // A user's own records first, so their tenants are known for the
    // cursors and queue id that name no conversation.
    let mut seen: HashMap<u64, BTreeSet<u64>> = HashMap::new();
    for name in [cf::SYNC, cf::CONV_LIST, cf::MUTED] {
        for item in db.iterator_cf(handle(db, name), IteratorMode::Start) {
            let (key, value) = item?;
            let (user, item) = split_pair(&key).ok_or_else(|| corrupt(name, "format-1 key"))?;
            let conversation = match name {
                cf::SYNC => {
                    SyncRecord::decode(value.as_ref())
                        .map_err(|e| corrupt(name, e))?
                        .conversation_id
                }
                _ => item,
            };
            for tenant in tenancy.of(UserId(user), Some(conversation))? {
                seen.entry(user).or_default().insert(tenant);
                let new = keys::user_item(UserKey::new(TenantId(tenant), UserId(user)), item);
                batch.put_cf(handle(db, name), new, &value);
            }
            batch.delete_cf(handle(db, name), &key);
            moved += 1;
        }
    }
    let tenants_of = |user: u64| -> Result<Vec<u64>> {
        match seen.get(&user) {
            Some(tenants) => Ok(tenants.iter().copied().collect()),
            None => tenancy.of(UserId(user), None),
        }
    };
    for item in db.iterator_cf(handle(db, cf::DEVICE_CURSOR), IteratorMode::Start) {
        let (key, value) = item?;
        let (user, device) = key
            .split_at_checked(8)
            .and_then(|(u, d)| Some((keys::decode_u64(u)?, d)))
            .ok_or_else(|| corrupt(cf::DEVICE_CURSOR, "format-1 key"))?;
        let device = String::from_utf8_lossy(device);
        for tenant in tenants_of(user)? {
            let new = keys::device(UserKey::new(TenantId(tenant), UserId(user)), &device);
            batch.put_cf(handle(db, cf::DEVICE_CURSOR), new, &value);
        }
        batch.delete_cf(handle(db, cf::DEVICE_CURSOR), &key);
        moved += 1;
    }
    for item in db.iterator_cf(handle(db, cf::QUEUE_ID), IteratorMode::Start) {
        let (key, value) = item?;
        let user = keys::decode_u64(&key).ok_or_else(|| corrupt(cf::QUEUE_ID, "format-1 key"))?;
        for tenant in tenants_of(user)? {
            let new = keys::user(UserKey::new(TenantId(tenant), UserId(user)));
            batch.put_cf(handle(db, cf::QUEUE_ID), new, &value);
        }
        batch.delete_cf(handle(db, cf::QUEUE_ID), &key);
        moved += 1;
    }
    // Moved marks: `moved/kind id` → tenant | sealed at, now
    // `moved/kind tenant id` → sealed at.
    for item in moved_marks(db) {
        let (key, value) = item?;
        let rest = &key[keys::meta::MOVED.len()..];
        let bad = || corrupt(cf::META, "format-1 moved mark");
        let (kind, id) = rest.split_first().ok_or_else(bad)?;
        let id = keys::decode_u64(id).ok_or_else(bad)?;
        let (tenant, at) = value.split_at_checked(8).ok_or_else(bad)?;
        let tenant = keys::decode_u64(tenant).ok_or_else(bad)?;
        batch.put_cf(
            handle(db, cf::META),
            keys::meta::moved(*kind, TenantId(tenant), id),
            at,
        );
        batch.delete_cf(handle(db, cf::META), &key);
        moved += 1;
    }
    Ok(moved)
}

/// The `moved/` entries of the meta family.
fn moved_marks(db: &DB) -> impl Iterator<Item = Result<super::KeyValue>> + '_ {
    let from = IteratorMode::From(keys::meta::MOVED, rocksdb::Direction::Forward);
    db.iterator_cf(handle(db, cf::META), from)
        .map(|item| item.map_err(StorageError::from))
        .take_while(|item| {
            item.as_ref()
                .map_or(true, |(key, _)| key.starts_with(keys::meta::MOVED))
        })
}

fn handle<'a>(db: &'a DB, name: &'static str) -> &'a rocksdb::ColumnFamily {
    db.cf_handle(name)
        .expect("every column family is created at open")
}

fn read_u64(db: &DB, name: &'static str, key: &[u8]) -> Result<Option<u64>> {
    match db.get_pinned_cf(handle(db, name), key)? {
        None => Ok(None),
        Some(v) => keys::decode_u64(&v)
            .map(Some)
            .ok_or_else(|| corrupt(name, "bad length")),
    }
}

/// The two u64 of a 16-byte key.
fn split_pair(key: &[u8]) -> Option<(u64, u64)> {
    if key.len() != 16 {
        return None;
    }
    Some((keys::decode_u64(&key[..8])?, keys::decode_u64(&key[8..])?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::Store;
    use crate::storage::testing::config;
    use cellmesh_proto::ids::ConversationId;
    use cellmesh_proto::storage::v1::ConvListEntry;

    /// Writes a format-1 database: conversation 100 of tenant 1 and 200 of
    /// tenant 2, both with a member whose id is 2, whose one queue holds an
    /// event of each.
    fn write_v1(dir: &std::path::Path, with_unknown: bool) {
        let db = super::super::options::open(dir, &config()).unwrap();
        let put =
            |name, key: &[u8], value: Vec<u8>| db.put_cf(handle(&db, name), key, value).unwrap();
        for (conv, tenant) in [(100u64, 1u64), (200, 2)] {
            let record = ConversationRecord {
                tenant_id: tenant,
                ..Default::default()
            };
            put(
                cf::CONVERSATIONS,
                &keys::u64_key(conv),
                record.encode_to_vec(),
            );
            put(cf::MEMBERS, &keys::pair_key(conv, 2), Vec::new());
        }
        let event = |conv| SyncRecord {
            conversation_id: conv,
            seq: 1,
            ..Default::default()
        };
        put(cf::SYNC, &keys::pair_key(2, 1), event(100).encode_to_vec());
        put(cf::SYNC, &keys::pair_key(2, 2), event(200).encode_to_vec());
        if with_unknown {
            // A conversation stored nowhere here, for a user of two tenants.
            put(cf::SYNC, &keys::pair_key(2, 3), event(999).encode_to_vec());
        }
        let entry = ConvListEntry {
            last_seq: 1,
            ..Default::default()
        };
        put(
            cf::CONV_LIST,
            &keys::pair_key(2, 100),
            entry.encode_to_vec(),
        );
        put(
            cf::CONV_LIST,
            &keys::pair_key(2, 200),
            entry.encode_to_vec(),
        );
        put(cf::MUTED, &keys::pair_key(2, 200), vec![1]);
        let mut device = 2u64.to_be_bytes().to_vec();
        device.extend_from_slice(b"phone");
        put(cf::DEVICE_CURSOR, &device, 2u64.to_be_bytes().to_vec());
        put(
            cf::QUEUE_ID,
            &keys::u64_key(2),
            77u64.to_be_bytes().to_vec(),
        );
        let mark = [b"moved/".as_slice(), b"u", &5u64.to_be_bytes()].concat();
        let value = [1u64.to_be_bytes(), 1234u64.to_be_bytes()].concat();
        put(cf::META, &mark, value);
    }

    #[test]
    fn a_format_1_store_is_split_by_tenant_on_open() {
        let dir = tempfile::tempdir().unwrap();
        write_v1(dir.path(), false);
        let store = Store::open(dir.path(), &config()).unwrap();
        let (a, b) = (
            UserKey::new(TenantId(1), UserId(2)),
            UserKey::new(TenantId(2), UserId(2)),
        );
        let convs = |u| {
            store
                .sync_after(u, 0, 10)
                .unwrap()
                .into_iter()
                .map(|(pts, r)| (pts, r.conversation_id))
                .collect::<Vec<_>>()
        };
        assert_eq!(convs(a), vec![(1, 100)]);
        assert_eq!(convs(b), vec![(2, 200)]);
        let list = |u| {
            store
                .conv_list(u)
                .unwrap()
                .into_iter()
                .map(|(c, _)| c)
                .collect::<Vec<_>>()
        };
        assert_eq!(list(a), vec![100]);
        assert_eq!(list(b), vec![200]);
        assert!(!store.muted(a, ConversationId(200)).unwrap());
        assert!(store.muted(b, ConversationId(200)).unwrap());
        assert_eq!(store.device_cursor(a, "phone").unwrap(), 2);
        assert_eq!(store.device_cursor(b, "phone").unwrap(), 2);
        assert_eq!(store.queue_id(a).unwrap(), 77);
        assert_eq!(
            store
                .queue_id(UserKey::new(TenantId(3), UserId(2)))
                .unwrap(),
            0
        );
        let moved = store.moved(super::super::moved::USER).unwrap();
        assert_eq!(moved.len(), 1);
        assert_eq!(
            (moved[0].tenant, moved[0].id, moved[0].sealed_at_ms),
            (TenantId(1), 5, 1234)
        );
        // Opening again finds format 2 and changes nothing.
        store.close();
        drop(store);
        let store = Store::open(dir.path(), &config()).unwrap();
        assert_eq!(store.sync_after(a, 0, 10).unwrap().len(), 1);
    }

    #[test]
    fn state_no_tenant_can_be_found_for_refuses_the_open() {
        let dir = tempfile::tempdir().unwrap();
        write_v1(dir.path(), true);
        let Err(StorageError::Format(message)) = Store::open(dir.path(), &config()) else {
            panic!("an unattributable record must refuse the open");
        };
        assert!(message.contains("user 2"), "{message}");
    }

    #[test]
    fn a_newer_format_is_refused_and_a_new_store_is_current() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &config()).unwrap();
        store.close();
        drop(store);
        let db = super::super::options::open(dir.path(), &config()).unwrap();
        assert_eq!(
            read_u64(&db, cf::META, keys::meta::STORAGE_FORMAT).unwrap(),
            Some(keys::FORMAT)
        );
        db.put_cf(
            handle(&db, cf::META),
            keys::meta::STORAGE_FORMAT,
            (keys::FORMAT + 1).to_be_bytes(),
        )
        .unwrap();
        drop(db);
        assert!(matches!(
            Store::open(dir.path(), &config()),
            Err(StorageError::Format(_))
        ));
    }
}
