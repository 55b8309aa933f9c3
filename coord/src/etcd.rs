//! The etcd backend: a lease per registration or campaign, kept alive at a
//! third of its TTL; registrations are keys bound to the lease; elections use
//! etcd's election service. Dropping the [`Lease`] revokes it. `https://`
//! endpoints are reached over mutual TLS with the process's own `[tls]`
//! (the deployment's CA, its certificate and key; the server verified as
//! [`SERVER_NAME`], which the etcd members' certificates carry beside their
//! host names).

use std::collections::BTreeMap;
use std::time::Duration;

use cellmesh_proto::tls::SERVER_NAME;
use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use tokio::sync::{oneshot, watch};

use super::{CoordError, Coordination, Lease};

fn store(e: etcd_client::Error) -> CoordError {
    CoordError::Store(e.to_string())
}

pub struct EtcdCoordination {
    client: Client,
}

/// Client options for `endpoints`: mutual TLS with this process's
/// installed `[tls]` when they are `https://` (refused without it, or when
/// only some are). The files are read here: a renewed certificate is
/// presented to etcd from the next connect.
pub fn options(endpoints: &[String]) -> Result<etcd_client::ConnectOptions, CoordError> {
    let options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5));
    let installed = cellmesh_proto::tls::installed().map(|i| &i.config);
    match (cellmesh_proto::config::etcd_over_tls(endpoints), installed) {
        (Some(false), _) => Ok(options),
        (Some(true), Some(tls)) => Ok(options.with_tls(tls_options(tls)?)),
        _ => Err(CoordError::Store(
            "https:// etcd endpoints need [tls] (this process's certificate), and all of them https://"
                .into(),
        )),
    }
}

/// A client's TLS presenting `tls`'s certificate to etcd members, whose
/// certificates it verifies against `tls`'s CA as [`SERVER_NAME`].
pub fn tls_options(
    tls: &cellmesh_proto::tls::TlsConfig,
) -> Result<etcd_client::TlsOptions, CoordError> {
    let read = |path: &str| {
        std::fs::read(path).map_err(|e| CoordError::Store(format!("cannot read {path}: {e}")))
    };
    Ok(etcd_client::TlsOptions::new()
        .domain_name(SERVER_NAME)
        .ca_certificate(etcd_client::Certificate::from_pem(read(&tls.ca_file)?))
        .identity(etcd_client::Identity::from_pem(
            read(&tls.cert_file)?,
            read(&tls.key_file)?,
        )))
}

/// The flags that make an etcd member serve clients over mutual TLS with
/// `server` (its certificate and key, the CA clients must chain to, and the
/// CA's revocation list when there is one).
pub fn server_tls_args(server: &cellmesh_proto::tls::TlsConfig) -> Vec<String> {
    let mut args = vec!["--client-cert-auth".to_string()];
    for (flag, file) in [
        ("--cert-file", &server.cert_file),
        ("--key-file", &server.key_file),
        ("--trusted-ca-file", &server.ca_file),
        ("--client-crl-file", &server.crl_file),
    ] {
        if !file.is_empty() {
            args.extend([flag.to_string(), file.clone()]);
        }
    }
    args
}

impl EtcdCoordination {
    /// A client of `endpoints`, over mutual TLS when they are `https://`
    /// (see [`options`]).
    pub async fn connect(endpoints: &[String]) -> Result<Self, CoordError> {
        let client = Client::connect(endpoints, Some(options(endpoints)?))
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
