//! Reading many conversations or homes in a row — a tenant's marks and
//! digests in a move — from one snapshot, with one iterator per column
//! family that seeks forward from item to item. Creating an iterator costs
//! more than reading a small conversation, and a snapshot makes every
//! item's latest position agree with the rows read for it.

use cellmesh_proto::ids::{ConversationId, Seq};
use cellmesh_proto::storage::v1::{ConversationSeq, MessageRecord, SegmentEntry, SyncRecord};
use prost::Message as _;
use rocksdb::{DB, DBRawIterator, ReadOptions, SnapshotWithThreadMode};

use super::keys::{self, cf};
use super::{Result, Store, corrupt};
use crate::user::UserKey;

/// One consistent view of the store for reading many items; see the module
/// docs. Iterators are created on first use.
pub struct Walk<'a> {
    // Declared before the snapshot: dropped before it.
    messages: Option<DBRawIterator<'a>>,
    manifest: Option<DBRawIterator<'a>>,
    sync: Option<DBRawIterator<'a>>,
    snapshot: SnapshotWithThreadMode<'a, DB>,
    store: &'a Store,
}

impl Store {
    /// A [`Walk`] over the store as it is now.
    pub fn walk(&self) -> Walk<'_> {
        Walk {
            messages: None,
            manifest: None,
            sync: None,
            snapshot: self.db.snapshot(),
            store: self,
        }
    }
}

/// Reads at `snapshot`. An iterator made with these must be dropped
/// before the snapshot ([`Walk`]'s field order sees to that).
fn read_at(snapshot: &SnapshotWithThreadMode<'_, DB>) -> ReadOptions {
    let mut options = ReadOptions::default();
    options.set_snapshot(snapshot);
    options
}

/// Hands the rows of `iter` from `from` while their key starts with
/// `prefix` and ends with a u64 at most `through`, to `f` (the u64 and the
/// value).
fn rows(
    iter: &mut DBRawIterator<'_>,
    name: &'static str,
    prefix: &[u8],
    from: &[u8],
    through: u64,
    mut f: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    iter.seek(from);
    while let Some(key) = iter.key().filter(|k| k.starts_with(prefix)) {
        let item = keys::last_u64(key).ok_or_else(|| corrupt(name, "short key"))?;
        if item > through {
            break;
        }
        f(item, iter.value().unwrap_or_default())?;
        iter.next();
    }
    Ok(iter.status()?)
}

