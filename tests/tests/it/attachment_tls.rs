//! The local file store's listener over TLS (`[attachments] tls`): the
//! signed URLs it hands out are `https`, a file goes up and comes down
//! verified through them, and a plaintext request gets no file.

use std::sync::Arc;

use cellmesh_cell::clock::SystemClock;
use cellmesh_proto::tls::{Peer, PublicTlsConfig, Role, SERVER_NAME};
use cellmesh_proto::v1::GetDownloadUrlRequest;
use cellmesh_tests::{TestCell, caller, create_group, text};

use crate::attachments::{files_of, message_at, no_progress, write_file};

#[tokio::test]
async fn the_file_listener_serves_its_signed_urls_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = cellmesh_deployment::dev::pki::Pki::create(dir.path()).unwrap();
    let issued = pki.issue(&Peer::new(Role::Cell, "files")).unwrap();
    // The certificate names SERVER_NAME: the URLs do too, on a port
    // picked here.
    let port = cellmesh_tests::free_port();
    let cell = TestCell::start_with(
        |c| {
            c.attachments.http_listen = format!("127.0.0.1:{port}");
            c.attachments.public_url = format!("https://{SERVER_NAME}:{port}");
            c.attachments.tls = PublicTlsConfig {
                cert_file: issued.cert_file.clone(),
                key_file: issued.key_file.clone(),
            };
        },
        Arc::new(SystemClock),
    )
    .await;
    let ca = std::fs::read(&issued.ca_file).unwrap();
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .resolve(SERVER_NAME, ([127, 0, 0, 1], port).into())
        .build()
        .unwrap();

    let mut client = cell.client().await;
    let conversation = create_group(&mut client, 1, 1, &[2]).await;
    let path = write_file(dir.path(), "contract.bin", 150_000, 9);
    let a = files_of(&cell, 1, 1)
        .await
        .with_http(http.clone())
        .upload(
            conversation,
            &path,
            "application/octet-stream",
            None,
            &mut no_progress(),
        )
        .await
        .expect("uploaded over TLS");
    let mut send = text(1, 1, conversation, "contract", "signed");
    send.attachment_ids = vec![a.attachment_id];
    let sent = client.send(send).await.unwrap().into_inner();
    let message = message_at(&mut client, 2, conversation, sent.seq).await;
    let mut bob = files_of(&cell, 1, 2).await.with_http(http);
    let out = tempfile::tempdir().unwrap();
    let written = bob
        .download(&message, out.path(), &mut no_progress())
        .await
        .expect("downloaded over TLS");
    assert_eq!(
        std::fs::read(&written[0]).unwrap(),
        std::fs::read(&path).unwrap()
    );

    let url = bob
        .client
        .get_download_url(GetDownloadUrlRequest {
            caller: caller(1, 2),
            conversation_id: conversation,
            seq: sent.seq,
            attachment_id: a.attachment_id,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .url;
    assert!(
        url.starts_with(&format!("https://{SERVER_NAME}:{port}/")),
        "{url}"
    );
    // The same URL in plaintext gets no file.
    let plain = url.replace(&format!("https://{SERVER_NAME}"), "http://127.0.0.1");
    let answer = reqwest::Client::new()
        .get(&plain)
        .timeout(std::time::Duration::from_secs(5))
        .send()
        .await;
    assert!(
        answer.as_ref().is_err() || !answer.as_ref().unwrap().status().is_success(),
        "a plaintext request got {answer:?}"
    );
}
