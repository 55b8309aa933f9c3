//! A real etcd (the `etcd` binary, Debian's etcd-server) started on free
//! loopback ports in a temp dir for the coordination tests; killed on drop.

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
        let etcd = Self {
            endpoint,
            child,
            _dir: dir,
        };
        let up = crate::eventually(Duration::from_secs(20), || {
            let endpoint = etcd.endpoint.clone();
            async move {
                match etcd_client::Client::connect([endpoint], None).await {
                    Ok(mut c) => c.status().await.is_ok(),
                    Err(_) => false,
                }
            }
        })
        .await;
        assert!(up, "etcd did not come up");
        etcd
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
