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

impl Etcd {
    pub async fn start() -> Self {
        for _ in 0..3 {
            if let Some(etcd) = Self::try_start().await {
                return etcd;
            }
        }
        panic!("etcd did not come up");
    }

    /// One try on fresh ports; `None` when etcd exits before it answers.
    async fn try_start() -> Option<Self> {
        let dir = tempfile::tempdir().expect("temp dir");
        let (client, peer) = (free_port(), free_port());
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
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
            if let Ok(mut c) = etcd_client::Client::connect([etcd.endpoint.clone()], None).await
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
