//! Small conversations' member lists held in memory: the fan-out reads a
//! conversation's members for every message it fans out, and walking them
//! in RocksDB was a fifth of its time with groups of 50. Kept exact the
//! way [`super::queue_ids`] are: a list read from storage is kept, both
//! commit lanes report every durable batch's ops here before its writers
//! hear of it, and any op on a conversation's members forgets that
//! conversation's list (a range delete forgets them all). A list read
//! while a member write was noted is not kept: each such write moves a
//! generation, and a list is kept only if the generation did not move
//! while it was read. So a list from memory is exactly what storage holds
//! as of the last durable write. Lists longer than [`MAX_LIST`] (read
//! diffusion groups) are not kept.

use std::sync::{Arc, Mutex};

use cellmesh_proto::ids::ConversationId;
use rustc_hash::FxHashMap;

use super::Op;
use super::keys::{self, cf};

/// Members of a list kept at most; a longer one is read each time.
pub const MAX_LIST: usize = 1_000;
/// Member ids kept at most (8 bytes each); past it the lists start again
/// empty.
const MAX_IDS: usize = 1 << 22;

#[derive(Default)]
pub(crate) struct MemberLists {
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    /// By conversation: its members, ascending.
    lists: FxHashMap<ConversationId, Arc<[u64]>>,
    /// Ids held in `lists`.
    ids: usize,
    /// Moves with every member write noted.
    generation: u64,
}

impl MemberLists {
    /// The members of `conversation` (ascending), from memory or else from
    /// `read` (storage), kept if short enough and no member write raced
    /// the read.
    pub fn get<E>(
        &self,
        conversation: ConversationId,
        read: impl FnOnce() -> Result<Vec<u64>, E>,
    ) -> Result<Arc<[u64]>, E> {
        let generation = {
            let kept = self.lock();
            if let Some(list) = kept.lists.get(&conversation) {
                return Ok(list.clone());
            }
            kept.generation
        };
        let list: Arc<[u64]> = read()?.into();
        let mut kept = self.lock();
        if kept.generation == generation && list.len() <= MAX_LIST {
            if kept.ids + list.len() > MAX_IDS {
                kept.lists.clear();
                kept.ids = 0;
            }
            kept.ids += list.len();
            if let Some(older) = kept.lists.insert(conversation, list.clone()) {
                kept.ids -= older.len();
            }
        }
        Ok(list)
    }

    /// The kept list of `conversation`, if any (storage is not read).
    pub fn peek(&self, conversation: ConversationId) -> Option<Arc<[u64]>> {
        self.lock().lists.get(&conversation).cloned()
    }

    /// Called by the commit lanes with every durable batch's ops.
    pub(super) fn note<'a>(&self, ops: impl Iterator<Item = &'a Op>) {
        let mut locked = None;
        for op in ops {
            let key = match op {
                Op::Put(name, key, _) | Op::Delete(name, key) | Op::Merge(name, key, _)
                    if *name == cf::MEMBERS =>
                {
                    Some(key)
                }
                Op::DeleteRange(name, _, _) if *name == cf::MEMBERS => None,
                _ => continue,
            };
            let kept = locked.get_or_insert_with(|| self.lock());
            kept.generation += 1;
            match key.and_then(|k| keys::first_u64(k)).map(ConversationId) {
                Some(conversation) => {
                    if let Some(list) = kept.lists.remove(&conversation) {
                        kept.ids -= list.len();
                    }
                }
                None => {
                    kept.lists.clear();
                    kept.ids = 0;
                }
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

    const A: ConversationId = ConversationId(1);
    const B: ConversationId = ConversationId(2);

    fn member(conversation: u64, user: u64) -> Vec<u8> {
        keys::pair_key(conversation, user).to_vec()
    }

    fn read(list: &[u64]) -> impl FnOnce() -> Result<Vec<u64>, ()> + '_ {
        move || Ok(list.to_vec())
    }

    #[test]
    fn a_member_written_or_removed_forgets_its_conversation_only() {
        let lists = MemberLists::default();
        assert_eq!(&*lists.get(A, read(&[5, 6])).unwrap(), &[5, 6]);
        assert_eq!(&*lists.get(B, read(&[7])).unwrap(), &[7]);
        assert_eq!(&*lists.get(A, || Err(())).unwrap(), &[5, 6], "kept");
        lists.note([Op::Put(cf::MEMBERS, member(1, 8), Vec::new())].iter());
        assert_eq!(lists.peek(A), None, "read again");
        assert_eq!(&*lists.get(A, read(&[5, 6, 8])).unwrap(), &[5, 6, 8]);
        assert_eq!(&*lists.get(B, || Err(())).unwrap(), &[7], "another kept");
        lists.note([Op::Delete(cf::MEMBERS, member(2, 7))].iter());
        assert_eq!(lists.peek(B), None);
        let other = Op::Put(cf::SYNC, member(1, 9), Vec::new());
        lists.note([other].iter());
        assert!(lists.peek(A).is_some(), "another family changes nothing");
        lists.note([Op::DeleteRange(cf::MEMBERS, member(0, 0), member(9, 0))].iter());
        assert_eq!(lists.peek(A), None, "a range delete forgets all");
    }

    #[test]
    fn a_read_that_raced_a_member_write_is_not_kept() {
        let lists = MemberLists::default();
        let raced = lists.get(A, || {
            lists.note([Op::Put(cf::MEMBERS, member(1, 8), Vec::new())].iter());
            Ok::<_, ()>(vec![5])
        });
        assert_eq!(&*raced.unwrap(), &[5], "the caller gets what it read");
        assert_eq!(lists.peek(A), None);
        lists.get(A, read(&[5, 8])).unwrap();
        assert_eq!(
            lists.peek(A).as_deref(),
            Some(&[5, 8][..]),
            "read alone: kept"
        );
    }

    #[test]
    fn a_long_list_is_not_kept_and_the_ids_kept_are_bounded() {
        let lists = MemberLists::default();
        let long: Vec<u64> = (0..=MAX_LIST as u64).collect();
        assert_eq!(lists.get(A, read(&long)).unwrap().len(), MAX_LIST + 1);
        assert_eq!(lists.peek(A), None);
        let full: Vec<u64> = (0..MAX_LIST as u64).collect();
        for conversation in 0..(MAX_IDS / MAX_LIST) as u64 + 2 {
            lists
                .get(ConversationId(conversation), read(&full))
                .unwrap();
        }
        let kept = lists.lock();
        assert!(kept.ids <= MAX_IDS);
        assert_eq!(
            kept.ids,
            kept.lists.values().map(|l| l.len()).sum::<usize>()
        );
    }
}
