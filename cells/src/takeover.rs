//! Routes a failover moved to this cell, and when it may write them. The
//! cell a route was failed over from may have confirmed its owner lease
//! just before the switch and go on writing, from a view of the table that
//! does not show the switch yet, until that lease runs out: the control
//! plane can call a cell failed while the route table still answers it (a
//! partition between the two). So a route taken over is written once the
//! longest lease any cell announced (a tenth more for clock drift) has
//! passed since the earlier of
//! - this cell learning of the switch (after it committed, so later than
//!   any lease the failed cell confirmed without seeing it), and
//! - this cell learning that the table fenced the cell the route was taken
//!   from (marked it Degraded or Down, see `CellStatus::fenced`), if that
//!   cell is of a release that honours the fence and stayed fenced since:
//!   no renewal answered after the mark counts. The control plane fences a
//!   failed cell a lease before it switches its routes, so the new owner
//!   writes at once.
//!
//! The owner each route had before is followed from the table's changes;
//! where it is not known (changes missed) only the switch counts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use cellmesh_proto::reason::Reason;
use cellmesh_proto::version::{FENCED_LEASE, Version};
use cellmesh_route_client::client::WatchBatch;
use cellmesh_route_client::table::{CellInfo, Change, Entry, Key};
use tokio::sync::broadcast;

use crate::error::CellError;

#[derive(Default)]
pub struct Takeovers {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Per route a failover moved here: its epoch then, when this cell
    /// learned of it, and the cell it was taken from (when known).
    taken: HashMap<Key, Taken>,
    /// Every route's owner as last seen.
    owners: HashMap<Key, Arc<str>>,
    /// Cells fenced by the table that honour the fence, and since when
    /// this cell has seen them fenced without a break.
    fenced: HashMap<Arc<str>, Instant>,
    /// Cell ids, shared by `owners`.
    names: HashMap<String, Arc<str>>,
}

struct Taken {
    epoch: u64,
    learned: Instant,
    from: Option<Arc<str>>,
}

impl Takeovers {
    /// Notes the routes `changes` move to `cell` by failover (and forgets
    /// those moved on), and the cells the table fences, until `takeovers`
    /// is dropped; `snapshot` gives the whole table as changes, to start
    /// from and to start again from when changes were missed.
    pub async fn watch(
        takeovers: Weak<Self>,
        mut changes: broadcast::Receiver<WatchBatch>,
        cell: String,
        snapshot: impl Fn() -> Vec<Change>,
    ) {
        let mut fresh = true;
        loop {
            let Some(this) = takeovers.upgrade() else {
                return;
            };
            if fresh {
                let mut state = this.state.lock().expect("takeovers");
                // What happened before is not known: no route's previous
                // owner, no fence older than now.
                state.owners.clear();
                state.fenced.clear();
                state.apply(&cell, &snapshot(), Instant::now(), false);
                fresh = false;
            }
            drop(this);
            let changes = match changes.recv().await {
                Ok((_, changes)) => changes,
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    fresh = true;
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            };
            let Some(this) = takeovers.upgrade() else {
                return;
            };
            let mut state = this.state.lock().expect("takeovers");
            state.apply(&cell, &changes, Instant::now(), true);
        }
    }

    /// Whether `cell` may write `entry` now, `longest_lease` giving the
    /// longest owner lease (asked only for a route taken over):
    /// `PREVIOUS_OWNER_LEASE` while a failover's predecessor may still
    /// write it.
    pub fn check(
        &self,
        cell: &str,
        entry: &Entry,
        longest_lease: impl FnOnce() -> Duration,
    ) -> Result<(), CellError> {
        if !taken_over(cell, entry) {
            return Ok(());
        }
        let lease = longest_lease();
        let wait = lease + lease / 10;
        let since = self
            .state
            .lock()
            .expect("takeovers")
            .safe_since(entry, Instant::now());
        let left = wait.saturating_sub(since.elapsed());
        if left.is_zero() {
            return Ok(());
        }
        Err(CellError::RetryLater {
            reason: Reason::PreviousOwnerLease,
            message: format!(
                "{} was failed over here; the cell it left may write for {} ms more, until its owner lease ({} ms) has run out",
                entry.key,
                left.as_millis(),
                wait.as_millis()
            ),
            retry_after: left.min(Duration::from_millis(500)),
        })
    }
}

impl State {
    /// Applies table changes seen `now`; `known`: the owners noted before
    /// are those just before these changes (not after a gap).
    fn apply(&mut self, cell: &str, changes: &[Change], now: Instant, known: bool) {
        for change in changes {
            match change {
                Change::Cell(info) => self.cell(info, now),
                Change::Route(entry) => {
                    let name = self.name(&entry.cell);
                    let before = self.owners.insert(entry.key, name);
                    if taken_over(cell, entry) {
                        let from = before.filter(|b| known && **b != *cell);
                        self.note(entry, now, from);
                    } else {
                        self.taken.remove(&entry.key);
                    }
                }
                Change::Removed(key) => {
                    self.owners.remove(key);
                    self.taken.remove(key);
                }
                Change::ClusterVersion(_) => {}
            }
        }
    }

    fn cell(&mut self, info: &CellInfo, now: Instant) {
        let honours = Version::reported(&info.version).is_some_and(|v| v >= FENCED_LEASE);
        let name = self.name(&info.id);
        if info.status.fenced() && honours {
            self.fenced.entry(name).or_insert(now);
        } else {
            self.fenced.remove(&name);
        }
    }

    fn name(&mut self, id: &str) -> Arc<str> {
        if let Some(name) = self.names.get(id) {
            return name.clone();
        }
        let name: Arc<str> = id.into();
        self.names.insert(id.to_string(), name.clone());
        name
    }

    /// Notes that `entry` was failed over here from `from`, as of `now`
    /// unless noted at its epoch before.
    fn note(&mut self, entry: &Entry, now: Instant, from: Option<Arc<str>>) -> &Taken {
        let taken = self.taken.entry(entry.key).or_insert(Taken {
            epoch: entry.epoch,
            learned: now,
            from: from.clone(),
        });
        if taken.epoch != entry.epoch {
            *taken = Taken {
                epoch: entry.epoch,
                learned: now,
                from,
            };
        }
        taken
    }

    /// From when the wait for `entry`, taken over, counts: the earlier of
    /// learning of the switch and of its predecessor's fence. Kept: a
    /// fence lifted later (the cell came back) does not undo what it
    /// proved.
    fn safe_since(&mut self, entry: &Entry, now: Instant) -> Instant {
        let from = self.note(entry, now, None).from.clone();
        let fenced = from.and_then(|from| self.fenced.get(&from).copied());
        let taken = self.taken.get_mut(&entry.key).expect("noted");
        if let Some(fenced) = fenced {
            taken.learned = taken.learned.min(fenced);
        }
        taken.learned
    }
}

/// Whether a failover moved `entry` to `cell` (and no move since).
fn taken_over(cell: &str, entry: &Entry) -> bool {
    entry.cell == cell && entry.floor_margin > 0 && entry.failed_from.is_some()
}

#[cfg(test)]
mod tests;
