//! Coalesced read-index checks. A linearizable read needs the leader to
//! confirm its leadership (a heartbeat round) after the read arrived; every
//! read waiting while one round is in flight is served by the next round, so
//! a burst of reads costs one round instead of one each.

use openraft::error::{CheckIsLeaderError, RaftError};
use tokio::sync::{mpsc, oneshot};

use crate::types::{NodeId, Raft, RouterNode};

pub type CheckError = RaftError<NodeId, CheckIsLeaderError<NodeId, RouterNode>>;
type Waiter = oneshot::Sender<Result<(), CheckError>>;

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
    while let Some(first) = requests.recv().await {
        // Everyone who asked before this round starts shares it.
        let mut waiters = vec![first];
        while let Ok(w) = requests.try_recv() {
            waiters.push(w);
        }
        let result = raft.ensure_linearizable().await.map(|_| ());
        for w in waiters {
            let _ = w.send(result.clone());
        }
    }
}
