//! Dropping every key of a span — a user's home before a fresh copy, a
//! conversation's history after its move — with point deletes where the
//! span holds few keys, and a range tombstone only where it holds many.
//! RocksDB fragments a memtable's range tombstones again for every new
//! iterator over its column family, so one tombstone per copied home (tens
//! of thousands in a tenant move) would slow every later read of the sync
//! queue in proportion to the homes copied.

use crate::user::UserKey;
use cellmesh_proto::ids::ConversationId;

use super::keys::{self, cf};
use super::{Mutation, Op, Result, Store};

/// A span with more keys than this is dropped with one range tombstone.
const POINT_DELETES: usize = 1_024;

impl Store {
    /// Adds to `m` the deletion of every key of `name` in `[from, to)`
    /// stored now. Only for spans that nothing else writes meanwhile: a
    /// key written after this listing is not deleted.
    fn delete_span(
        &self,
        m: &mut Mutation,
        name: &'static str,
        from: Vec<u8>,
        to: Vec<u8>,
    ) -> Result<()> {
        let mut iter = self.bounded_iter(name, (from.clone(), to.clone()));
        iter.seek_to_first();
        let mut found = Vec::new();
        while let Some(key) = iter.key() {
            if found.len() == POINT_DELETES {
                m.ops.push(Op::DeleteRange(name, from, to));
                return Ok(());
            }
            found.push(Op::Delete(name, key.to_vec()));
            iter.next();
        }
        iter.status()?;
        m.ops.extend(found);
        Ok(())
    }

    /// Adds to `m` the deletion of everything stored for `user`'s home
    /// here: sync queue, conversation list, mute flags, device cursors and
    /// queue identity (before a fresh copy of a moving home, or once it
    /// has been elsewhere for the grace period). Nothing else writes a
    /// home that is not this cell's.
    pub fn clear_user(&self, m: &mut Mutation, user: UserKey) -> Result<()> {
        for name in [cf::SYNC, cf::CONV_LIST, cf::MUTED] {
            let (from, to) = keys::user_items(user);
            self.delete_span(m, name, from.to_vec(), to.to_vec())?;
            m.ops.push(Op::Delete(name, to.to_vec()));
        }
        let (from, to) = keys::devices_of(user);
        self.delete_span(m, cf::DEVICE_CURSOR, from, to)?;
        m.ops
            .push(Op::Delete(cf::QUEUE_ID, keys::user(user).to_vec()));
        Ok(())
    }

    /// Adds to `m` the deletion of a conversation's history (hot rows and
    /// cold manifest; the objects are the new owner's), read positions and
    /// hidden marks; its record and members stay (a standby's copy, tenant
    /// listings).
    pub fn drop_history(&self, m: &mut Mutation, conversation: ConversationId) -> Result<()> {
        let (from, to) = keys::prefixed_by(conversation.get());
        for name in [cf::MESSAGES, cf::READ_STATE, cf::HIDDEN, cf::MANIFEST] {
            self.delete_span(m, name, from.clone(), to.clone())?;
        }
        m.ops.push(Op::Delete(
            cf::CONV_SEQ,
            keys::u64_key(conversation.get()).to_vec(),
        ));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use cellmesh_proto::ids::{TenantId, UserId};
    use cellmesh_proto::storage::v1::{ConvListEntry, MessageRecord, SyncRecord};

    use super::super::testing::store;
    use super::*;

    fn ranges(m: &Mutation) -> usize {
        m.ops
            .iter()
            .filter(|op| matches!(op, Op::DeleteRange(..)))
            .count()
    }

    /// Fills `user`'s home with `events` sync events and a little of
    /// everything else.
    async fn fill_home(store: &Store, user: UserKey, events: u64) {
        let mut m = Mutation::new();
        for pts in 1..=events {
            m.put_sync(user, pts, &SyncRecord::default());
        }
        m.put_conv_list(user, ConversationId(9), &ConvListEntry::default());
        m.set_muted(user, ConversationId(9), true);
        m.raise_device_cursor(user, "phone", events);
        m.set_queue_id(user, 5);
        store.commit(m).await.unwrap();
    }

    #[tokio::test]
    async fn a_small_home_is_cleared_key_by_key_and_a_large_one_by_range() {
        let (_dir, store) = store();
        let (small, large, other) = (
            UserKey::new(TenantId(1), UserId(7)),
            UserKey::new(TenantId(1), UserId(8)),
            UserKey::new(TenantId(2), UserId(7)),
        );
        fill_home(&store, small, 10).await;
        fill_home(&store, large, POINT_DELETES as u64 + 1).await;
        fill_home(&store, other, 3).await;
        let mut m = Mutation::new();
        store.clear_user(&mut m, small).unwrap();
        assert_eq!(ranges(&m), 0, "a few keys need no range tombstone");
        store.commit(m).await.unwrap();
        let mut m = Mutation::new();
        store.clear_user(&mut m, large).unwrap();
        assert_eq!(ranges(&m), 1, "only the sync queue is long");
        store.commit(m).await.unwrap();
        for user in [small, large] {
            assert_eq!(store.user_pts(user).unwrap(), 0);
            assert!(store.conv_list(user).unwrap().is_empty());
            assert!(!store.muted(user, ConversationId(9)).unwrap());
            assert_eq!(store.queue_id(user).unwrap(), 0);
        }
        assert_eq!(
            store.user_pts(other).unwrap(),
            3,
            "another tenant's user stays"
        );
        assert!(store.muted(other, ConversationId(9)).unwrap());
    }

    #[tokio::test]
    async fn dropped_history_leaves_the_neighbours() {
        let (_dir, store) = store();
        let mut m = Mutation::new();
        for conversation in [41, 42, 43] {
            for seq in 1..=5 {
                m.put_message(ConversationId(conversation), seq, &MessageRecord::default());
            }
        }
        store.commit(m).await.unwrap();
        let mut m = Mutation::new();
        store.drop_history(&mut m, ConversationId(42)).unwrap();
        assert_eq!(ranges(&m), 0);
        store.commit(m).await.unwrap();
        let left = |c| store.messages_after(c, 0, 100, usize::MAX).unwrap().len();
        assert_eq!(
            (
                left(ConversationId(41)),
                left(ConversationId(42)),
                left(ConversationId(43))
            ),
            (5, 0, 5)
        );
    }
}
