//! Idempotent requests that are executing right now. The first request with
//! a given key leads: it checks storage and executes. A concurrent repeat
//! follows: it waits for the leader's outcome instead of executing again.
//! Together with the stored idempotency records this makes a repeated
//! `client_req_id` return the same answer however the repeats interleave.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex};

use cellmesh_proto::storage::v1::IdempotencyRecord;
use tokio::sync::watch;

use crate::storage::IdemKey;

#[derive(Debug, Clone)]
enum Outcome {
    Pending,
    Done(IdempotencyRecord),
    /// The leader failed; its effect was not stored.
    Failed,
}

const SHARDS: usize = 32;

type Shard = Mutex<HashMap<IdemKey, watch::Receiver<Outcome>>>;

pub(crate) struct Inflight {
    shards: Arc<Vec<Shard>>,
    hasher: RandomState,
}

pub(crate) enum Begin {
    Leader(Leader),
    Follower(Follower),
}

/// Held by the request that executes; dropping it without
/// [`Leader::complete`] tells followers the attempt failed.
pub(crate) struct Leader {
    shards: Arc<Vec<Shard>>,
    shard: usize,
    key: IdemKey,
    tx: watch::Sender<Outcome>,
    done: bool,
}

pub(crate) struct Follower(watch::Receiver<Outcome>);

impl Inflight {
    pub fn new() -> Self {
        Self {
            shards: Arc::new((0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect()),
            hasher: RandomState::new(),
        }
    }

    pub fn begin(&self, key: IdemKey) -> Begin {
        let shard = self.hasher.hash_one(&key) as usize % SHARDS;
        let mut map = self.shards[shard].lock().expect("inflight shard");
        if let Some(rx) = map.get(&key) {
            return Begin::Follower(Follower(rx.clone()));
        }
        let (tx, rx) = watch::channel(Outcome::Pending);
        map.insert(key.clone(), rx);
        Begin::Leader(Leader {
            shards: self.shards.clone(),
            shard,
            key,
            tx,
            done: false,
        })
    }
}

impl Leader {
    /// Publishes the stored answer. Call only once it is durable.
    pub fn complete(mut self, record: IdempotencyRecord) {
        self.tx.send_replace(Outcome::Done(record));
        self.done = true;
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        if !self.done {
            self.tx.send_replace(Outcome::Failed);
        }
        self.shards[self.shard]
            .lock()
            .expect("inflight shard")
            .remove(&self.key);
    }
}

impl Follower {
    /// The leader's answer, or `None` if the leader failed.
    pub async fn wait(mut self) -> Option<IdempotencyRecord> {
        let outcome = self
            .0
            .wait_for(|o| !matches!(o, Outcome::Pending))
            .await
            .map(|o| o.clone())
            .unwrap_or(Outcome::Failed);
        match outcome {
            Outcome::Done(record) => Some(record),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::IdemKind;
    use cellmesh_proto::ids::{TenantId, UserId};

    fn key(id: &str) -> IdemKey {
        IdemKey {
            kind: IdemKind::Send,
            tenant: TenantId(1),
            user: UserId(2),
            client_req_id: id.into(),
        }
    }

    #[tokio::test]
    async fn followers_get_the_leaders_answer() {
        let inflight = Inflight::new();
        let Begin::Leader(leader) = inflight.begin(key("a")) else {
            panic!("first is leader")
        };
        let Begin::Follower(f) = inflight.begin(key("a")) else {
            panic!("second follows")
        };
        assert!(matches!(inflight.begin(key("b")), Begin::Leader(_)));
        let waiter = tokio::spawn(f.wait());
        leader.complete(IdempotencyRecord {
            seq: 9,
            ..Default::default()
        });
        assert_eq!(waiter.await.unwrap().unwrap().seq, 9);
        // Once finished, the key leads again (storage answers from now on).
        assert!(matches!(inflight.begin(key("a")), Begin::Leader(_)));
    }

    #[tokio::test]
    async fn a_failed_leader_releases_its_followers() {
        let inflight = Inflight::new();
        let Begin::Leader(leader) = inflight.begin(key("a")) else {
            panic!()
        };
        let Begin::Follower(f) = inflight.begin(key("a")) else {
            panic!()
        };
        drop(leader);
        assert!(f.wait().await.is_none());
    }
}
