//! A graceful stop's last step before the cell's streams close: wait until
//! every event written to the outbox has been applied by the processor
//! (members' sync queues, pushes to online devices) and both forward queues
//! are empty, so nothing acknowledged waits in this cell for its restart or
//! its backfill. Bounded: it gives up once nothing progresses for a while
//! (a home that cannot be reached, a queue outage) or at a hard limit.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::PipelineError;
use crate::storage::{ForwardQueue, Store};

/// How the pipeline stood when the drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Everything written is applied and forwarded.
    pub complete: bool,
    /// Outbox events written but not applied.
    pub unapplied: u64,
    /// Forwards still queued (lower bound: the first one's presence).
    pub forwards_waiting: bool,
}

/// What a drain watches.
#[derive(Clone)]
pub struct Drain {
    pub(super) store: Arc<Store>,
    pub(super) processed: watch::Receiver<u64>,
}

/// How often a drain looks again.
const LOOK_EVERY: Duration = Duration::from_millis(20);

impl Drain {
    fn state(&self) -> Result<(u64, u64, Option<u64>), PipelineError> {
        let written = *self.store.outbox_written().borrow();
        let processed = *self.processed.borrow();
        let first_forward = [ForwardQueue::Homes, ForwardQueue::Standbys]
            .into_iter()
            .map(|q| Ok(self.store.forwards(q, 0, 1)?.first().map(|(id, _)| *id)))
            .collect::<Result<Vec<_>, PipelineError>>()?
            .into_iter()
            .flatten()
            .min();
        Ok((written, processed, first_forward))
    }

    /// Waits until the pipeline holds nothing unapplied or unforwarded and
    /// nothing new was written for `settle` (a request that was executing
    /// when the stop began commits meanwhile); gives up after `patience`
    /// without progress or `limit` in all.
    pub async fn run(&self, settle: Duration, patience: Duration, limit: Duration) -> Drained {
        let started = Instant::now();
        let mut last = None;
        let mut progressed = started;
        let mut quiet_since = None;
        loop {
            let (written, processed, first_forward) = match self.state() {
                Ok(state) => state,
                Err(e) => {
                    tracing::warn!(error = %e, "drain: cannot read the pipeline's state");
                    return Drained {
                        complete: false,
                        unapplied: 0,
                        forwards_waiting: false,
                    };
                }
            };
            let now = Instant::now();
            let drained = processed >= written && first_forward.is_none();
            let state = (written, processed, first_forward);
            if last != Some(state) {
                progressed = now;
                quiet_since = None;
                last = Some(state);
            }
            if drained {
                let since = *quiet_since.get_or_insert(now);
                if now - since >= settle {
                    return Drained {
                        complete: true,
                        unapplied: 0,
                        forwards_waiting: false,
                    };
                }
            }
            if !drained && (now - progressed >= patience || now - started >= limit) {
                return Drained {
                    complete: false,
                    unapplied: written.saturating_sub(processed),
                    forwards_waiting: first_forward.is_some(),
                };
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }
}
