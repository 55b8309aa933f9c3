//! Routes a failover moved to this cell, and when it may write them. The
//! cell a route was failed over from may have confirmed its owner lease
//! just before the switch and go on writing, from a view of the table that
//! does not show the switch yet, until that lease runs out: the control
//! plane can call a cell failed while the route table still answers it (a
//! partition between the two). So a route taken over is written only once
//! the longest lease any cell announced (a tenth more for clock drift) has
//! passed since this cell learned of the switch — after the switch
//! committed, so later than any lease the failed cell confirmed without
//! seeing it.

use std::collections::HashMap;
use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

use cellmesh_proto::reason::Reason;
use cellmesh_route_client::client::WatchBatch;
use cellmesh_route_client::table::{Change, Entry, Key};
use tokio::sync::broadcast;

use crate::error::CellError;

/// Per route a failover moved here: its epoch then, and when this cell
/// learned of it.
#[derive(Default)]
pub struct Takeovers {
    seen: Mutex<HashMap<Key, (u64, Instant)>>,
}

impl Takeovers {
    /// Notes the routes `changes` move to `cell` by failover (and forgets
    /// those moved on), until `takeovers` is dropped.
    pub async fn watch(
        takeovers: Weak<Self>,
        mut changes: broadcast::Receiver<WatchBatch>,
        cell: String,
    ) {
        loop {
            let (_, changes) = match changes.recv().await {
                Ok(batch) => batch,
                // Missed ones are noted when first checked.
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            };
            let Some(this) = takeovers.upgrade() else {
                return;
            };
            let now = Instant::now();
            let mut seen = this.seen.lock().expect("takeovers");
            for change in changes {
                if let Change::Route(entry) = change {
                    if taken_over(&cell, &entry) {
                        note(&mut seen, &entry, now);
                    } else {
                        seen.remove(&entry.key);
                    }
                }
            }
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
        let learned = note(
            &mut self.seen.lock().expect("takeovers"),
            entry,
            Instant::now(),
        );
        let left = wait.saturating_sub(learned.elapsed());
        if left.is_zero() {
            return Ok(());
        }
        Err(CellError::RetryLater {
            reason: Reason::PreviousOwnerLease,
            message: format!(
                "{} was failed over here {} ms ago; the cell it left may write until its owner lease ({} ms) has run out",
                entry.key,
                learned.elapsed().as_millis(),
                wait.as_millis()
            ),
            retry_after: left.min(Duration::from_millis(500)),
        })
    }
}

/// Whether a failover moved `entry` to `cell` (and no move since).
fn taken_over(cell: &str, entry: &Entry) -> bool {
    entry.cell == cell && entry.floor_margin > 0 && entry.failed_from.is_some()
}

/// Notes that `entry` was failed over here, as of `now` unless noted at its
/// epoch before; when this cell learned of it.
fn note(seen: &mut HashMap<Key, (u64, Instant)>, entry: &Entry, now: Instant) -> Instant {
    let noted = seen.entry(entry.key).or_insert((entry.epoch, now));
    if noted.0 != entry.epoch {
        *noted = (entry.epoch, now);
    }
    noted.1
}
