//! Cell backups in an S3 bucket (moto): a backup taken under load restores
//! into a new cell holding every message its manifest names, the restored
//! cell never reuses a seq the old one acknowledged (even after the
//! backup), devices rebase onto the restored sync queues; a second backup
//! uploads only what changed; `verify` passes a good backup and catches a
//! damaged object; delete keeps files a remaining backup shares.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cellmesh_cell::CellConfig;
use cellmesh_cell::backup::{Backups, restore};
use cellmesh_cell::clock::SystemClock;
use cellmesh_proto::v1::backups_client::BackupsClient;
use cellmesh_proto::v1::*;
use cellmesh_tests::moto::Moto;
use cellmesh_tests::sync::{connect_sync, device, messages, next_push};
use cellmesh_tests::*;
use object_store::ObjectStore;

const T: u64 = 31;
const CELL: &str = "eu/a";

fn on_s3(moto: &Moto) -> impl Fn(&mut CellConfig) + '_ {
    move |c: &mut CellConfig| {
        c.cell_id = CELL.into();
        c.backup.store = cellmesh_cell::cold::TierStore::S3;
        c.backup.s3 = moto.s3("bk");
        // Small files, so that a second backup has some to share.
        c.storage.write_buffer_mb = 1;
    }
}

async fn backups_client(endpoint: &str) -> BackupsClient<tonic::transport::Channel> {
    BackupsClient::connect(endpoint.to_string()).await.unwrap()
}

/// Sends to `conv` from user 1 until `stop`; the seqs acknowledged.
fn sending(
    endpoint: String,
    conv: u64,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<u64>> {
    tokio::spawn(async move {
        let mut c = connect(&endpoint).await;
        let mut acked = Vec::new();
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            i += 1;
            let r = c
                .send(text(T, 1, conv, &format!("load-{i}"), &format!("load {i}")))
                .await
                .unwrap()
                .into_inner();
            acked.push(r.seq);
        }
        acked
    })
}

