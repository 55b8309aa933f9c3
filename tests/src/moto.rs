//! A real S3 API for the cold tier's tests: `moto_server` (PyPI moto) on a
//! free loopback port with one bucket; killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::free_port;

pub struct Moto {
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    pub bucket: String,
    child: Child,
}

impl Moto {
    /// Starts the server and creates `bucket`. A port is free when it is
    /// picked, not when the server binds it: a server that exits before it
    /// answers (another process took the port) is started again elsewhere.
    pub async fn start(bucket: &str) -> Self {
        for _ in 0..3 {
            if let Some(moto) = Self::try_start(bucket).await {
                return moto;
            }
        }
        panic!("moto_server did not come up");
    }

    /// One try on a fresh port; `None` when the server exits first.
    async fn try_start(bucket: &str) -> Option<Self> {
        let port = free_port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server (scripts/test.sh installs PyPI moto[server])");
        let mut moto = Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            bucket: bucket.to_string(),
            child,
        };
        // moto accepts unsigned requests: a plain PUT creates the bucket.
        let put = format!(
            "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if !matches!(moto.child.try_wait(), Ok(None)) {
                return None;
            }
            if request(port, &put).await == Some(200) {
                return Some(moto);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// Configures `config`'s cold tier to use this bucket.
    pub fn configure(&self, config: &mut cellmesh_cell::CellConfig) {
        config.tiering.store = cellmesh_cell::cold::TierStore::S3;
        config.tiering.s3 = self.s3("cells");
    }

    /// The settings of this bucket, objects under `prefix`.
    pub fn s3(&self, prefix: &str) -> cellmesh_cell::cold::S3Config {
        cellmesh_cell::cold::S3Config {
            bucket: self.bucket.clone(),
            endpoint: self.endpoint.clone(),
            region: "us-east-1".into(),
            access_key_id: "testing".into(),
            secret_access_key: "testing".into(),
            allow_http: true,
            prefix: prefix.into(),
        }
    }
}

async fn request(port: u16, text: &str) -> Option<u16> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    stream.write_all(text.as_bytes()).await.ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.ok()?;
    reply.split_whitespace().nth(1)?.parse().ok()
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