impl<'a> Walk<'a> {
    fn iter(&mut self, name: &'static str) -> &mut DBRawIterator<'a> {
        let slot = match name {
            cf::MESSAGES => &mut self.messages,
            cf::MANIFEST => &mut self.manifest,
            _ => &mut self.sync,
        };
        if slot.is_none() {
            let (store, options) = (self.store, read_at(&self.snapshot));
            *slot = Some(store.db.raw_iterator_cf_opt(store.cf(name), options));
        }
        slot.as_mut().expect("created above")
    }

    fn get(&self, name: &'static str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let options = read_at(&self.snapshot);
        Ok(self
            .store
            .db
            .get_cf_opt(self.store.cf(name), key, &options)?)
    }

    pub fn conv_seq(&self, conversation: ConversationId) -> Result<ConversationSeq> {
        match self.get(cf::CONV_SEQ, &keys::u64_key(conversation.get()))? {
            None => Ok(ConversationSeq::default()),
            Some(v) => ConversationSeq::decode(v.as_slice()).map_err(|e| corrupt(cf::CONV_SEQ, e)),
        }
    }

    pub fn meta_u64(&self, key: &[u8]) -> Result<Option<u64>> {
        match self.get(cf::META, key)? {
            None => Ok(None),
            Some(v) => keys::decode_u64(&v)
                .map(Some)
                .ok_or_else(|| corrupt(cf::META, "bad length")),
        }
    }

    /// Hands the records of `name` from key `from` on, while their key
    /// starts with `prefix` and ends with a u64 at most `through`, to `f`.
    fn records<T: prost::Message + Default>(
        &mut self,
        name: &'static str,
        (prefix, from): (&[u8], &[u8]),
        through: u64,
        mut f: impl FnMut(u64, T),
    ) -> Result<()> {
        rows(self.iter(name), name, prefix, from, through, |item, v| {
            f(item, T::decode(v).map_err(|e| corrupt(name, e))?);
            Ok(())
        })
    }

    /// Hands `conversation`'s hot messages with seq in `(after, through]`
    /// to `f`, in order.
    pub fn messages(
        &mut self,
        conversation: ConversationId,
        after: u64,
        through: u64,
        mut f: impl FnMut(u64, &MessageRecord),
    ) -> Result<()> {
        let from = keys::message(conversation, Seq(after.saturating_add(1)));
        let prefix = keys::u64_key(conversation.get());
        self.records(cf::MESSAGES, (&prefix, &from), through, |seq, m| f(seq, &m))
    }

    /// `conversation`'s cold-tier manifest.
    pub fn segments(&mut self, conversation: ConversationId) -> Result<Vec<SegmentEntry>> {
        let (from, prefix) = (
            keys::message(conversation, Seq(0)),
            keys::u64_key(conversation.get()),
        );
        let mut out = Vec::new();
        self.records(cf::MANIFEST, (&prefix, &from), u64::MAX, |_, s| out.push(s))?;
        Ok(out)
    }

    /// The latest pts of `user` (0: an empty queue).
    pub fn user_pts(&mut self, user: UserKey) -> Result<u64> {
        let prefix = keys::user(user);
        let iter = self.iter(cf::SYNC);
        iter.seek_for_prev(keys::user_item(user, u64::MAX));
        let pts = (iter.key())
            .filter(|k| k.starts_with(&prefix))
            .and_then(keys::last_u64)
            .unwrap_or(0);
        iter.status()?;
        Ok(pts)
    }

    /// Hands `user`'s sync events with pts in `(after, through]` to `f`,
    /// in order.
    pub fn sync_events(
        &mut self,
        user: UserKey,
        after: u64,
        through: u64,
        mut f: impl FnMut(u64, &SyncRecord),
    ) -> Result<()> {
        let from = keys::user_item(user, after.saturating_add(1));
        let prefix = keys::user(user);
        self.records(cf::SYNC, (&prefix, &from), through, |pts, r| f(pts, &r))
    }
}

#[cfg(test)]
mod tests {
    use super::super::Mutation;
    use super::*;
    use cellmesh_proto::ids::{TenantId, UserId};

    #[tokio::test]
    async fn a_walk_reads_each_item_alone_and_at_one_moment() {
        let (_dir, store) = super::super::testing::store();
        let (a, b, c) = (
            UserKey::new(TenantId(1), UserId(1)),
            UserKey::new(TenantId(1), UserId(2)),
            UserKey::new(TenantId(1), UserId(3)),
        );
        let mut m = Mutation::new();
        for seq in 1..=3 {
            m.put_message(ConversationId(41), seq, &MessageRecord::default());
            m.put_message(ConversationId(43), seq, &MessageRecord::default());
            m.put_sync(a, seq, &SyncRecord::default());
            m.put_sync(c, seq + 10, &SyncRecord::default());
        }
        store.commit(m).await.unwrap();
        let mut walk = store.walk();
        let mut late = Mutation::new();
        late.put_message(ConversationId(41), 4, &MessageRecord::default());
        late.put_sync(b, 1, &SyncRecord::default());
        store.commit(late).await.unwrap();
        let seqs = |walk: &mut Walk<'_>, c, after, through| {
            let mut out = Vec::new();
            walk.messages(c, after, through, |s, _| out.push(s))
                .unwrap();
            out
        };
        assert_eq!(
            seqs(&mut walk, ConversationId(41), 0, u64::MAX),
            vec![1, 2, 3],
            "the write after the walk began is not seen"
        );
        assert_eq!(
            seqs(&mut walk, ConversationId(42), 0, u64::MAX),
            Vec::<u64>::new(),
            "no rows of the next conversation"
        );
        assert_eq!(seqs(&mut walk, ConversationId(43), 1, 2), vec![2]);
        assert_eq!(walk.user_pts(a).unwrap(), 3);
        assert_eq!(
            walk.user_pts(b).unwrap(),
            0,
            "neither the user before nor the one after"
        );
        assert_eq!(walk.user_pts(c).unwrap(), 13);
        let mut events = Vec::new();
        walk.sync_events(b, 0, u64::MAX, |p, _| events.push(p))
            .unwrap();
        assert!(events.is_empty());
        assert_eq!(store.walk().user_pts(b).unwrap(), 1, "a new walk sees it");
    }
}
