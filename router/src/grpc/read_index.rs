//! Coalesced read-index checks. A linearizable read needs the leader to
//! confirm its leadership (a heartbeat round) after the read arrived; every
//! read waiting while one round is in flight is served by the next round, so
//! a burst of reads costs one round instead of one each. Up to
//! [`ROUNDS_IN_FLIGHT`] rounds overlap, so a read that arrives mid-round
//! starts the next one instead of waiting for the current one to end.

use openraft::error::{CheckIsLeaderError, RaftError};
use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, oneshot};

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
        let (requests, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(raft, rx));
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

async fn run(raft: Raft, mut requests: mpsc::UnboundedReceiver<Waiter>) {
    let slots = Arc::new(Semaphore::new(ROUNDS_IN_FLIGHT));
    while let Some(first) = requests.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        // Everyone who asked before this round starts shares it.
        let mut waiters = vec![first];
        while let Ok(w) = requests.try_recv() {
            waiters.push(w);
        }
        let raft = raft.clone();
        tokio::spawn(async move {
            let result = raft.ensure_linearizable().await.map(|_| ());
            for w in waiters {
                let _ = w.send(result.clone());
            }
            drop(slot);
        });
    }
}
