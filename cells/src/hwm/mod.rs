//! Failover high-water marks (DESIGN.md §6). The route table holds nothing
//! per written conversation: each round (every
//! `routing.checkpoint_interval_ms`) a cell pushes the latest seq of the
//! conversations it wrote since the last round to its standbys, which keep
//! them fsynced and never lowered (`CellPeer.StoreHighWaterMarks`); a
//! failover to a standby puts each conversation's floor above the mark it
//! holds plus the safety margin. The fence that makes this safe: a cell
//! never assigns a seq past the mark all its standbys acknowledged plus
//! that margin. A standby becomes a *holder* in the route table (one list
//! per cell) once it has every mark — a full push, then every later round
//! — and a failover goes to a holder only. [`round`] runs the rounds; this
//! module keeps the marks between them.

pub mod round;

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use cellmesh_proto::reason::Reason;

use crate::error::CellError;
use crate::storage::{Mark, Result, StorageError, Store};

/// Most marks one push may carry.
pub const MAX_PUSH: usize = 100_000;

/// The owner's marks between rounds, and the marks this cell holds for
/// others (through its store).
pub struct HighWaterMarks {
    /// Latest seq of the conversations written since the last round:
    /// (tenant, seq) by conversation.
    written: Mutex<HashMap<u64, (u64, u64)>>,
    /// The mark every standby acknowledged, by conversation.
    acked: Mutex<HashMap<u64, u64>>,
    /// Set once rounds run (a routed cell): a standalone cell keeps nothing.
    tracking: AtomicBool,
    /// Rounds that took their marks so far (each round's number).
    taken: AtomicU64,
    /// The number of the last round that ended with every standby holding
    /// every mark it took.
    rounds: watch::Sender<u64>,
    wake: Notify,
    /// Weak: the cell's database closes when the cell stops.
    store: OnceLock<Weak<Store>>,
}

impl Default for HighWaterMarks {
    fn default() -> Self {
        Self {
            written: Default::default(),
            acked: Default::default(),
            tracking: AtomicBool::new(false),
            taken: AtomicU64::new(0),
            rounds: watch::channel(0).0,
            wake: Notify::new(),
            store: OnceLock::new(),
        }
    }
}

impl HighWaterMarks {
    /// Gives the marks the cell's store (the held marks live there).
    pub fn attach(&self, store: &Arc<Store>) {
        let _ = self.store.set(Arc::downgrade(store));
    }

    fn store(&self) -> std::result::Result<Arc<Store>, StorageError> {
        self.store
            .get()
            .and_then(Weak::upgrade)
            .ok_or(StorageError::Closed)
    }

    /// Records that `conversation`'s seq reached `seq` here: a send, or
    /// history stored by a move.
    pub fn note(&self, tenant: TenantId, conversation: ConversationId, seq: u64) {
        if !self.tracking.load(Ordering::Relaxed) {
            return;
        }
        let mut written = self.written.lock().expect("marks lock");
        let slot = written
            .entry(conversation.get())
            .or_insert((tenant.get(), 0));
        slot.1 = slot.1.max(seq);
    }

    /// Asks for a round now (a send found its conversation at the fence).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// The mark every standby of this cell acknowledged for `conversation`.
    pub fn acked(&self, conversation: ConversationId) -> u64 {
        self.acked
            .lock()
            .expect("marks lock")
            .get(&conversation.get())
            .copied()
            .unwrap_or(0)
    }

    /// The mark this cell holds for another cell's `conversation` (0: none).
    pub fn held(&self, tenant: TenantId, conversation: ConversationId) -> Result<u64> {
        self.store()?.high_water_mark(tenant, conversation)
    }

    /// Returns once a round that started after this call has ended with
    /// every standby acknowledging, or after `within` (whether it did).
    pub async fn flush(&self, within: Duration) -> bool {
        let mut rounds = self.rounds.subscribe();
        // A round under way may have taken its marks before this call: the
        // next one takes them after it.
        let wanted = self.taken.load(Ordering::Acquire) + 1;
        let wait = async {
            loop {
                self.wake.notify_one();
                if *rounds.borrow_and_update() >= wanted {
                    return true;
                }
                if rounds.changed().await.is_err() {
                    return false;
                }
            }
        };
        tokio::time::timeout(within, wait).await.unwrap_or(false)
    }

    /// Refuses a push that is too large or names tenant or conversation 0.
    pub fn validate_push(
        &self,
        source: &str,
        marks: &[Mark],
    ) -> std::result::Result<(), CellError> {
        if marks.len() > MAX_PUSH {
            return Err(CellError::invalid(
                Reason::BadHighWaterMark,
                format!("{} marks in one call; at most {MAX_PUSH}", marks.len()),
            ));
        }
        if let Some(bad) = marks.iter().find(|(t, c, _)| *t == 0 || *c == 0) {
            return Err(CellError::invalid(
                Reason::BadHighWaterMark,
                format!("mark {bad:?} from {source} names tenant or conversation 0"),
            ));
        }
        Ok(())
    }

    /// Stores pushed marks (holder side), fsynced.
    pub fn store_pushed(&self, marks: &[Mark]) -> std::result::Result<(), CellError> {
        self.store()?.raise_high_water_marks(marks)?;
        Ok(())
    }

    fn start_tracking(&self) {
        self.tracking.store(true, Ordering::Relaxed);
    }

    fn take(&self) -> Vec<Mark> {
        self.taken.fetch_add(1, Ordering::AcqRel);
        std::mem::take(&mut *self.written.lock().expect("marks lock"))
            .into_iter()
            .map(|(conversation, (tenant, seq))| (tenant, conversation, seq))
            .collect()
    }

    /// Puts back marks a round could not deliver.
    fn restore(&self, marks: Vec<Mark>) {
        for (tenant, conversation, seq) in marks {
            self.note(TenantId(tenant), ConversationId(conversation), seq);
        }
    }

    fn acknowledge(&self, marks: &[Mark]) {
        let mut acked = self.acked.lock().expect("marks lock");
        for &(_, conversation, seq) in marks {
            let slot = acked.entry(conversation).or_default();
            *slot = (*slot).max(seq);
        }
    }

    /// The round that took marks last (rounds run one at a time) ended
    /// with every standby holding them.
    fn round_done(&self) {
        let taken = self.taken.load(Ordering::Acquire);
        self.rounds.send_modify(|n| *n = taken);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flush returns once a round that took its marks after the call
    /// ended acknowledged: not the round under way at the call, and with
    /// no round under way, the very next one.
    #[tokio::test]
    async fn a_flush_waits_for_a_round_that_took_its_marks_after_it() {
        let marks = Arc::new(HighWaterMarks::default());
        let under_way = marks.take();
        assert!(under_way.is_empty());
        let flush = tokio::spawn({
            let marks = marks.clone();
            async move { marks.flush(Duration::from_secs(5)).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        marks.round_done();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !flush.is_finished(),
            "the round under way took its marks before the flush"
        );
        marks.take();
        marks.round_done();
        assert!(flush.await.unwrap());
        // Nothing under way: the next round is enough.
        let flush = tokio::spawn({
            let marks = marks.clone();
            async move { marks.flush(Duration::from_secs(5)).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        marks.take();
        marks.round_done();
        assert!(flush.await.unwrap());
    }
}
