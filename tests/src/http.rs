//! A minimal HTTP/1.1 GET for tests of the control plane's web console.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The status code and body of `GET path` on `addr`.
pub async fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await?;
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, body.to_string()))
}

/// The console's status object.
pub async fn status(addr: SocketAddr) -> serde_json::Value {
    let (code, body) = get(addr, "/api/status").await.expect("console answers");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("status is JSON")
}
