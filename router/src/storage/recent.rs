//! The newest watch batches in memory. Every cell, edge and control plane
//! watches the table; without this each of them read each new batch back
//! from the changes column family — an iterator per watcher per write,
//! over the range deletions history compaction leaves. Watchers that keep
//! up are served from here; one that is further behind reads storage.

use std::collections::VecDeque;
use std::sync::RwLock;

use super::state::WatchBatch;

/// Batches kept.
const KEEP: usize = 4_096;

pub struct Recent {
    ring: RwLock<Ring>,
}

struct Ring {
    /// Applied batches with changes, in index order.
    batches: VecDeque<WatchBatch>,
    /// Every batch from this index on is in `batches`.
    complete_from: u64,
}

impl Recent {
    /// Holding nothing, and so every batch from `next` (the first index
    /// not applied yet) on.
    pub fn new(next: u64) -> Self {
        Self {
            ring: RwLock::new(Ring {
                batches: VecDeque::new(),
                complete_from: next,
            }),
        }
    }

    /// Adds batches just applied, in index order.
    pub fn push(&self, applied: Vec<WatchBatch>) {
        let mut ring = self.ring.write().expect("recent changes lock");
        for batch in applied {
            ring.batches.push_back(batch);
        }
        while ring.batches.len() > KEEP {
            if let Some((index, _)) = ring.batches.pop_front() {
                ring.complete_from = index + 1;
            }
        }
    }

    /// Forgets everything (a snapshot replaced the table): complete from
    /// `next` on.
    pub fn reset(&self, next: u64) {
        *self.ring.write().expect("recent changes lock") = Ring {
            batches: VecDeque::new(),
            complete_from: next,
        };
    }

    /// The batches at `from` and after, at most `limit`, when all of them
    /// are here.
    pub fn since(&self, from: u64, limit: usize) -> Option<Vec<WatchBatch>> {
        let ring = self.ring.read().expect("recent changes lock");
        if from < ring.complete_from {
            return None;
        }
        let start = ring.batches.partition_point(|(index, _)| *index < from);
        Some(ring.batches.range(start..).take(limit).cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(index: u64) -> WatchBatch {
        (index, Vec::new())
    }

    fn indexes(batches: Option<Vec<WatchBatch>>) -> Option<Vec<u64>> {
        batches.map(|b| b.into_iter().map(|(i, _)| i).collect())
    }

    #[test]
    fn serves_only_what_it_holds_whole() {
        let recent = Recent::new(10);
        assert_eq!(indexes(recent.since(9, 10)), None, "before it started");
        assert_eq!(indexes(recent.since(10, 10)), Some(vec![]));
        recent.push(vec![batch(10), batch(12), batch(13)]);
        assert_eq!(indexes(recent.since(11, 10)), Some(vec![12, 13]));
        assert_eq!(indexes(recent.since(10, 2)), Some(vec![10, 12]));
        recent.push((14..14 + KEEP as u64).map(batch).collect());
        // The three oldest made room.
        assert_eq!(indexes(recent.since(13, 1)), None, "dropped");
        assert_eq!(indexes(recent.since(14, 1)), Some(vec![14]));
        recent.reset(100_000);
        assert_eq!(indexes(recent.since(14, 1)), None, "a snapshot came");
    }
}
