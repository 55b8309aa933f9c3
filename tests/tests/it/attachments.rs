//! Files and images end to end over real gRPC and real HTTP: reserve,
//! PUT to the signed URLs (the cell's own listener for the local store, a
//! real S3 API for the bucket), complete with the digest checked on the
//! stored bytes, send, and another member downloads and verifies; an
//! interrupted multipart upload resumes; every bad input is refused with
//! its reason and nothing stays half-way; recall and the sweep delete.

use cellmesh_proto::ids::TenantId;
use cellmesh_proto::reason::Reason;
use std::path::Path;
use std::sync::Arc;

use cellmesh_cell::clock::{Clock, ManualClock, SystemClock};
use cellmesh_client::connect::Authed;
use cellmesh_client::files::{Files, sha256_file};
use cellmesh_proto::v1::attachments_client::AttachmentsClient;
use cellmesh_proto::v1::{
    CompleteUploadRequest, CreateUploadRequest, Direction, ErrorCode, GetDownloadUrlRequest,
    GetUploadRequest, Message, PullRequest, RecallRequest, UploadState,
};
use cellmesh_tests::deploy::assert_reason;
use cellmesh_tests::{Client, TestCell, caller, create_group, text};

const TENANT: u64 = 1;

pub(crate) async fn files_of(cell: &TestCell, tenant: u64, user: u64) -> Files {
    let client = cellmesh_client::connect::attachments_as(&cell.endpoint, None)
        .await
        .expect("attachments client");
    Files::new(client, caller(tenant, user))
}

pub(crate) fn write_file(dir: &Path, name: &str, len: usize, seed: u8) -> std::path::PathBuf {
    let path = dir.join(name);
    let bytes: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    std::fs::write(&path, bytes).unwrap();
    path
}

pub(crate) async fn message_at(
    client: &mut Client,
    user: u64,
    conversation: u64,
    seq: u64,
) -> Message {
    client
        .pull(PullRequest {
            caller: caller(TENANT, user),
            conversation_id: conversation,
            since_seq: seq + 1,
            direction: Direction::Backward as i32,
            limit: 1,
        })
        .await
        .unwrap()
        .into_inner()
        .messages
        .into_iter()
        .find(|m| m.seq == seq)
        .expect("the message")
}

pub(crate) fn no_progress() -> impl FnMut(u64, u64) + Send {
    |_, _| {}
}

/// Gives the cell its region's store under `root` and a way to the other
/// region's (as with a bucket per region).
pub(crate) fn region_stores(c: &mut cellmesh_cell::CellConfig, root: &Path) {
    let region = c.cell_id.split('/').next().unwrap().to_string();
    c.attachments.local_dir = root.join(&region);
    for other in ["eu-west", "us-east"] {
        let files = cellmesh_cell::attachments::RegionFiles {
            local_dir: root.join(other),
            ..Default::default()
        };
        c.attachments.regions.insert(other.into(), files);
    }
}

/// A client of the files API through the edge at `endpoint`, with `token`.
pub(crate) async fn edge_files(endpoint: &str, token: &str) -> Files {
    let client = cellmesh_client::connect::attachments_as(endpoint, Some(token))
        .await
        .unwrap();
    Files::new(client, None)
}

/// Uploads the file at `path` into `conversation` through the edge at
/// `endpoint` as `token`'s user: its attachment id.
pub(crate) async fn upload_via_edge(
    endpoint: &str,
    token: &str,
    conversation: u64,
    path: &Path,
) -> u64 {
    let kind = "application/octet-stream";
    edge_files(endpoint, token)
        .await
        .upload(conversation, path, kind, None, &mut no_progress())
        .await
        .expect("uploaded through the edge")
        .attachment_id
}

