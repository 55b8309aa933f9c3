//! The etcd backend: a lease per registration or campaign, kept alive at a
//! third of its TTL; registrations are keys bound to the lease; elections use
//! etcd's election service. Dropping the [`Lease`] revokes it.

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use tokio::sync::{oneshot, watch};

use super::{CoordError, Coordination, Lease};

fn store(e: etcd_client::Error) -> CoordError {
    CoordError::Store(e.to_string())
}

pub struct EtcdCoordination {
    client: Client,
}

impl EtcdCoordination {
    pub async fn connect(endpoints: &[String]) -> Result<Self, CoordError> {
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(5));
        let client = Client::connect(endpoints, Some(options))
            .await
            .map_err(store)?;
        Ok(Self { client })
    }

    /// Grants a lease and keeps it alive until the guard drops (then
    /// revokes it) or a keep-alive fails (then `lost` turns true).
    async fn lease(&self, ttl: Duration) -> Result<(i64, Lease), CoordError> {
        let mut client = self.client.clone();
        let ttl_secs = ttl.as_secs().max(1) as i64;
        let id = client
            .lease_grant(ttl_secs, None)
            .await
            .map_err(store)?
            .id();
        let (mut keeper, mut responses) = client.lease_keep_alive(id).await.map_err(store)?;
        let (lost_tx, lost) = watch::channel(false);
        let (guard, mut dropped) = oneshot::channel::<()>();
        let every = Duration::from_millis((ttl_secs as u64 * 1000 / 3).max(100));
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut dropped => {
                        let _ = client.lease_revoke(id).await;
                        return;
                    }
                    _ = tokio::time::sleep(every) => {}
                }
                let alive = keeper.keep_alive().await.is_ok()
                    && matches!(responses.message().await, Ok(Some(r)) if r.ttl() > 0);
                if !alive {
                    lost_tx.send_replace(true);
                    return;
                }
            }
        });
        Ok((
            id,
            Lease {
                lost,
                _guard: guard,
            },
        ))
    }
}

#[tonic::async_trait]
impl Coordination for EtcdCoordination {
    async fn put(&self, key: &str, value: &str) -> Result<(), CoordError> {
        let mut client = self.client.clone();
        client.put(key, value, None).await.map_err(store)?;
        Ok(())
    }

    async fn compare_and_put(
        &self,
        key: &str,
        expected: Option<&str>,
        value: &str,
    ) -> Result<bool, CoordError> {
        let guard = match expected {
            Some(v) => Compare::value(key, CompareOp::Equal, v),
            // A key that was never written has version 0.
            None => Compare::version(key, CompareOp::Equal, 0),
        };
        let txn = Txn::new()
            .when([guard])
            .and_then([TxnOp::put(key, value, None)]);
        let response = self.client.clone().txn(txn).await.map_err(store)?;
        Ok(response.succeeded())
    }

    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool, CoordError> {
        let txn = Txn::new()
            .when([Compare::value(key, CompareOp::Equal, expected)])
            .and_then([TxnOp::delete(key, None)]);
        let response = self.client.clone().txn(txn).await.map_err(store)?;
        Ok(response.succeeded())
    }

    async fn records(&self, prefix: &str) -> Result<BTreeMap<String, String>, CoordError> {
        let mut client = self.client.clone();
        let response = client
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .map_err(store)?;
        let mut out = BTreeMap::new();
        for kv in response.kvs() {
            out.insert(
                kv.key_str().map_err(store)?.to_string(),
                kv.value_str().map_err(store)?.to_string(),
            );
        }
        Ok(out)
    }

    async fn register(&self, key: &str, value: &str, ttl: Duration) -> Result<Lease, CoordError> {
        let (id, lease) = self.lease(ttl).await?;
        self.client
            .clone()
            .put(key, value, Some(PutOptions::new().with_lease(id)))
            .await
            .map_err(store)?;
        Ok(lease)
    }

    async fn list(&self, prefix: &str) -> Result<BTreeMap<String, String>, CoordError> {
        let response = self
            .client
            .clone()
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .map_err(store)?;
        Ok(response
            .kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    String::from_utf8_lossy(kv.value()).into_owned(),
                )
            })
            .collect())
    }

    async fn campaign(
        &self,
        election: &str,
        candidate: &str,
        ttl: Duration,
    ) -> Result<Lease, CoordError> {
        let (id, lease) = self.lease(ttl).await?;
        self.client
            .clone()
            .campaign(election, candidate, id)
            .await
            .map_err(store)?;
        Ok(lease)
    }

    async fn leader(&self, election: &str) -> Result<Option<String>, CoordError> {
        match self.client.clone().leader(election).await {
            Ok(r) => Ok(r
                .kv()
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())),
            // etcd answers "election: no leader" as an error.
            Err(e) if e.to_string().contains("no leader") => Ok(None),
            Err(e) => Err(store(e)),
        }
    }
}
