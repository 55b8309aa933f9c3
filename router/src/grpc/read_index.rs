//! Coalesced read-index checks. A linearizable read needs the leader to
//! confirm its leadership (a heartbeat round) after the read arrived; every
//! read waiting while one round is in flight is served by the next round, so
//! a burst of reads costs one round instead of one each. Up to
//! [`ROUNDS_IN_FLIGHT`] rounds overlap, so a read that arrives mid-round
//! starts the next one instead of waiting for the current one to end.

use openraft::error::{CheckIsLeaderError, RaftError};
use tokio::sync::{mpsc, oneshot};

use super::coalesce::Limits;
use crate::types::{NodeId, Raft, RouterNode};

pub type CheckError = RaftError<NodeId, CheckIsLeaderError<NodeId, RouterNode>>;
type Waiter = oneshot::Sender<Result<(), CheckError>>;

/// Leadership checks under way at once.
const ROUNDS_IN_FLIGHT: usize = 2;

#[derive(Clone)]
pub struct ReadIndex {
    requests: mpsc::UnboundedSender<Waiter>,
}

impl ReadIndex {
    pub fn new(raft: Raft) -> Self {
        let limits = Limits {
            in_flight: ROUNDS_IN_FLIGHT,
            max_batch: usize::MAX,
            wide: 1,
        };
        let requests = super::coalesce::start(limits, move |waiters| check(raft.clone(), waiters));
        Self { requests }
    }

    /// Resolves once a leadership check that started after this call has
    /// succeeded and this replica has applied up to its read index.
    pub async fn ensure(&self, raft: &Raft) -> Result<(), CheckError> {
        let (tx, rx) = oneshot::channel();
        if self.requests.send(tx).is_err() {
            return raft.ensure_linearizable().await.map(|_| ());
        }
        match rx.await {
            Ok(result) => result,
            Err(_) => raft.ensure_linearizable().await.map(|_| ()),
        }
    }
}

/// One leadership check for everyone who asked before it started.
async fn check(raft: Raft, waiters: Vec<Waiter>) {
    let result = raft.ensure_linearizable().await.map(|_| ());
    for w in waiters {
        let _ = w.send(result.clone());
    }
}
