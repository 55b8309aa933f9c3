//! Minimal HTTP/1.1 for tests: a GET for the control plane's web console,
//! and a webhook receiver for notifications.

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

/// A webhook receiver on a loopback port: it answers its first `failures`
/// requests with 500, then 200; every request body is sent to the channel.
/// Returns its URL.
pub async fn webhook(failures: usize) -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
    responder(move |served| {
        let status = if served <= failures {
            "500 Internal Server Error"
        } else {
            "200 OK"
        };
        (status, String::new())
    })
    .await
}

/// A receiver on a loopback port that answers its `n`th request (from 1)
/// with `answer(n)`: a status line and a JSON body. Every request body is
/// sent to the channel. Returns its URL.
pub async fn responder(
    answer: impl Fn(usize) -> (&'static str, String) + Send + 'static,
) -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/notify", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut served = 0;
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let Some(body) = read_body(&mut socket).await else {
                continue;
            };
            served += 1;
            let (status, reply) = answer(served);
            let _ = tx.send(body);
            let _ = socket
                .write_all(
                    format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reply}",
                        reply.len()
                    )
                    .as_bytes(),
                )
                .await;
        }
    });
    (url, rx)
}

/// Reads one request's headers, then its body by content-length.
async fn read_body(socket: &mut tokio::net::TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = socket.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(at) = text.find("\r\n\r\n") {
            let len = text[..at]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                })
                .unwrap_or(0);
            if buf.len() >= at + 4 + len {
                return Some(text[at + 4..at + 4 + len].to_string());
            }
        }
    }
}
