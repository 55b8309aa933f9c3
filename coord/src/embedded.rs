//! The embedded backend: registrations and elections in this process's
//! memory with the same lease semantics (an entry lives while its holder
//! keeps it, elections are first-come among live candidates). Shared by
//! cloning; it cannot coordinate separate processes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, oneshot, watch};

use super::{CoordError, Coordination, Lease};

#[derive(Clone, Default)]
pub struct EmbeddedCoordination {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    changed: Notify,
}

#[derive(Default)]
struct State {
    next: u64,
    keys: BTreeMap<String, (u64, String)>,
    /// Election → (holder token, candidate).
    leaders: BTreeMap<String, (u64, String)>,
    /// Durable records (kept for the life of the process).
    records: BTreeMap<String, String>,
}

impl EmbeddedCoordination {
    /// A lease whose drop runs `release`.
    fn lease(&self, release: impl FnOnce(&mut State) + Send + 'static) -> Lease {
        let (guard, dropped) = oneshot::channel::<()>();
        let (held, lost) = watch::channel(false);
        let inner = self.inner.clone();
        tokio::spawn(async move {
            // An embedded lease is never lost; it ends when its guard drops.
            let _held = held;
            let _ = dropped.await;
            release(&mut inner.state.lock().expect("coordination state"));
            inner.changed.notify_waiters();
        });
        Lease {
            lost,
            _guard: guard,
        }
    }
}

#[tonic::async_trait]
impl Coordination for EmbeddedCoordination {
    async fn put(&self, key: &str, value: &str) -> Result<(), CoordError> {
        let mut s = self.inner.state.lock().expect("coordination state");
        s.records.insert(key.to_string(), value.to_string());
        Ok(())
    }

    async fn compare_and_put(
        &self,
        key: &str,
        expected: Option<&str>,
        value: &str,
    ) -> Result<bool, CoordError> {
        let mut s = self.inner.state.lock().expect("coordination state");
        if s.records.get(key).map(String::as_str) != expected {
            return Ok(false);
        }
        s.records.insert(key.to_string(), value.to_string());
        Ok(true)
    }

    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool, CoordError> {
        let mut s = self.inner.state.lock().expect("coordination state");
        if s.records.get(key).map(String::as_str) != Some(expected) {
            return Ok(false);
        }
        s.records.remove(key);
        Ok(true)
    }

    async fn records(&self, prefix: &str) -> Result<BTreeMap<String, String>, CoordError> {
        let s = self.inner.state.lock().expect("coordination state");
        Ok(s.records
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    async fn register(&self, key: &str, value: &str, _ttl: Duration) -> Result<Lease, CoordError> {
        let token = {
            let mut s = self.inner.state.lock().expect("coordination state");
            s.next += 1;
            let token = s.next;
            s.keys.insert(key.to_string(), (token, value.to_string()));
            token
        };
        let key = key.to_string();
        Ok(self.lease(move |s| {
            if s.keys.get(&key).is_some_and(|(t, _)| *t == token) {
                s.keys.remove(&key);
            }
        }))
    }

    async fn list(&self, prefix: &str) -> Result<BTreeMap<String, String>, CoordError> {
        let s = self.inner.state.lock().expect("coordination state");
        Ok(s.keys
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, (_, v))| (k.clone(), v.clone()))
            .collect())
    }

    async fn campaign(
        &self,
        election: &str,
        candidate: &str,
        _ttl: Duration,
    ) -> Result<Lease, CoordError> {
        loop {
            let notified = self.inner.changed.notified();
            let won = {
                let mut s = self.inner.state.lock().expect("coordination state");
                if s.leaders.contains_key(election) {
                    None
                } else {
                    s.next += 1;
                    let token = s.next;
                    s.leaders
                        .insert(election.to_string(), (token, candidate.to_string()));
                    Some(token)
                }
            };
            if let Some(token) = won {
                let election = election.to_string();
                return Ok(self.lease(move |s| {
                    if s.leaders.get(&election).is_some_and(|(t, _)| *t == token) {
                        s.leaders.remove(&election);
                    }
                }));
            }
            notified.await;
        }
    }

    async fn leader(&self, election: &str) -> Result<Option<String>, CoordError> {
        let s = self.inner.state.lock().expect("coordination state");
        Ok(s.leaders.get(election).map(|(_, c)| c.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CELLS_PREFIX;

    #[tokio::test]
    async fn registrations_and_leadership_end_with_their_lease() {
        let c = EmbeddedCoordination::default();
        let ttl = Duration::from_secs(1);
        let a = c
            .register(&format!("{CELLS_PREFIX}eu/c1"), "http://a", ttl)
            .await
            .unwrap();
        let _b = c
            .register(&format!("{CELLS_PREFIX}eu/c2"), "http://b", ttl)
            .await
            .unwrap();
        assert_eq!(c.list(CELLS_PREFIX).await.unwrap().len(), 2);
        drop(a);
        tokio::time::timeout(Duration::from_secs(2), async {
            while c.list(CELLS_PREFIX).await.unwrap().len() != 1 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap();

        let first = c.campaign("e", "one", ttl).await.unwrap();
        assert_eq!(c.leader("e").await.unwrap().as_deref(), Some("one"));
        let c2 = c.clone();
        let second =
            tokio::spawn(async move { c2.campaign("e", "two", ttl).await.map(|_lease| ()) });
        tokio::task::yield_now().await;
        assert!(!second.is_finished(), "only one leader at a time");
        drop(first);
        tokio::time::timeout(Duration::from_secs(2), second)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}
