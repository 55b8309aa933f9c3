//! Open uploads travel with their conversation: after a move, a file
//! completed but not sent is sent at the new owner, and one cut off
//! half-way resumes there from its stored parts; the old owner's sweep
//! later forgets its records without taking the files the new owner's
//! messages carry.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::sync::Arc;

use cellmesh_cell::clock::{Clock, ManualClock, SystemClock};
use cellmesh_client::files::sha256_file;
use cellmesh_proto::v1::{
    ConversationKind, CreateConversationRequest, CreateUploadRequest, PullRequest,
};
use cellmesh_tests::TestCell;
use cellmesh_tests::deploy::{authed, deploy_with, messaging, migrator, text, token};

use crate::attachments::{edge_files, no_progress, region_stores, write_file};

const TENANT: u64 = 2;
const PART: u64 = 64 * 1024;
const SOURCE: &str = "eu-west/c2";
const TARGET: &str = "eu-west/c1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_uploads_move_with_their_conversation_and_finish_at_the_new_owner() {
    let stores = tempfile::tempdir().unwrap();
    let root = stores.path().to_path_buf();
    let tweak = |c: &mut cellmesh_cell::CellConfig| {
        region_stores(c, &root);
        c.attachments.part_bytes = PART;
        c.attachments.max_file_bytes = PART * 10_000;
    };
    let d = deploy_with(None, tweak).await;
    // The source shares eu-west's store with the target; the test turns
    // its clock to expire what it left behind.
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let source = TestCell::start_routed_clocked(
        SOURCE,
        d.cluster.endpoints(),
        tempfile::tempdir().unwrap(),
        tweak,
        clock.clone(),
    )
    .await;
    let routes = d.cluster.client().await;
    routes
        .apply(cellmesh_route_client::commands::assign_tenant(
            TenantId(TENANT),
            SOURCE,
            0,
        ))
        .await
        .unwrap();
    let (alice, bob) = (token(TENANT, 1), token(TENANT, 2));
    let mut m = messaging(&d.edge).await;
    let create = CreateConversationRequest {
        kind: ConversationKind::Group as i32,
        title: "plans".into(),
        member_ids: vec![2],
        ..Default::default()
    };
    let mut conversation = 0;
    for _ in 0..50 {
        match m.create_conversation(authed(create.clone(), &alice)).await {
            Ok(r) => {
                conversation = r.into_inner().conversation.unwrap().conversation_id;
                break;
            }
            // The edge has not seen the tenant's route yet.
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }
    assert_ne!(conversation, 0, "the conversation is created at {SOURCE}");

    // One file sent; one completed and not sent; another cut off after two
    // of its five parts.
    let endpoint = d.edge.endpoint();
    let dir = tempfile::tempdir().unwrap();
    let (early, _) = upload(
        &endpoint,
        &alice,
        conversation,
        dir.path(),
        "sent.bin",
        40_000,
    )
    .await;
    let mut send = text(conversation, "sent");
    send.attachment_ids = vec![early.attachment_id];
    m.send(authed(send, &alice)).await.unwrap();
    let done = write_file(dir.path(), "done.bin", 90_000, 1);
    let a = edge_files(&endpoint, &alice)
        .await
        .upload(
            conversation,
            &done,
            "application/octet-stream",
            None,
            &mut no_progress(),
        )
        .await
        .unwrap();
    let half = write_file(dir.path(), "half.bin", 300_000, 2);
    let (size, digest) = sha256_file(&half).await.unwrap();
    let mut files = edge_files(&endpoint, &alice).await;
    let upload = files
        .client
        .create_upload(CreateUploadRequest {
            conversation_id: conversation,
            name: "half.bin".into(),
            content_type: "application/octet-stream".into(),
            size,
            sha256: digest.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(upload.parts.len(), 5);
    let bytes = std::fs::read(&half).unwrap();
    let http = reqwest::Client::new();
    for part in &upload.parts[..2] {
        let start = (part.part_number as usize - 1) * PART as usize;
        let body = bytes[start..start + part.size as usize].to_vec();
        let put = http.put(&part.url).body(body).send().await.unwrap();
        assert!(put.status().is_success(), "{}", put.status());
    }

    migrator(&routes)
        .migrate_conversation(
            TenantId(TENANT),
            ConversationId(conversation),
            TARGET,
            |_| {},
        )
        .await
        .expect("the conversation moves");

    // At the new owner the half-done upload resumes after its stored
    // parts, and both files go out on one message.
    let state = dir.path().join("state");
    std::fs::write(&state, format!("{} {size} {digest}\n", upload.upload_id)).unwrap();
    let mut first_seen = None;
    let mut progress = |done: u64, _total: u64| {
        first_seen.get_or_insert(done);
    };
    let b = edge_files(&endpoint, &alice)
        .await
        .upload(
            conversation,
            &half,
            "application/octet-stream",
            Some(&state),
            &mut progress,
        )
        .await
        .expect("the upload resumes at the new owner");
    assert_eq!(b.attachment_id, upload.upload_id);
    assert_eq!(first_seen, Some(2 * PART), "resumed after the stored parts");
    let mut send = text(conversation, "both");
    send.attachment_ids = vec![a.attachment_id, b.attachment_id];
    let sent = m
        .send(authed(send, &alice))
        .await
        .expect("the moved uploads are sent at the new owner")
        .into_inner();
    // A file sent before the move may be named again after it.
    let mut again = text(conversation, "sent-again");
    again.attachment_ids = vec![early.attachment_id];
    m.send(authed(again, &alice))
        .await
        .expect("a file sent before the move is sent again at the new owner");

    // The source's records expire: its sweep forgets them, and that of the
    // file sent before the move, and leaves the files, which the new
    // owner's messages carry. The new owner counts all three.
    clock.advance_ms(2 * 86_400 * 1000);
    let source_service = &source.cell.service;
    source_service.sweep_uploads().await.unwrap();
    for id in [early.attachment_id, a.attachment_id, b.attachment_id] {
        assert!(
            source_service
                .store()
                .upload(TenantId(TENANT), id)
                .unwrap()
                .is_none(),
            "the source forgot upload {id}"
        );
    }
    let bytes_of = |files: Vec<(u64, u64)>| {
        files
            .into_iter()
            .find(|(t, _)| *t == TENANT)
            .map(|(_, b)| b)
    };
    assert_eq!(bytes_of(source_service.file_bytes().unwrap()), Some(0));
    let target_service = &d.cells[0].cell.service;
    target_service.sweep_uploads().await.unwrap();
    assert_eq!(
        bytes_of(target_service.file_bytes().unwrap()),
        Some(40_000 + 90_000 + 300_000)
    );
    let written = files_of_message(&mut m, &endpoint, &bob, conversation, sent.seq).await;
    assert_eq!(written, vec![std::fs::read(&done).unwrap(), bytes]);
}

/// The files of message `seq` of `conversation`, downloaded (and checked)
/// through the edge as `token`'s user, shortest first.
async fn files_of_message(
    m: &mut cellmesh_proto::v1::messaging_client::MessagingClient<tonic::transport::Channel>,
    endpoint: &str,
    token: &str,
    conversation: u64,
    seq: u64,
) -> Vec<Vec<u8>> {
    let page = m
        .pull(authed(
            PullRequest {
                conversation_id: conversation,
                since_seq: seq - 1,
                limit: 1,
                ..Default::default()
            },
            token,
        ))
        .await
        .unwrap()
        .into_inner();
    let out = tempfile::tempdir().unwrap();
    let written = edge_files(endpoint, token)
        .await
        .download(&page.messages[0], out.path(), &mut no_progress())
        .await
        .expect("the message's files download");
    let mut written: Vec<_> = written.iter().map(|p| std::fs::read(p).unwrap()).collect();
    written.sort_by_key(Vec::len);
    written
}

/// Uploads `name` (`len` bytes) as `token`'s user into `conversation`
/// through the edge, completed and not sent.
async fn upload(
    endpoint: &str,
    token: &str,
    conversation: u64,
    dir: &std::path::Path,
    name: &str,
    len: usize,
) -> (cellmesh_proto::v1::AttachmentRef, Vec<u8>) {
    let path = write_file(dir, name, len, len as u8);
    let a = edge_files(endpoint, token)
        .await
        .upload(
            conversation,
            &path,
            "application/octet-stream",
            None,
            &mut no_progress(),
        )
        .await
        .unwrap();
    (a, std::fs::read(&path).unwrap())
}

/// Starts tenant 1's move to us-east/c1 and stops it once the tenant's
/// history is copied (the move is resumed later).
async fn move_tenant_until_copied(routes: &cellmesh_route_client::client::RouteClient) {
    use cellmesh_control_plane::migration::{
        MigrationError, MigrationOptions, Migrator, StopPoint,
    };
    let stopping = Migrator::new(
        routes.clone(),
        cellmesh_proto::secret::ClusterSecret::new(cellmesh_tests::router::SECRET),
        MigrationOptions {
            stop_after: Some(StopPoint::Copied),
            ..MigrationOptions::default()
        },
    );
    let stopped = stopping
        .migrate_tenant(TenantId(1), "us-east/c1", 4, |_| {})
        .await;
    assert!(
        matches!(stopped, Err(MigrationError::Stopped(StopPoint::Copied))),
        "{stopped:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_move_carries_uploads_made_after_its_first_copy_round() {
    use cellmesh_tests::deploy::create_via_edge;
    let stores = tempfile::tempdir().unwrap();
    let root = stores.path().to_path_buf();
    let d = deploy_with(None, |c| region_stores(c, &root)).await;
    let routes = d.cluster.client().await;
    let (alice, bob) = (token(1, 1), token(1, 2));
    let mut m = messaging(&d.edge).await;
    let conversation = create_via_edge(&mut m, &alice, vec![2]).await;
    m.send(authed(text(conversation, "hello"), &alice))
        .await
        .unwrap();
    let endpoint = d.edge.endpoint();
    let dir = tempfile::tempdir().unwrap();
    let early = upload(
        &endpoint,
        &alice,
        conversation,
        dir.path(),
        "early.bin",
        50_000,
    )
    .await;

    // The move stops after its first copy round; then one more file is
    // uploaded, with no new message in the conversation.
    move_tenant_until_copied(&routes).await;
    let late = upload(
        &endpoint,
        &alice,
        conversation,
        dir.path(),
        "late.bin",
        60_000,
    )
    .await;
    let report = migrator(&routes)
        .migrate_tenant(TenantId(1), "us-east/c1", 4, |_| {})
        .await
        .expect("the move finishes");
    assert_eq!(
        (report.files.files, report.files.bytes),
        (2, 110_000),
        "both files came along to be copied into us-east"
    );

    // Both are sent at the new owner and download intact.
    let mut send = text(conversation, "both");
    send.attachment_ids = vec![early.0.attachment_id, late.0.attachment_id];
    let sent = m
        .send(authed(send, &alice))
        .await
        .expect("the uploads are sent in us-east")
        .into_inner();
    let written = files_of_message(&mut m, &endpoint, &bob, conversation, sent.seq).await;
    assert_eq!(written, vec![early.1, late.1]);
}

/// A tenant moving to another region, with senders writing, and its files
/// being copied (throttled) when the source cell's process is SIGKILLed:
/// the move resumes once the source is back, every file downloads intact
/// from the new region, and after the grace the source region's copies
/// are gone. The restarted source, no longer the owner, deletes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_killed_while_its_files_are_copied_loses_none() {
    use cellmesh_tests::deploy::{Senders, busy_cell_config, create_via_edge, start_edge};
    use cellmesh_tests::process::CellProcess;
    use cellmesh_tests::router::RouterCluster;
    const FILES: usize = 6;
    const SIZE: usize = 1 << 20;
    let stores = tempfile::tempdir().unwrap();
    let root = stores.path().to_path_buf();
    let cluster = RouterCluster::start(1, |_| {}).await;
    let routers = cluster.endpoints();
    let source_dir = tempfile::tempdir().unwrap();
    let mut config = busy_cell_config(
        source_dir.path(),
        "eu-west/c1",
        &routers,
        cellmesh_cell::config::ReplicationMode::Async,
    );
    region_stores(&mut config, &root);
    let mut source = CellProcess::start_configured(source_dir.path(), &config).await;
    // The target copies a megabyte a second: the copy outlasts the kill.
    let target = TestCell::start_routed_with(
        "us-east/c1",
        routers.clone(),
        tempfile::tempdir().unwrap(),
        |c| {
            region_stores(c, &root);
            c.attachments.source_grace_secs = 0;
            c.attachments.copy_bytes_per_sec = 1 << 20;
        },
    )
    .await;
    let routes = cluster.client().await;
    routes
        .apply(cellmesh_route_client::commands::assign_tenant(
            TenantId(1),
            "eu-west/c1",
            0,
        ))
        .await
        .unwrap();
    let edge = start_edge(routers.clone()).await;
    let endpoint = edge.endpoint();
    let alice = token(1, 10);
    let mut m = messaging(&edge).await;
    let conversation = create_via_edge(&mut m, &alice, vec![11]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut sent = Vec::new();
    for i in 0..FILES {
        let (a, bytes) = upload(
            &endpoint,
            &alice,
            conversation,
            dir.path(),
            &format!("f{i}.bin"),
            SIZE + i,
        )
        .await;
        let mut send = text(conversation, &format!("file-{i}"));
        send.attachment_ids = vec![a.attachment_id];
        m.send(authed(send, &alice)).await.unwrap();
        sent.push((a, bytes));
    }
    let senders = Senders::start(&edge, conversation, &[10, 11]);
    senders
        .until_acked(5, std::time::Duration::from_secs(10))
        .await;

    // The move copies the history and stops; the files keep copying.
    move_tenant_until_copied(&routes).await;
    let copies = || target.cell.service.file_copies(TenantId(1), 0).unwrap();
    assert!(
        cellmesh_tests::eventually(std::time::Duration::from_secs(20), || async {
            copies().files_copied >= 1
        })
        .await,
        "a first file is copied"
    );
    assert!(
        copies().files_pending >= 1,
        "files are still copying: {:?}",
        copies()
    );
    source.kill();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let source = CellProcess::start_configured(source_dir.path(), &config).await;

    let report = migrator(&routes)
        .migrate_tenant(TenantId(1), "us-east/c1", 4, |_| {})
        .await
        .expect("the move resumes and finishes");
    assert_eq!(report.files.files_pending, 0, "{:?}", report.files);
    senders
        .until_acked(senders.acked() + 5, std::time::Duration::from_secs(10))
        .await;
    senders.finish(std::time::Duration::from_millis(200)).await;

    // Every file downloads intact from us-east.
    let bob = token(1, 11);
    let page = m
        .pull(authed(
            PullRequest {
                conversation_id: conversation,
                since_seq: 0,
                limit: 100,
                direction: cellmesh_proto::v1::Direction::Forward as i32,
                ..Default::default()
            },
            &bob,
        ))
        .await
        .unwrap()
        .into_inner();
    let with_files: Vec<_> = page
        .messages
        .iter()
        .filter(|m| !m.attachments.is_empty())
        .collect();
    assert_eq!(with_files.len(), FILES);
    let out = tempfile::tempdir().unwrap();
    let mut files = edge_files(&endpoint, &bob).await;
    for (message, (a, bytes)) in with_files.iter().zip(&sent) {
        assert_eq!(message.attachments[0].attachment_id, a.attachment_id);
        let written = files
            .download(message, out.path(), &mut no_progress())
            .await
            .expect("downloads after the move");
        assert_eq!(&std::fs::read(&written[0]).unwrap(), bytes);
        assert!(root.join("us-east/objects").join(&a.object_key).exists());
    }
    // The restarted source deletes nothing; after the grace the target
    // deletes the source region's copies.
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    for (a, _) in &sent {
        assert!(root.join("eu-west/objects").join(&a.object_key).exists());
    }
    target.cell.service.sweep_uploads().await.unwrap();
    for (a, _) in &sent {
        assert!(
            !root.join("eu-west/objects").join(&a.object_key).exists(),
            "the source region's copy of {} is gone",
            a.object_key
        );
    }
    source.stop().await;
}