/// Upload, send, download by another member, verified; then a
/// non-member, another tenant and a recalled message get no URL, and the
/// recalled file is gone after its grace.
async fn round_trip(cell: &TestCell, size: usize) {
    let mut client = cell.client().await;
    let conversation = create_group(&mut client, TENANT, 1, &[2, 3]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "report.bin", size, 7);
    let (_, digest) = sha256_file(&path).await.unwrap();

    let mut alice = files_of(cell, TENANT, 1).await;
    let a = alice
        .upload(
            conversation,
            &path,
            "application/octet-stream",
            None,
            &mut no_progress(),
        )
        .await
        .expect("upload");
    assert_eq!(
        (a.size, a.sha256.as_str(), a.name.as_str()),
        (size as u64, digest.as_str(), "report.bin")
    );
    let mut send = text(TENANT, 1, conversation, "with-file", "");
    send.attachment_ids = vec![a.attachment_id];
    let sent = client
        .send(send.clone())
        .await
        .expect("send with a file")
        .into_inner();
    // A re-send answers as before.
    let again = client.send(send).await.unwrap().into_inner();
    assert!(again.duplicate && again.seq == sent.seq);

    let message = message_at(&mut client, 2, conversation, sent.seq).await;
    assert_eq!(message.attachments, vec![a.clone()]);
    let mut bob = files_of(cell, TENANT, 2).await;
    let out = tempfile::tempdir().unwrap();
    let written = bob
        .download(&message, out.path(), &mut no_progress())
        .await
        .expect("download");
    assert_eq!(written, vec![out.path().join("report.bin")]);
    assert_eq!(sha256_file(&written[0]).await.unwrap().1, digest);

    // Ranged read of the signed URL.
    let url = bob
        .client
        .get_download_url(GetDownloadUrlRequest {
            caller: caller(TENANT, 2),
            conversation_id: conversation,
            seq: sent.seq,
            attachment_id: a.attachment_id,
            thumbnail: false,
        })
        .await
        .unwrap()
        .into_inner();
    let ranged = reqwest::Client::new()
        .get(&url.url)
        .header("Range", "bytes=10-19")
        .send()
        .await
        .unwrap();
    assert_eq!(ranged.status().as_u16(), 206);
    let expected: Vec<u8> = std::fs::read(&path).unwrap()[10..20].to_vec();
    assert_eq!(ranged.bytes().await.unwrap().to_vec(), expected);

    // Not a member; another tenant: nothing handed out, nothing revealed.
    let mut mallory = files_of(cell, TENANT, 4).await;
    let err = mallory
        .client
        .get_download_url(GetDownloadUrlRequest {
            caller: caller(TENANT, 4),
            conversation_id: conversation,
            seq: sent.seq,
            attachment_id: a.attachment_id,
            thumbnail: false,
        })
        .await
        .unwrap_err();
    assert_reason(
        &err,
        ErrorCode::PermissionDenied,
        Reason::NotAMember.as_str(),
    );
    let mut other = files_of(cell, 2, 1).await;
    let err = other
        .client
        .get_download_url(GetDownloadUrlRequest {
            caller: caller(2, 1),
            conversation_id: conversation,
            seq: sent.seq,
            attachment_id: a.attachment_id,
            thumbnail: false,
        })
        .await
        .unwrap_err();
    assert_reason(
        &err,
        ErrorCode::NotFound,
        Reason::ConversationNotFound.as_str(),
    );

    // Recalled: no URL, the ref is gone from the message.
    client
        .recall(RecallRequest {
            caller: caller(TENANT, 1),
            conversation_id: conversation,
            seq: sent.seq,
        })
        .await
        .unwrap();
    let err = bob
        .client
        .get_download_url(GetDownloadUrlRequest {
            caller: caller(TENANT, 2),
            conversation_id: conversation,
            seq: sent.seq,
            attachment_id: a.attachment_id,
            thumbnail: false,
        })
        .await
        .unwrap_err();
    assert_reason(
        &err,
        ErrorCode::InvalidArgument,
        Reason::MessageRecalled.as_str(),
    );
    assert!(
        message_at(&mut client, 2, conversation, sent.seq)
            .await
            .attachments
            .is_empty()
    );
}

#[tokio::test]
async fn a_file_goes_up_and_comes_down_verified_through_the_cells_own_urls() {
    let cell = TestCell::start_with(
        |c| c.attachments.recall_grace_secs = 0,
        Arc::new(SystemClock),
    )
    .await;
    round_trip(&cell, 100_000).await;
    // The recalled file goes with the next sweep.
    let objects = cell.dir.path().join("attachments/objects");
    let count = || walk(&objects);
    assert_eq!(count(), 1);
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert_eq!(cell.cell.service.sweep_uploads().await.unwrap(), 1);
    assert_eq!(count(), 0);
}

fn walk(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            if e.path().is_dir() {
                walk(&e.path())
            } else {
                1
            }
        })
        .sum()
}

