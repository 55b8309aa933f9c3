//! Sync queue identities held in memory: every push to a device carries
//! its user's queue id, and reading it from RocksDB for each was a
//! noticeable share of a busy cell's time. Values read from storage are
//! kept, and both commit lanes report every durable batch's ops here
//! before its writers hear of it (as they do to [`super::mirror`]): a
//! queue id written is kept as written (they are written by one lane, so
//! the notes come in the order of the writes); a delete of one (a home cleared
//! after a move) forgets them all. A read that raced a write is not kept:
//! each write moves a generation, and a value read from storage is kept
//! only if the generation did not move while it was read. So an answer
//! from memory is exactly what storage holds as of the last durable write.

use std::collections::HashMap;
use std::sync::Mutex;

use super::Op;
use super::keys::cf;

/// Queue ids kept at most; past it the map starts again empty.
const MAX_KEPT: usize = 200_000;

#[derive(Default)]
pub(crate) struct QueueIds {
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    ids: HashMap<[u8; 16], u64>,
    /// Moves with every queue id written or deleted.
    generation: u64,
}

impl QueueIds {
    /// The queue id under `key` (a [`super::keys::user`] key), from memory
    /// or else from `read` (storage), kept if no write raced the read.
    pub fn get<E>(&self, key: [u8; 16], read: impl FnOnce() -> Result<u64, E>) -> Result<u64, E> {
        let generation = {
            let kept = self.lock();
            if let Some(id) = kept.ids.get(&key) {
                return Ok(*id);
            }
            kept.generation
        };
        let id = read()?;
        let mut kept = self.lock();
        if kept.generation == generation {
            if kept.ids.len() >= MAX_KEPT {
                kept.ids.clear();
            }
            kept.ids.insert(key, id);
        }
        Ok(id)
    }

    /// Forgets every queue id (storage was written around the commit
    /// lanes, e.g. by a restore).
    pub fn forget(&self) {
        let mut kept = self.lock();
        kept.ids.clear();
        kept.generation += 1;
    }

    /// Called by the commit lanes with every durable batch's ops.
    pub(super) fn note<'a>(&self, ops: impl Iterator<Item = &'a Op>) {
        let mut locked = None;
        for op in ops {
            match op {
                Op::Put(name, key, value) if *name == cf::QUEUE_ID => {
                    let kept = locked.get_or_insert_with(|| self.lock());
                    kept.generation += 1;
                    let id = super::keys::decode_u64(value);
                    match (<[u8; 16]>::try_from(key.as_slice()), id) {
                        (Ok(key), Some(id)) => {
                            kept.ids.insert(key, id);
                        }
                        _ => kept.ids.clear(),
                    }
                }
                Op::Delete(name, _) | Op::Merge(name, _, _) | Op::DeleteRange(name, _, _)
                    if *name == cf::QUEUE_ID =>
                {
                    let kept = locked.get_or_insert_with(|| self.lock());
                    kept.generation += 1;
                    kept.ids.clear();
                }
                _ => {}
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two lanes naming one user's queue at once: whichever RocksDB wrote
    /// last, the id kept is the id stored.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queue_ids_written_in_both_lanes_at_once_are_kept_as_stored() {
        use super::super::testing::{commit_racing, store};
        use super::super::{Mutation, keys};
        use crate::user::UserKey;
        use cellmesh_proto::ids::{TenantId, UserId};

        let (_dir, store) = store();
        let user = UserKey::new(TenantId(1), UserId(3));
        for round in 0..1_000 {
            let (mut one, mut other) = (Mutation::new(), Mutation::new());
            one.set_queue_id(user, 2 * round as u64 + 1);
            other.set_queue_id(user, 2 * round as u64 + 2);
            commit_racing(&store, one, other, round).await;
            let stored = store.get_u64(cf::QUEUE_ID, &keys::user(user)).unwrap();
            assert_eq!(store.queue_id(user).unwrap(), stored, "round {round}");
        }
    }

    fn put(key: [u8; 16], id: u64) -> Op {
        Op::Put(cf::QUEUE_ID, key.to_vec(), id.to_be_bytes().to_vec())
    }

    #[test]
    fn a_write_replaces_what_was_kept_and_a_delete_forgets_all() {
        let ids = QueueIds::default();
        let (a, b) = ([1; 16], [2; 16]);
        assert_eq!(ids.get(a, || Ok::<_, ()>(5)), Ok(5));
        assert_eq!(ids.get(a, || Err(())), Ok(5), "kept: storage not read");
        ids.note([put(a, 6), put(b, 9)].iter());
        assert_eq!(ids.get(a, || Err(())), Ok(6));
        assert_eq!(ids.get(b, || Err(())), Ok(9));
        let other = Op::Put(cf::SYNC, a.to_vec(), 1u64.to_be_bytes().to_vec());
        ids.note([other].iter());
        assert_eq!(
            ids.get(a, || Err(())),
            Ok(6),
            "another family changes nothing"
        );
        ids.note([Op::Delete(cf::QUEUE_ID, b.to_vec())].iter());
        assert_eq!(ids.get(a, || Ok::<_, ()>(0)), Ok(0), "read again");
        assert_eq!(ids.get(b, || Ok::<_, ()>(0)), Ok(0));
    }

    #[test]
    fn a_read_that_raced_a_write_is_not_kept() {
        let ids = QueueIds::default();
        let a = [1; 16];
        // Storage read the old id while a commit wrote and noted a new one.
        let read = ids.get(a, || {
            ids.note([put(a, 7)].iter());
            Ok::<_, ()>(3)
        });
        assert_eq!(read, Ok(3), "the caller gets what it read");
        assert_eq!(ids.get(a, || Err(())), Ok(7), "memory holds the write");
        ids.forget();
        assert_eq!(ids.get(a, || Ok::<_, ()>(8)), Ok(8));
    }
}
