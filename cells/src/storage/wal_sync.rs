//! Which WAL syncs have begun and ended, so that the fan-out lane can write
//! without a sync of its own and wait for one of the message lane's. A
//! RocksDB write with `sync` syncs every log file written before it (all of
//! `logs_`), so a sync that begins after a write has returned makes that
//! write durable. While sends flow, the message lane syncs about once a
//! millisecond; the fan-out lane's batches ride on those syncs instead of
//! queueing their own in front of the sends' (on a busy cell the fan-out
//! lane's syncs were close to half of the disk's). When the message lane is
//! idle nothing would come, and the fan-out lane syncs itself.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The longest a write waits for another lane's sync before it syncs
/// itself: a message-lane cycle is about a millisecond under load.
pub(super) const COVER_WAIT: Duration = Duration::from_millis(5);

#[derive(Default)]
struct State {
    /// Syncs begun, counting from 1.
    begun: u64,
    /// The highest sync number that has ended without error.
    ended: u64,
    /// The message lane waits for work (it will not sync until some comes).
    idle: bool,
}

#[derive(Default)]
pub(super) struct WalSyncs {
    state: Mutex<State>,
    changed: Condvar,
}

/// A sync in progress, from [`WalSyncs::begin`].
#[must_use]
pub(super) struct Sync(u64);

/// The point a write's durability is measured from, from [`WalSyncs::mark`].
#[derive(Clone, Copy, Debug)]
pub(super) struct Mark(u64);

impl WalSyncs {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("wal sync state")
    }

    /// Called just before a synced write or a `flush_wal(true)` starts.
    pub(super) fn begin(&self) -> Sync {
        let mut state = self.lock();
        state.begun += 1;
        Sync(state.begun)
    }

    /// The sync `sync` ended: `ok` if every log file written before it
    /// began is now on disk.
    pub(super) fn end(&self, sync: Sync, ok: bool) {
        let mut state = self.lock();
        if ok {
            state.ended = state.ended.max(sync.0);
        }
        drop(state);
        self.changed.notify_all();
    }

    /// Read after a write without sync returned: any sync begun later
    /// covers it.
    pub(super) fn mark(&self) -> Mark {
        Mark(self.lock().begun)
    }

    /// The message lane is waiting for work (`true`) or has some.
    pub(super) fn set_idle(&self, idle: bool) {
        let mut state = self.lock();
        if state.idle == idle {
            return;
        }
        state.idle = idle;
        drop(state);
        if idle {
            self.changed.notify_all();
        }
    }

    /// Waits until a sync begun after `mark` ends (`true`), or gives up at
    /// once when the message lane is idle, or after `patience` (`false`:
    /// the caller syncs itself).
    pub(super) fn covered(&self, mark: Mark, patience: Duration) -> bool {
        let deadline = Instant::now() + patience;
        let mut state = self.lock();
        loop {
            if state.ended > mark.0 {
                return true;
            }
            // Idle with no sync begun since the mark: none is coming.
            if state.idle && state.begun == mark.0 {
                return false;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .expect("wal sync state")
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn only_a_sync_begun_after_the_mark_covers_it() {
        let syncs = WalSyncs::default();
        let before = syncs.begin();
        let mark = syncs.mark();
        // A sync already under way when the write returned does not count.
        syncs.end(before, true);
        assert!(!syncs.covered(mark, Duration::from_millis(20)));
        let after = syncs.begin();
        syncs.end(after, true);
        assert!(syncs.covered(mark, Duration::ZERO));
    }

    #[test]
    fn a_failed_sync_covers_nothing() {
        let syncs = WalSyncs::default();
        let mark = syncs.mark();
        let failed = syncs.begin();
        syncs.end(failed, false);
        assert!(!syncs.covered(mark, Duration::from_millis(20)));
    }

    #[test]
    fn an_idle_message_lane_sends_the_writer_to_sync_itself_at_once() {
        let syncs = WalSyncs::default();
        syncs.set_idle(true);
        let started = Instant::now();
        assert!(!syncs.covered(syncs.mark(), Duration::from_secs(10)));
        assert!(started.elapsed() < Duration::from_secs(1));
        // Idle, but a sync begun after the mark is still under way: wait.
        let mark = syncs.mark();
        let pending = syncs.begin();
        let syncs = Arc::new(syncs);
        let ender = {
            let syncs = syncs.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                syncs.end(pending, true);
            })
        };
        assert!(syncs.covered(mark, Duration::from_secs(10)));
        ender.join().unwrap();
    }

    #[test]
    fn a_waiter_is_woken_by_the_sync_that_covers_it_or_by_idleness() {
        let syncs = Arc::new(WalSyncs::default());
        let mark = syncs.mark();
        let waiter = {
            let syncs = syncs.clone();
            std::thread::spawn(move || syncs.covered(mark, Duration::from_secs(10)))
        };
        std::thread::sleep(Duration::from_millis(20));
        let sync = syncs.begin();
        syncs.end(sync, true);
        assert!(waiter.join().unwrap());

        let mark = syncs.mark();
        let started = Instant::now();
        let waiter = {
            let syncs = syncs.clone();
            std::thread::spawn(move || syncs.covered(mark, Duration::from_secs(10)))
        };
        std::thread::sleep(Duration::from_millis(20));
        syncs.set_idle(true);
        assert!(!waiter.join().unwrap());
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