#[tokio::test]
async fn a_backup_under_load_restores_into_a_new_cell_that_never_reuses_a_seq() {
    let moto = Moto::start("cellmesh-backups").await;
    let tune = on_s3(&moto);
    let a = TestCell::start_with(&tune, Arc::new(SystemClock)).await;
    let mut c = a.client().await;
    let conv = create_group(&mut c, T, 1, &[2, 3]).await;
    for i in 0..40 {
        c.send(text(T, 1, conv, &format!("pre-{i}"), "before"))
            .await
            .unwrap();
    }
    // User 2's phone reads everything so far.
    let mut sync = connect_sync(&a.endpoint).await;
    let mut phone = sync
        .subscribe(SubscribeRequest {
            caller: device(T, 2, "phone"),
            from_pts: 0,
            queue_id: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let seen = messages(&mut phone, 40, Duration::from_secs(10)).await;
    let (old_queue, old_pts) = (seen[0].queue_id, seen.last().unwrap().pts);
    assert_ne!(old_queue, 0);

    // The first backup, under load.
    let stop = Arc::new(AtomicBool::new(false));
    let load = sending(a.endpoint.clone(), conv, stop.clone());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut admin = backups_client(&a.endpoint).await;
    let first = admin
        .create(CreateBackupRequest { keep: 0 })
        .await
        .unwrap()
        .into_inner();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let acked_first = load.await.unwrap();
    assert!(acked_first.len() > 10, "the backup ran under load");
    assert_eq!(first.cell_id, CELL);
    assert_eq!(
        first.uploaded_files, first.files,
        "the first uploads everything"
    );

    // A second one shares the files that did not change.
    for i in 0..20 {
        c.send(text(T, 1, conv, &format!("post-{i}"), "after"))
            .await
            .unwrap();
    }
    let second = admin
        .create(CreateBackupRequest { keep: 0 })
        .await
        .unwrap()
        .into_inner();
    assert!(
        second.uploaded_files < second.files && second.uploaded_bytes < second.bytes,
        "incremental: {second:?}"
    );
    let verified = admin
        .verify(BackupRequest {
            id: second.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(verified.problems.is_empty(), "{:?}", verified.problems);

    // More acknowledged after the last backup: lost with the cell, but no
    // restored seq may take their place.
    let mut after = Vec::new();
    for i in 0..15 {
        let r = c
            .send(text(T, 1, conv, &format!("lost-{i}"), "after the backup"))
            .await
            .unwrap()
            .into_inner();
        after.push(r.seq);
    }
    let highest = *after.iter().max().unwrap();
    drop(phone);
    let mut old_dir = a.stop().await;
    let _ = &mut old_dir;

    // Restore the latest into a new cell's empty data dir.
    let new_dir = tempfile::tempdir().unwrap();
    let mut config = test_config(new_dir.path());
    tune(&mut config);
    config.cell_id = "eu/b".into();
    let manifest = Backups::open(&config.backup, CELL, &config.data_dir)
        .unwrap()
        .manifest("")
        .await
        .unwrap();
    assert_eq!(manifest.id, second.id);
    let done = restore::restore(&config, CELL, "", None, now_ms())
        .await
        .unwrap();
    assert_eq!(
        (done.backup.as_str(), done.users_rebased > 0),
        (second.id.as_str(), true)
    );
    let refused = restore::restore(&config, CELL, "", None, now_ms()).await;
    assert!(refused.is_err(), "a restore never overwrites a database");

    let b = TestCell::start_in(
        new_dir,
        |c| {
            tune(c);
            c.cell_id = "eu/b".into();
        },
        Arc::new(SystemClock),
    )
    .await;
    let mut c = b.client().await;
    let history = pull_all(&mut c, T, 2, conv).await;
    let seqs: Vec<u64> = history.iter().map(|m| m.seq).collect();
    let mark = manifest
        .conversations
        .iter()
        .find(|m| m.conversation == ConversationId(conv))
        .unwrap()
        .seq;
    assert_eq!(
        seqs,
        (1..=mark).collect::<Vec<_>>(),
        "every message the manifest names"
    );
    assert!(
        acked_first.iter().all(|s| seqs.contains(s)),
        "everything acked before the first backup"
    );
    let next = c
        .send(text(T, 1, conv, "restored-1", "after the restore"))
        .await
        .unwrap()
        .into_inner();
    assert!(
        next.seq > highest,
        "seq {} reuses one acknowledged before the loss ({highest})",
        next.seq
    );

    // The phone comes back with its old queue and cursor: it rebases.
    let mut sync = connect_sync(&b.endpoint).await;
    let mut phone = sync
        .subscribe(SubscribeRequest {
            caller: device(T, 2, "phone"),
            from_pts: old_pts,
            queue_id: old_queue,
        })
        .await
        .unwrap()
        .into_inner();
    let push = next_push(&mut phone, Duration::from_secs(5)).await.unwrap();
    let Some(sync_push::Push::Rebase(rebase)) = push.push else {
        panic!("expected a rebase, got {push:?}");
    };
    assert_ne!(rebase.queue_id, old_queue);
}

#[tokio::test]
async fn verify_catches_a_damaged_object_and_delete_keeps_shared_files() {
    let moto = Moto::start("cellmesh-verify").await;
    let tune = on_s3(&moto);
    let a = TestCell::start_with(&tune, Arc::new(SystemClock)).await;
    let mut c = a.client().await;
    let conv = create_group(&mut c, T, 1, &[2]).await;
    for i in 0..30 {
        c.send(text(T, 1, conv, &format!("m-{i}"), "hello"))
            .await
            .unwrap();
    }
    let mut admin = backups_client(&a.endpoint).await;
    let first = admin
        .create(CreateBackupRequest { keep: 0 })
        .await
        .unwrap()
        .into_inner();
    for i in 30..60 {
        c.send(text(T, 1, conv, &format!("m-{i}"), "hello"))
            .await
            .unwrap();
    }
    let second = admin
        .create(CreateBackupRequest { keep: 0 })
        .await
        .unwrap()
        .into_inner();

    let mut config = test_config(a.dir.path());
    tune(&mut config);
    let backups = Backups::open(&config.backup, CELL, &config.data_dir).unwrap();
    let m1 = backups.manifest(&first.id).await.unwrap();
    let m2 = backups.manifest(&second.id).await.unwrap();
    let shared: Vec<_> = m1.files.iter().filter(|f| m2.files.contains(f)).collect();
    assert!(
        !shared.is_empty(),
        "the second shares SST files with the first"
    );

    // Deleting the first keeps what the second names.
    let left = admin
        .delete(BackupRequest {
            id: first.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(left.backups.len(), 1);
    let v = admin
        .verify(BackupRequest { id: String::new() })
        .await
        .unwrap()
        .into_inner();
    assert!(v.problems.is_empty(), "{:?}", v.problems);
    let unknown = admin
        .verify(BackupRequest {
            id: "0-none".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    // Flip bytes of one file: verify names it.
    let s3 = moto.s3("bk").build("test").unwrap();
    let victim = &m2
        .files
        .iter()
        .find(|f| f.name.ends_with(".sst"))
        .unwrap()
        .key;
    let path = object_store::path::Path::from(format!("bk/backups/{CELL}/{victim}"));
    let mut bytes = s3.get(&path).await.unwrap().bytes().await.unwrap().to_vec();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    s3.put(&path, bytes.into()).await.unwrap();
    let v = admin
        .verify(BackupRequest {
            id: second.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        v.problems.iter().any(|p| p.contains(victim.as_str())),
        "{:?}",
        v.problems
    );
    // A restore refuses the damaged backup.
    let new_dir = tempfile::tempdir().unwrap();
    let mut config = test_config(new_dir.path());
    tune(&mut config);
    let refused = restore::restore(&config, CELL, &second.id, None, now_ms()).await;
    assert!(refused.is_err());
    assert!(!new_dir.path().join("db").exists(), "nothing half restored");
}

#[tokio::test]
async fn verify_names_cold_history_the_tier_no_longer_holds() {
    let cell = crate::export_restore::tiered_cell().await;
    let mut c = cell.client().await;
    let conv = create_group(&mut c, T, 1, &[2]).await;
    for i in 1..=40 {
        c.send(text(T, 1, conv, &format!("c-{i}"), "cold soon"))
            .await
            .unwrap();
    }
    cell.cell.service.tier_once().await.unwrap();
    let mut admin = backups_client(&cell.endpoint).await;
    let taken = admin
        .create(CreateBackupRequest { keep: 0 })
        .await
        .unwrap()
        .into_inner();
    let ok = admin
        .verify(BackupRequest {
            id: taken.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(ok.problems.is_empty(), "{:?}", ok.problems);
    // A segment object goes missing (a tier on a lost disk).
    let cold = cell.cell.service.cold().unwrap();
    let objects = cold.list(Some(TenantId(T))).await.unwrap();
    assert!(!objects.is_empty());
    cold.delete(&objects[0].key).await.unwrap();
    let bad = admin
        .verify(BackupRequest { id: taken.id })
        .await
        .unwrap()
        .into_inner();
    assert!(
        bad.problems
            .iter()
            .any(|p| p.contains("missing from the cold tier")),
        "{:?}",
        bad.problems
    );
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}