#[tokio::test]
async fn an_interrupted_multipart_upload_resumes_from_the_stored_parts() {
    let cell = TestCell::start_with(
        |c| {
            // At most 10,000 parts per file.
            c.attachments.part_bytes = 64 * 1024;
            c.attachments.max_file_bytes = 64 * 1024 * 10_000;
        },
        Arc::new(SystemClock),
    )
    .await;
    let mut client = cell.client().await;
    let conversation = create_group(&mut client, TENANT, 1, &[2]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "big.bin", 300_000, 3);
    let (size, digest) = sha256_file(&path).await.unwrap();
    let mut alice = files_of(&cell, TENANT, 1).await;
    let upload = alice
        .client
        .create_upload(CreateUploadRequest {
            caller: caller(TENANT, 1),
            conversation_id: conversation,
            name: "big.bin".into(),
            content_type: "application/octet-stream".into(),
            size,
            sha256: digest.clone(),
            client_req_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(upload.parts.len(), 5);
    // The client stored two parts, then was killed.
    let bytes = std::fs::read(&path).unwrap();
    let http = reqwest::Client::new();
    for part in &upload.parts[..2] {
        let start = (part.part_number as usize - 1) * 64 * 1024;
        let body = bytes[start..start + part.size as usize].to_vec();
        let put = http.put(&part.url).body(body).send().await.unwrap();
        assert!(put.status().is_success(), "{}", put.status());
    }
    // Completing now says what is missing.
    let err = alice
        .client
        .complete_upload(CompleteUploadRequest {
            caller: caller(TENANT, 1),
            conversation_id: conversation,
            upload_id: upload.upload_id,
        })
        .await
        .unwrap_err();
    assert_reason(
        &err,
        ErrorCode::InvalidArgument,
        Reason::UploadIncomplete.as_str(),
    );
    let resumed = alice
        .client
        .get_upload(GetUploadRequest {
            caller: caller(TENANT, 1),
            conversation_id: conversation,
            upload_id: upload.upload_id,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resumed.stored_parts, vec![1, 2]);
    assert_eq!(
        resumed
            .parts
            .iter()
            .map(|p| p.part_number)
            .collect::<Vec<_>>(),
        vec![3, 4, 5]
    );
    // The client resumes from its state file: only the missing parts go up.
    let state = dir.path().join("state");
    std::fs::write(&state, format!("{} {size} {digest}\n", upload.upload_id)).unwrap();
    let mut first_seen = None;
    let mut progress = |done: u64, _total: u64| {
        first_seen.get_or_insert(done);
    };
    let a = alice
        .upload(
            conversation,
            &path,
            "application/octet-stream",
            Some(&state),
            &mut progress,
        )
        .await
        .unwrap();
    assert_eq!(
        first_seen,
        Some(2 * 64 * 1024),
        "resumed after the stored parts"
    );
    assert_eq!(a.attachment_id, upload.upload_id);
    assert!(!state.exists());
    let mut send = text(TENANT, 1, conversation, "big", "here");
    send.attachment_ids = vec![a.attachment_id];
    let sent = client.send(send).await.unwrap().into_inner();
    let message = message_at(&mut client, 2, conversation, sent.seq).await;
    let out = tempfile::tempdir().unwrap();
    let mut bob = files_of(&cell, TENANT, 2).await;
    let written = bob
        .download(&message, out.path(), &mut no_progress())
        .await
        .unwrap();
    assert_eq!(std::fs::read(&written[0]).unwrap(), bytes);
}

fn reserve(
    conversation: u64,
    user: u64,
    name: &str,
    content_type: &str,
    size: u64,
    sha256: &str,
) -> CreateUploadRequest {
    CreateUploadRequest {
        caller: caller(TENANT, user),
        conversation_id: conversation,
        name: name.into(),
        content_type: content_type.into(),
        size,
        sha256: sha256.into(),
        client_req_id: String::new(),
    }
}

/// Reservations refused before anything is stored, each with its reason:
/// (conversation offset, user, name, content type, size, digest, code,
/// reason).
async fn refused_reservations(files: &mut Files, conversation: u64, sha: &str) {
    let octets = "application/octet-stream";
    let cases = [
        (
            0,
            1,
            "a.bin",
            octets,
            2_000_000,
            sha,
            ErrorCode::InvalidArgument,
            Reason::AttachmentTooLarge,
        ),
        (
            0,
            1,
            "a.bin",
            octets,
            0,
            sha,
            ErrorCode::InvalidArgument,
            Reason::AttachmentTooLarge,
        ),
        (
            0,
            1,
            "a.bin",
            octets,
            10,
            "xyz",
            ErrorCode::InvalidArgument,
            Reason::BadDigest,
        ),
        (
            0,
            1,
            "../etc/passwd",
            octets,
            10,
            sha,
            ErrorCode::InvalidArgument,
            Reason::BadAttachmentName,
        ),
        (
            0,
            1,
            "a.exe",
            "application/x-msdownload",
            10,
            sha,
            ErrorCode::PermissionDenied,
            Reason::ContentTypeNotAllowed,
        ),
        (
            0,
            3,
            "a.png",
            "image/png",
            10,
            sha,
            ErrorCode::PermissionDenied,
            Reason::NotAMember,
        ),
        (
            1,
            1,
            "a.png",
            "image/png",
            10,
            sha,
            ErrorCode::NotFound,
            Reason::ConversationNotFound,
        ),
    ];
    for (offset, user, name, content_type, size, digest, code, reason) in cases {
        let request = reserve(
            conversation + offset,
            user,
            name,
            content_type,
            size,
            digest,
        );
        let err = files.client.create_upload(request).await.unwrap_err();
        assert_reason(&err, code, reason.as_str());
    }
}

/// Sends naming a reservation not completed, an unknown id, another
/// user's upload: refused.
async fn sends_naming_unusable_uploads(client: &mut Client, conversation: u64, upload: u64) {
    let mut send = text(TENANT, 1, conversation, "early", "x");
    send.attachment_ids = vec![upload];
    let err = client.send(send.clone()).await.unwrap_err();
    assert_reason(
        &err,
        ErrorCode::InvalidArgument,
        Reason::AttachmentNotComplete.as_str(),
    );
    send.attachment_ids = vec![upload + 1];
    let err = client.send(send.clone()).await.unwrap_err();
    assert_reason(
        &err,
        ErrorCode::InvalidArgument,
        Reason::AttachmentNotFound.as_str(),
    );
    let mut bobs = text(TENANT, 2, conversation, "bob", "x");
    bobs.attachment_ids = vec![upload];
    let err = client.send(bobs).await.unwrap_err();
    assert_reason(
        &err,
        ErrorCode::InvalidArgument,
        Reason::AttachmentNotFound.as_str(),
    );
}

/// The signed URL: too many bytes, a forged signature.
async fn bent_urls_are_refused(http: &reqwest::Client, url: &str) {
    let too_long = http.put(url).body(vec![0u8; 900_001]).send().await.unwrap();
    assert_eq!(too_long.status().as_u16(), 413);
    assert!(
        too_long
            .text()
            .await
            .unwrap()
            .contains(Reason::AttachmentSizeMismatch.as_str())
    );
    let forged = url.replace("&sig=", "&sig=00");
    let answer = http
        .put(&forged)
        .body(vec![0u8; 900_000])
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 403);
    assert!(
        answer
            .text()
            .await
            .unwrap()
            .contains(Reason::BadSignature.as_str())
    );
}

/// After its URL expires, a reservation gets a fresh one; unfinished
/// past its expiry, it is swept with its bytes and frees its quota.
async fn expiries(
    cell: &TestCell,
    clock: &ManualClock,
    c: &mut AttachmentsClient<Authed>,
    (conversation, upload_id, url): (u64, u64, &str),
    sha: &str,
) {
    let http = reqwest::Client::new();
    // Expired: refused; GetUpload issues a fresh URL.
    clock.advance_ms(2 * 3_600_000);
    let answer = http.put(url).body(vec![0u8; 900_000]).send().await.unwrap();
    assert_eq!(answer.status().as_u16(), 403);
    assert!(
        answer
            .text()
            .await
            .unwrap()
            .contains(Reason::SignatureExpired.as_str())
    );
    let fresh = c
        .get_upload(GetUploadRequest {
            caller: caller(TENANT, 1),
            conversation_id: conversation,
            upload_id,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(fresh.state, UploadState::Reserved as i32);
    assert_ne!(&fresh.parts[0].url, url);
    assert!(
        http.put(&fresh.parts[0].url)
            .body(vec![0u8; 900_000])
            .send()
            .await
            .unwrap()
            .status()
            .is_success()
    );

    // An unfinished reservation expires and is swept with its bytes.
    clock.advance_ms(25 * 3_600_000);
    let err = c
        .complete_upload(CompleteUploadRequest {
            caller: caller(TENANT, 1),
            conversation_id: conversation,
            upload_id,
        })
        .await
        .unwrap_err();
    assert_reason(
        &err,
        ErrorCode::InvalidArgument,
        Reason::UploadExpired.as_str(),
    );
    assert_eq!(cell.cell.service.sweep_uploads().await.unwrap(), 1);
    assert_eq!(walk(&cell.dir.path().join("attachments/objects")), 0);
    // Its quota is free again.
    c.create_upload(reserve(conversation, 1, "c.png", "image/png", 900_000, sha))
        .await
        .unwrap();
}

#[tokio::test]
async fn bad_uploads_are_refused_with_their_reason_and_leave_nothing_behind() {
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let cell = TestCell::start_with(
        |c| {
            c.attachments.max_file_bytes = 1_000_000;
            c.attachments.content_types = vec!["image/*".into(), "application/octet-stream".into()];
            c.attachments.tenants.insert(
                TENANT.to_string(),
                cellmesh_cell::attachments::TenantAttachments {
                    quota_bytes: 1_500_000,
                    content_types: Vec::new(),
                },
            );
        },
        clock.clone(),
    )
    .await;
    let mut client = cell.client().await;
    let conversation = create_group(&mut client, TENANT, 1, &[2]).await;
    let mut alice = files_of(&cell, TENANT, 1).await;
    let sha = "ab".repeat(32);
    let refused = |r: Result<tonic::Response<_>, tonic::Status>| {
        r.map(|_: tonic::Response<cellmesh_proto::v1::UploadResponse>| ())
            .unwrap_err()
    };
    refused_reservations(&mut alice, conversation, &sha).await;
    let c = &mut alice.client;

    // Quota: 1.5 MB; a 900 kB reservation fits, a second does not. A
    // retry of the first (its answer lost) gets the same upload and counts
    // nothing twice; its request id for another file is refused.
    let with_id = |size| CreateUploadRequest {
        client_req_id: "reserve-a".into(),
        ..reserve(conversation, 1, "a.png", "image/png", size, &sha)
    };
    let first = c
        .create_upload(with_id(900_000))
        .await
        .unwrap()
        .into_inner();
    let again = c
        .create_upload(with_id(900_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.upload_id, first.upload_id);
    assert_eq!(again.parts.len(), first.parts.len());
    let err = refused(c.create_upload(with_id(800_000)).await);
    assert_reason(
        &err,
        ErrorCode::InvalidArgument,
        Reason::ClientReqIdReused.as_str(),
    );
    let second = reserve(conversation, 1, "b.png", "image/png", 900_000, &sha);
    let err = refused(c.create_upload(second).await);
    assert_reason(
        &err,
        ErrorCode::PermissionDenied,
        Reason::AttachmentQuotaExceeded.as_str(),
    );

    sends_naming_unusable_uploads(&mut client, conversation, first.upload_id).await;

    // Bytes that do not hash to the declared digest: refused at completion
    // and deleted; the reservation stays for a correct attempt.
    let url = &first.parts[0].url;
    let http = reqwest::Client::new();
    let wrong = vec![1u8; 900_000];
    assert!(
        http.put(url)
            .body(wrong.clone())
            .send()
            .await
            .unwrap()
            .status()
            .is_success()
    );
    // Never over the stored object.
    assert_eq!(
        http.put(url)
            .body(wrong)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        409
    );
    let err = c
        .complete_upload(CompleteUploadRequest {
            caller: caller(TENANT, 1),
            conversation_id: conversation,
            upload_id: first.upload_id,
        })
        .await
        .unwrap_err();
    assert_reason(
        &err,
        ErrorCode::InvalidArgument,
        Reason::AttachmentDigestMismatch.as_str(),
    );
    assert_eq!(walk(&cell.dir.path().join("attachments/objects")), 0);

    bent_urls_are_refused(&http, url).await;
    let upload = (conversation, first.upload_id, url.as_str());
    expiries(&cell, &clock, c, upload, &sha).await;
}

#[tokio::test]
async fn uploads_are_rate_limited_per_user() {
    let cell = TestCell::start_with(
        |c| c.rate_limit.user_uploads_per_minute = 2,
        Arc::new(SystemClock),
    )
    .await;
    let mut client = cell.client().await;
    let conversation = create_group(&mut client, TENANT, 1, &[2]).await;
    let mut alice = files_of(&cell, TENANT, 1).await;
    let sha = "cd".repeat(32);
    for _ in 0..2 {
        alice
            .client
            .create_upload(reserve(conversation, 1, "a.png", "image/png", 10, &sha))
            .await
            .unwrap();
    }
    let err = alice
        .client
        .create_upload(reserve(conversation, 1, "a.png", "image/png", 10, &sha))
        .await
        .unwrap_err();
    assert_reason(
        &err,
        ErrorCode::RateLimited,
        Reason::UploadRateLimited.as_str(),
    );
    let mut bob = files_of(&cell, TENANT, 2).await;
    bob.client
        .create_upload(reserve(conversation, 2, "a.png", "image/png", 10, &sha))
        .await
        .unwrap();
}

#[tokio::test]
async fn files_in_an_s3_bucket_go_up_in_parts_resume_and_come_down_verified() {
    let moto = cellmesh_tests::moto::Moto::start("cellmesh-files").await;
    let cell = TestCell::start_with(
        |c| {
            let a = &mut c.attachments;
            a.store = cellmesh_cell::cold::TierStore::S3;
            a.s3 = moto.s3("files");
            a.part_bytes = 5 * 1024 * 1024;
        },
        Arc::new(SystemClock),
    )
    .await;
    assert!(
        cell.cell.files_addr.is_none(),
        "with S3 the bytes never pass through the cell"
    );
    // One PUT below the part size.
    round_trip(&cell, 300_000).await;

    // 11 MiB: three parts; the first goes up, then the client resumes.
    let mut client = cell.client().await;
    let conversation = create_group(&mut client, TENANT, 1, &[2]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "video.mp4", 11 * 1024 * 1024 + 17, 9);
    let (size, digest) = sha256_file(&path).await.unwrap();
    let mut alice = files_of(&cell, TENANT, 1).await;
    let upload = alice
        .client
        .create_upload(reserve(
            conversation,
            1,
            "video.mp4",
            "video/mp4",
            size,
            &digest,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(upload.parts.len(), 3);
    assert!(
        upload.parts[0].url.starts_with(&moto.endpoint),
        "{}",
        upload.parts[0].url
    );
    let bytes = std::fs::read(&path).unwrap();
    let first = reqwest::Client::new()
        .put(&upload.parts[0].url)
        .body(bytes[..5 * 1024 * 1024].to_vec())
        .send()
        .await
        .unwrap();
    assert!(
        first.status().is_success(),
        "{}",
        first.text().await.unwrap()
    );
    let resumed = alice
        .client
        .get_upload(GetUploadRequest {
            caller: caller(TENANT, 1),
            conversation_id: conversation,
            upload_id: upload.upload_id,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resumed.stored_parts, vec![1]);
    let state = dir.path().join("state");
    std::fs::write(&state, format!("{} {size} {digest}\n", upload.upload_id)).unwrap();
    let a = alice
        .upload(
            conversation,
            &path,
            "video/mp4",
            Some(&state),
            &mut no_progress(),
        )
        .await
        .unwrap();
    let mut send = text(TENANT, 1, conversation, "video", "");
    send.attachment_ids = vec![a.attachment_id];
    let sent = client.send(send).await.unwrap().into_inner();
    let message = message_at(&mut client, 2, conversation, sent.seq).await;
    let out = tempfile::tempdir().unwrap();
    let mut bob = files_of(&cell, TENANT, 2).await;
    let written = bob
        .download(&message, out.path(), &mut no_progress())
        .await
        .unwrap();
    assert_eq!(sha256_file(&written[0]).await.unwrap(), (size, digest));
}

#[tokio::test]
async fn through_the_edge_a_file_reaches_another_member_and_no_one_else() {
    use cellmesh_tests::deploy::{authed, create_via_edge, deploy, messaging, token};
    let d = deploy(None).await;
    let (alice, bob) = (token(TENANT, 1), token(TENANT, 2));
    let mut m = messaging(&d.edge).await;
    let conversation = create_via_edge(&mut m, &alice, vec![2]).await;
    let endpoint = d.edge.endpoint();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("photo.png");
    let photo = image::RgbImage::from_fn(320, 200, |x, y| image::Rgb([x as u8, y as u8, 90]));
    photo.save(&path).unwrap();
    let a = edge_files(&endpoint, &alice)
        .await
        .upload(conversation, &path, "image/png", None, &mut no_progress())
        .await
        .expect("upload through the edge");
    assert_eq!((a.width, a.height), (320, 200));
    assert!(!a.thumbnail_key.is_empty(), "an image gets a thumbnail");
    let mut send = cellmesh_tests::deploy::text(conversation, "photo");
    send.attachment_ids = vec![a.attachment_id];
    let sent = m.send(authed(send, &alice)).await.unwrap().into_inner();
    let page = m
        .pull(authed(
            PullRequest {
                conversation_id: conversation,
                since_seq: sent.seq - 1,
                limit: 1,
                ..Default::default()
            },
            &bob,
        ))
        .await
        .unwrap()
        .into_inner();
    let out = tempfile::tempdir().unwrap();
    let written = edge_files(&endpoint, &bob)
        .await
        .download(&page.messages[0], out.path(), &mut no_progress())
        .await
        .expect("bob downloads through the edge");
    assert_eq!(
        std::fs::read(&written[0]).unwrap(),
        std::fs::read(&path).unwrap()
    );
    // A user of another tenant, naming the same conversation and seq.
    let mut stranger = edge_files(&endpoint, &token(2, 2)).await;
    let err = stranger
        .client
        .get_download_url(GetDownloadUrlRequest {
            conversation_id: conversation,
            seq: sent.seq,
            attachment_id: a.attachment_id,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_ne!(err.code(), tonic::Code::Ok);
    assert!(!err.message().contains(&a.object_key), "{err}");
}

#[tokio::test]
async fn a_tenant_moved_to_another_region_takes_its_files_along() {
    use cellmesh_tests::deploy::{
        authed, create_via_edge, deploy_with, messaging, migrator, token,
    };
    let stores = tempfile::tempdir().unwrap();
    let root = stores.path().to_path_buf();
    // Each region has its own store; each cell reaches the other's (as
    // with a bucket per region).
    let d = deploy_with(None, |c| {
        region_stores(c, &root);
        c.attachments.source_grace_secs = 0;
    })
    .await;
    let (alice, bob) = (token(TENANT, 1), token(TENANT, 2));
    let mut m = messaging(&d.edge).await;
    let conversation = create_via_edge(&mut m, &alice, vec![2]).await;
    let endpoint = d.edge.endpoint();
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "plan.bin", 120_000, 5);
    let a = edge_files(&endpoint, &alice)
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
    assert_eq!(a.region, "eu-west");
    let mut send = cellmesh_tests::deploy::text(conversation, "plan");
    send.attachment_ids = vec![a.attachment_id];
    let sent = m.send(authed(send, &alice)).await.unwrap().into_inner();

    let routes = d.cluster.client().await;
    // The move ends once us-east holds the file, copied at the move's rate,
    // and reports it as it goes.
    let mover = migrator(&routes);
    let mover = mover.with_options(cellmesh_control_plane::migration::MigrationOptions {
        file_rate: 1 << 20,
        ..mover.options.clone()
    });
    let mut seen = Vec::new();
    let report = mover
        .migrate_tenant(TenantId(TENANT), "us-east/c1", 4, |p| {
            if p.phase == "files" {
                seen.push((p.files_copied, p.files_total, p.file_bytes_total));
            }
        })
        .await
        .expect("the tenant moves");
    let expected = cellmesh_control_plane::migration::tenant::FilesCopied {
        files: 1,
        bytes: 120_000,
        files_pending: 0,
    };
    assert_eq!(report.files, expected);
    assert_eq!(seen.last(), Some(&(1, 1, 120_000)), "{seen:?}");
    // The new owner in us-east serves the file: from eu-west's store until
    // it is copied, then from its own.
    let url = || async {
        let mut bob = edge_files(&endpoint, &bob).await;
        bob.client
            .get_download_url(GetDownloadUrlRequest {
                conversation_id: conversation,
                seq: sent.seq,
                attachment_id: a.attachment_id,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .url
    };
    let copied = root.join("us-east/objects").join(&a.object_key);
    assert!(
        cellmesh_tests::eventually(std::time::Duration::from_secs(20), || {
            let copied = copied.clone();
            async move { copied.exists() }
        })
        .await,
        "the file was copied into us-east's store"
    );
    assert!(
        cellmesh_tests::eventually(std::time::Duration::from_secs(10), || async {
            url().await.contains("/v1/files/us-east/")
        })
        .await
    );
    // After the grace, eu-west's copy is deleted; the file is served from
    // us-east.
    let source = root.join("eu-west/objects").join(&a.object_key);
    assert!(source.exists());
    let us_east = &d.cells[1].cell.service;
    assert!(us_east.sweep_uploads().await.unwrap() >= 1);
    assert!(!source.exists(), "the source region's copy is gone");
    let page = m
        .pull(authed(
            PullRequest {
                conversation_id: conversation,
                since_seq: sent.seq - 1,
                limit: 1,
                ..Default::default()
            },
            &bob,
        ))
        .await
        .unwrap()
        .into_inner();
    let out = tempfile::tempdir().unwrap();
    let written = edge_files(&endpoint, &bob)
        .await
        .download(&page.messages[0], out.path(), &mut no_progress())
        .await
        .expect("downloaded from us-east after the move");
    assert_eq!(
        std::fs::read(&written[0]).unwrap(),
        std::fs::read(&path).unwrap()
    );
}

#[tokio::test]
async fn retention_deletes_files_with_their_messages_and_legal_hold_keeps_them() {
    const HELD: u64 = 22;
    let day = 86_400_000;
    let clock = Arc::new(ManualClock::new(100 * day));
    let coordination = tempfile::tempdir().unwrap();
    let coordination_dir = coordination.path().display().to_string();
    let cell = TestCell::start_with(
        |c| {
            c.routing.coordination_dir = coordination_dir;
            let t = &mut c.tiering;
            t.enabled = true;
            t.interval_ms = 3_600_000;
            t.hot_age_secs = 86_400;
            t.hot_messages_per_conversation = 0;
            for (tenant, legal_hold) in [(TENANT, false), (HELD, true)] {
                t.tenants.insert(
                    tenant.to_string(),
                    cellmesh_cell::cold::TenantRetention {
                        retention_days: 3,
                        legal_hold,
                    },
                );
            }
        },
        clock.clone(),
    )
    .await;
    let mut client = cell.client().await;
    let dir = tempfile::tempdir().unwrap();
    let (mut keys, mut conversations) = (Vec::new(), Vec::new());
    for tenant in [TENANT, HELD] {
        let conversation = create_group(&mut client, tenant, 1, &[2]).await;
        let path = write_file(dir.path(), &format!("f{tenant}.bin"), 10_000, tenant as u8);
        let a = files_of(&cell, tenant, 1)
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
        let mut send = text(tenant, 1, conversation, "file", "");
        send.attachment_ids = vec![a.attachment_id];
        client.send(send).await.unwrap();
        keys.push(a.object_key);
        conversations.push((tenant, conversation));
    }
    let object = |key: &str| cell.dir.path().join("attachments/objects").join(key);
    // Day 102: tiered, within retention. Day 104: past it.
    clock.advance_ms(2 * day);
    for (tenant, conversation) in &conversations {
        client
            .send(text(*tenant, 1, *conversation, "later", "x"))
            .await
            .unwrap();
    }
    let report = cell.cell.service.tier_once().await.unwrap();
    assert_eq!(report.messages_tiered, 2, "{report:?}");
    cell.cell.service.sweep_uploads().await.unwrap();
    assert!(object(&keys[0]).exists() && object(&keys[1]).exists());
    clock.advance_ms(2 * day);
    let report = cell.cell.service.tier_once().await.unwrap();
    assert_eq!(report.segments_expired, 1, "{report:?}");
    assert_eq!(cell.cell.service.sweep_uploads().await.unwrap(), 1);
    assert!(!object(&keys[0]).exists(), "retention deleted the file");
    assert!(object(&keys[1]).exists(), "legal hold kept the file");
}

#[tokio::test]
async fn a_scanner_holds_a_file_pending_until_clean_and_an_infected_one_is_refused() {
    // The scanner: no verdict (down) first, then clean, then infected.
    let (url, mut asked) = cellmesh_tests::http::responder(|n| match n {
        1 => ("503 Service Unavailable", String::new()),
        2 => ("200 OK", r#"{"verdict":"clean"}"#.into()),
        _ => ("200 OK", r#"{"verdict":"infected"}"#.into()),
    })
    .await;
    let cell =
        TestCell::start_with(|c| c.attachments.scan_webhook = url, Arc::new(SystemClock)).await;
    let mut client = cell.client().await;
    let conversation = create_group(&mut client, TENANT, 1, &[2]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut alice = files_of(&cell, TENANT, 1).await;
    let path = write_file(dir.path(), "doc.bin", 5_000, 2);
    let pending = alice
        .upload(
            conversation,
            &path,
            "application/octet-stream",
            None,
            &mut no_progress(),
        )
        .await
        .unwrap_err();
    assert!(
        pending.to_string().contains(Reason::ScanPending.as_str()),
        "{pending}"
    );
    let request: serde_json::Value = serde_json::from_str(&asked.recv().await.unwrap()).unwrap();
    assert_eq!(request["name"], "doc.bin");
    let upload_id = request["upload_id"].as_u64().unwrap();
    // Pending: a send cannot carry it yet.
    let mut send = text(TENANT, 1, conversation, "doc", "");
    send.attachment_ids = vec![upload_id];
    let err = client.send(send.clone()).await.unwrap_err();
    assert_reason(
        &err,
        ErrorCode::InvalidArgument,
        Reason::AttachmentNotComplete.as_str(),
    );
    // Clean on the next try.
    let complete = |id| CompleteUploadRequest {
        caller: caller(TENANT, 1),
        conversation_id: conversation,
        upload_id: id,
    };
    alice
        .client
        .complete_upload(complete(upload_id))
        .await
        .unwrap();
    client.send(send).await.unwrap();
    // Infected: refused, and the bytes are gone.
    let other = write_file(dir.path(), "bad.bin", 5_000, 66);
    let err = alice
        .upload(
            conversation,
            &other,
            "application/octet-stream",
            None,
            &mut no_progress(),
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains(Reason::AttachmentInfected.as_str()),
        "{err}"
    );
    let _ = asked.recv().await;
    let infected: serde_json::Value = serde_json::from_str(&asked.recv().await.unwrap()).unwrap();
    let err = alice
        .client
        .complete_upload(complete(infected["upload_id"].as_u64().unwrap()))
        .await
        .unwrap_err();
    assert_reason(
        &err,
        ErrorCode::InvalidArgument,
        Reason::AttachmentNotFound.as_str(),
    );
    assert_eq!(walk(&cell.dir.path().join("attachments/objects")), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_the_standby_serves_the_files_from_where_they_are() {
    use crate::exactly_once::{fail_first_cell, failover_deployment_with};
    use cellmesh_tests::deploy::{authed, token};
    let stores = tempfile::tempdir().unwrap();
    let root = stores.path().to_path_buf();
    let (mut d, routes, _cp, alice, mut m, conversation) = failover_deployment_with(|c| {
        c.replication.mode = cellmesh_cell::config::ReplicationMode::Sync;
        region_stores(c, &root);
    })
    .await;
    let endpoint = d.edge.endpoint();
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "minutes.bin", 70_000, 4);
    let a = edge_files(&endpoint, &alice)
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
    let mut send = cellmesh_tests::deploy::text(conversation, "minutes");
    send.attachment_ids = vec![a.attachment_id];
    let sent = m.send(authed(send, &alice)).await.unwrap().into_inner();

    // The owner (eu-west/c1) stops; its standby in us-east takes over.
    cellmesh_tests::deploy::wait_for_checkpoint(
        &routes,
        conversation,
        sent.seq,
        std::time::Duration::from_secs(10),
    )
    .await;
    let _dir = fail_first_cell(&mut d, conversation).await;
    let bob = token(1, 11);
    let page = m
        .pull(authed(
            PullRequest {
                conversation_id: conversation,
                since_seq: sent.seq - 1,
                limit: 1,
                ..Default::default()
            },
            &bob,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.messages[0].attachments, vec![a.clone()]);
    let out = tempfile::tempdir().unwrap();
    let written = edge_files(&endpoint, &bob)
        .await
        .download(&page.messages[0], out.path(), &mut no_progress())
        .await
        .expect("the standby serves the file from eu-west's store");
    assert_eq!(
        std::fs::read(&written[0]).unwrap(),
        std::fs::read(&path).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_cut_off_by_a_restart_of_the_target_resumes_and_ends_intact() {
    use cellmesh_tests::deploy::{
        authed, create_via_edge, deploy_with, messaging, migrator, token,
    };
    let stores = tempfile::tempdir().unwrap();
    let root = stores.path().to_path_buf();
    let tweak = |c: &mut cellmesh_cell::CellConfig| {
        region_stores(c, &root);
        // 1.5 MB at 300 kB/s: about five seconds of copying.
        c.attachments.copy_bytes_per_sec = 300_000;
    };
    let mut d = deploy_with(None, &tweak).await;
    let alice = token(TENANT, 1);
    let mut m = messaging(&d.edge).await;
    let conversation = create_via_edge(&mut m, &alice, vec![2]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "archive.bin", 1_500_000, 8);
    let a = edge_files(&d.edge.endpoint(), &alice)
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
    let mut send = cellmesh_tests::deploy::text(conversation, "archive");
    send.attachment_ids = vec![a.attachment_id];
    m.send(authed(send, &alice)).await.unwrap();
    let routes = d.cluster.client().await;
    // The move waits for the file after its switch.
    let (phase_tx, mut phase_rx) = tokio::sync::watch::channel("");
    let mover = tokio::spawn(async move {
        migrator(&routes)
            .migrate_tenant(TenantId(TENANT), "us-east/c1", 4, |p| {
                phase_tx.send_replace(p.phase);
            })
            .await
    });
    phase_rx.wait_for(|p| *p == "files").await.unwrap();
    // The target stops mid-copy.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let copied = root.join("us-east/objects").join(&a.object_key);
    let target = d.cells.remove(1);
    let data = target.stop().await;
    assert!(!copied.exists(), "the copy was cut off");
    assert!(!mover.is_finished(), "the move waits for the file");
    let restarted =
        TestCell::start_routed_with("us-east/c1", d.cluster.endpoints(), data, &tweak).await;
    // The copy resumes after the restart, and the move ends with it.
    let report = tokio::time::timeout(std::time::Duration::from_secs(30), mover)
        .await
        .expect("the move ends once the file is copied")
        .unwrap()
        .expect("the tenant moves");
    assert_eq!((report.files.files, report.files.files_pending), (1, 0));
    assert!(copied.exists(), "the copy resumed after the restart");
    assert_eq!(
        std::fs::read(&copied).unwrap(),
        std::fs::read(&path).unwrap()
    );
    drop(restarted);
}
