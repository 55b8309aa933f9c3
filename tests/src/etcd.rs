//! A real etcd (the `etcd` binary, Debian's etcd-server) started on free
//! loopback ports in a temp dir for the coordination tests; killed on drop.
//! A port is free when it is picked, not when etcd binds it: an etcd that
//! exits before it answers (another process took the port) is started
//! again on fresh ports.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use crate::free_port;

pub struct Etcd {
    pub endpoint: String,
    child: Child,
    _dir: TempDir,
}

/// What an etcd serving mutual TLS is given: the CA, its certificate and
/// key (naming 127.0.0.1), and the CA's revocation list; and what a
/// client presents to it.
pub struct EtcdTls {
    pub server: cellmesh_proto::tls::TlsConfig,
    pub client: cellmesh_proto::tls::TlsConfig,
}

impl Etcd {
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// An etcd on `https://` that takes only clients presenting a
    /// certificate its CA signed.
    pub async fn start_tls(tls: &EtcdTls) -> Self {
        Self::start_with(Some(tls)).await
    }

    async fn start_with(tls: Option<&EtcdTls>) -> Self {
        for _ in 0..3 {
            if let Some(etcd) = Self::try_start(tls).await {
                return etcd;
            }
        }
        panic!("etcd did not come up");
    }

    /// One try on fresh ports; `None` when etcd exits before it answers.
    async fn try_start(tls: Option<&EtcdTls>) -> Option<Self> {
        let dir = tempfile::tempdir().expect("temp dir");
        let (client, peer) = (free_port(), free_port());
        let scheme = if tls.is_some() { "https" } else { "http" };
        let endpoint = format!("{scheme}://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let tls_args = tls.map_or_else(Vec::new, |t| {
            cellmesh_coord::etcd::server_tls_args(&t.server)
        });
        let child = Command::new("etcd")
            .args(tls_args)
            .args([
                "--name",
                "test",
                "--data-dir",
                &dir.path().join("data").to_string_lossy(),
                "--listen-client-urls",
                &endpoint,
                "--advertise-client-urls",
                &endpoint,
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
                "--initial-cluster",
                &format!("test={peer_url}"),
                "--log-level",
                "error",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the etcd binary (scripts/test.sh installs etcd-server)");
        let mut etcd = Self {
            endpoint,
            child,
            _dir: dir,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if !matches!(etcd.child.try_wait(), Ok(None)) {
                return None;
            }
            let options = tls.map(|t| client_options(&t.client));
            if let Ok(mut c) = etcd_client::Client::connect([etcd.endpoint.clone()], options).await
                && c.status().await.is_ok()
            {
                return Some(etcd);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Options of a client presenting `tls`'s certificate to an etcd whose
/// certificate its CA signed.
pub fn client_options(tls: &cellmesh_proto::tls::TlsConfig) -> etcd_client::ConnectOptions {
    let tls = cellmesh_coord::etcd::tls_options(tls).expect("the certificate files");
    etcd_client::ConnectOptions::new().with_tls(tls)
}
