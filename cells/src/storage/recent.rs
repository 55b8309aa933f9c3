//! The newest message rows written here, held in memory as stored: the
//! search indexer reads every new message back by key, and that point read
//! in RocksDB was the indexer's largest cost under a steady send load. The
//! commit lanes report every durable batch's ops here before its writers
//! hear of it: a put of a `messages` row keeps its bytes, a delete forgets
//! the row and a range delete forgets them all. Rows are only ever written
//! through the message lane, so the order of the notes is the order of the
//! writes and a row held here is what storage holds as of the last durable
//! write. The oldest rows go first once [`MAX_ROWS`] or [`MAX_BYTES`] is
//! passed; a row not held is read from storage.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;

use super::Op;
use super::keys::cf;

/// Rows held at most.
const MAX_ROWS: usize = 1 << 16;
/// Bytes of rows held at most.
const MAX_BYTES: usize = 32 << 20;

/// A `messages` key: the conversation and the seq, big-endian.
type Key = [u8; 16];

#[derive(Default)]
pub(crate) struct RecentMessages {
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    rows: FxHashMap<Key, Arc<[u8]>>,
    /// Keys in the order they were put (a key put again is here twice;
    /// the older entry forgets the newer row early, which only costs a
    /// read).
    order: VecDeque<Key>,
    /// Bytes of the rows held.
    bytes: usize,
}

impl RecentMessages {
    /// The stored bytes of the `messages` row at `key`, if held.
    pub fn get(&self, key: &[u8]) -> Option<Arc<[u8]>> {
        let key = Key::try_from(key).ok()?;
        self.lock().rows.get(&key).cloned()
    }

    /// Called by the commit lanes with every durable batch's ops.
    pub(super) fn note<'a>(&self, ops: impl Iterator<Item = &'a Op>) {
        let mut locked = None;
        for op in ops.filter(|op| op.family() == cf::MESSAGES) {
            let kept = locked.get_or_insert_with(|| self.lock());
            match op {
                Op::Put(_, key, value) => match Key::try_from(key.as_slice()) {
                    Ok(key) => kept.put(key, value),
                    Err(_) => kept.clear(),
                },
                Op::Delete(_, key) | Op::Merge(_, key, _) => match Key::try_from(key.as_slice()) {
                    Ok(key) => kept.forget(&key),
                    Err(_) => kept.clear(),
                },
                Op::DeleteRange(..) => kept.clear(),
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Kept {
    fn put(&mut self, key: Key, value: &[u8]) {
        if value.len() > MAX_BYTES / 64 {
            self.forget(&key);
            return;
        }
        self.bytes += value.len();
        if let Some(older) = self.rows.insert(key, value.into()) {
            self.bytes -= older.len();
        }
        self.order.push_back(key);
        while self.order.len() > MAX_ROWS || self.bytes > MAX_BYTES {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            self.forget(&oldest);
        }
    }

    fn forget(&mut self, key: &Key) {
        if let Some(row) = self.rows.remove(key) {
            self.bytes -= row.len();
        }
    }

    fn clear(&mut self) {
        self.rows.clear();
        self.order.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::keys;
    use cellmesh_proto::ids::{ConversationId, Seq};

    fn key(conversation: u64, seq: u64) -> Vec<u8> {
        keys::message(ConversationId(conversation), Seq(seq)).to_vec()
    }

    fn put(conversation: u64, seq: u64, value: &[u8]) -> Op {
        Op::Put(cf::MESSAGES, key(conversation, seq), value.to_vec())
    }

    #[test]
    fn a_row_holds_its_last_write_and_deletes_forget() {
        let recent = RecentMessages::default();
        recent.note([put(1, 1, b"a"), put(1, 2, b"b"), put(2, 1, b"c")].iter());
        recent.note([put(1, 1, b"edited")].iter());
        assert_eq!(recent.get(&key(1, 1)).as_deref(), Some(&b"edited"[..]));
        assert_eq!(recent.get(&key(1, 2)).as_deref(), Some(&b"b"[..]));
        recent.note([Op::Delete(cf::MESSAGES, key(1, 2))].iter());
        assert_eq!(recent.get(&key(1, 2)), None);
        let other = Op::Put(cf::SYNC, key(2, 1), b"sync".to_vec());
        recent.note([other].iter());
        assert_eq!(
            recent.get(&key(2, 1)).as_deref(),
            Some(&b"c"[..]),
            "another family changes nothing"
        );
        recent.note([Op::DeleteRange(cf::MESSAGES, key(2, 0), key(2, 9))].iter());
        assert_eq!(recent.get(&key(1, 1)), None, "a range delete forgets all");
        assert_eq!(recent.lock().bytes, 0);
    }

    #[test]
    fn the_oldest_rows_go_first_and_the_bytes_held_are_bounded() {
        let recent = RecentMessages::default();
        let row = vec![7u8; 1_000];
        for seq in 0..(MAX_BYTES / row.len()) as u64 + 10 {
            recent.note([put(3, seq, &row)].iter());
        }
        assert_eq!(recent.get(&key(3, 0)), None, "the oldest went");
        let newest = (MAX_BYTES / row.len()) as u64 + 9;
        assert!(recent.get(&key(3, newest)).is_some(), "the newest stays");
        let kept = recent.lock();
        assert!(kept.bytes <= MAX_BYTES);
        assert!(kept.rows.len() <= MAX_ROWS);
        assert_eq!(
            kept.bytes,
            kept.rows.values().map(|r| r.len()).sum::<usize>()
        );
    }
}
