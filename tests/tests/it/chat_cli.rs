//! `cellmesh chat` as a person uses it: the real binary against a running
//! cell — create, send, `tail` printing live messages, and `search`.

use std::process::Stdio;
use std::time::Duration;

use cellmesh_tests::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

async fn chat(endpoint: &str, user: u64, args: &[&str]) -> String {
    let out = Command::new(cellmesh_bin())
        .args([
            "chat",
            "--endpoint",
            endpoint,
            "--tenant",
            "8",
            "--user",
            &user.to_string(),
        ])
        .args(args)
        .output()
        .await
        .expect("run cellmesh chat");
    assert!(
        out.status.success(),
        "chat {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn a_person_can_create_send_and_tail() {
    let cell = TestCell::start().await;
    let endpoint = cell.endpoint.clone();
    let created = chat(
        &endpoint,
        1,
        &["create", "--members", "2", "--title", "pair"],
    )
    .await;
    let conv = created
        .split_whitespace()
        .nth(1)
        .expect("conversation id printed")
        .to_string();

    let mut tail = Command::new(cellmesh_bin())
        .args([
            "chat",
            "--endpoint",
            &endpoint,
            "--tenant",
            "8",
            "--user",
            "2",
            "tail",
            "--device",
            "term",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("run chat tail");
    let mut lines = BufReader::new(tail.stdout.take().unwrap()).lines();

    let sent = chat(&endpoint, 1, &["send", "-c", &conv, "hello", "from", "one"]).await;
    assert!(sent.starts_with("sent seq 1"), "{sent}");
    let seen = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("hello from one") {
                return line;
            }
        }
        String::new()
    })
    .await
    .expect("tail shows the message");
    assert!(
        seen.contains(&format!("[{conv}]")) && seen.contains("user 1"),
        "{seen}"
    );

    let history = chat(&endpoint, 2, &["history", "-c", &conv]).await;
    assert!(history.contains("hello from one"), "{history}");
    let list = chat(&endpoint, 2, &["list"]).await;
    assert!(list.contains("pair") && list.contains("unread 1"), "{list}");
    let read = chat(&endpoint, 2, &["read", "-c", &conv]).await;
    assert!(read.contains("unread 0"), "{read}");
    let receipts = chat(&endpoint, 1, &["receipts", "-c", &conv, "--seq", "1", "2"]).await;
    assert!(
        receipts.contains("seq 1: read by 2 of 2") && receipts.contains("seq 2: read by 0 of 2"),
        "{receipts}"
    );
    // Search finds it once indexed, the match in brackets.
    let mut found = String::new();
    for _ in 0..40 {
        found = chat(&endpoint, 2, &["search", "FROM", "one"]).await;
        if !found.contains("no messages found") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(found.contains("hello [from] [one]"), "{found}");
    cell.stop().await;
}

#[tokio::test]
async fn a_person_can_send_a_file_and_another_download_it() {
    let cell = TestCell::start().await;
    let endpoint = cell.endpoint.clone();
    let created = chat(&endpoint, 1, &["create", "--members", "2"]).await;
    let conv = created.split_whitespace().nth(1).unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("notes.txt");
    std::fs::write(&file, "minutes of the meeting\n".repeat(1000)).unwrap();
    let sent = chat(
        &endpoint,
        1,
        &[
            "send",
            "-c",
            &conv,
            "--file",
            file.to_str().unwrap(),
            "see",
            "attached",
        ],
    )
    .await;
    let seq = sent
        .split_whitespace()
        .nth(2)
        .expect("seq printed")
        .to_string();
    let history = chat(&endpoint, 2, &["history", "-c", &conv]).await;
    assert!(
        history.contains("[file notes.txt 23000 bytes]"),
        "{history}"
    );
    let out = dir.path().join("downloads");
    let got = chat(
        &endpoint,
        2,
        &[
            "download",
            "-c",
            &conv,
            "--seq",
            &seq,
            "--out",
            out.to_str().unwrap(),
        ],
    )
    .await;
    assert!(got.contains("SHA-256 verified"), "{got}");
    assert_eq!(
        std::fs::read(out.join("notes.txt")).unwrap(),
        std::fs::read(&file).unwrap()
    );
}
