//! A cell on the Kafka queue restored from a backup: the events its
//! fan-out had consumed after the backup are not consumed again, the
//! restored history is what the backup named, new sends above it reach a
//! member's device, and no device is told of a message the history lacks.

use cellmesh_proto::ids::ConversationId;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use cellmesh_cell::backup::{Backups, restore};
use cellmesh_cell::clock::SystemClock;
use cellmesh_proto::v1::backups_client::BackupsClient;
use cellmesh_proto::v1::*;
use cellmesh_tests::backends::Kafka;
use cellmesh_tests::sync::{connect_sync, messages, subscribe};
use cellmesh_tests::*;

const T: u64 = 51;
const CELL: &str = "eu/k";

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_on_kafka_restored_from_a_backup_fans_out_only_what_it_holds() {
    let kafka = Kafka::start(1);
    let backups = tempfile::tempdir().unwrap();
    let mut queue = None;
    let a = TestCell::start_with(
        |c| {
            c.cell_id = CELL.into();
            c.backup.local_dir = backups.path().to_path_buf();
            kafka.configure(c);
            queue = Some(c.queue.clone());
        },
        Arc::new(SystemClock),
    )
    .await;
    let queue = queue.unwrap();
    let mut c = a.client().await;
    let conv = create_group(&mut c, T, 1, &[2]).await;
    let mut sync = connect_sync(&a.endpoint).await;
    let mut phone = subscribe(&mut sync, T, 2, "phone", 0).await;
    let send = |c: &mut Client, tag: String| {
        let mut c = c.clone();
        async move {
            c.send(text(T, 1, conv, &tag, &tag))
                .await
                .unwrap()
                .into_inner()
        }
    };
    for i in 0..10 {
        send(&mut c, format!("before-{i}")).await;
    }
    messages(&mut phone, 10, Duration::from_secs(20)).await;
    let mut admin = BackupsClient::connect(a.endpoint.clone()).await.unwrap();
    admin.create(CreateBackupRequest { keep: 0 }).await.unwrap();
    // Acknowledged and fanned out after the backup: lost with the cell.
    let mut lost = Vec::new();
    for i in 0..10 {
        lost.push(send(&mut c, format!("lost-{i}")).await.seq);
    }
    messages(&mut phone, 10, Duration::from_secs(20)).await;
    drop(phone);
    let _old = a.stop().await;

    let new_dir = tempfile::tempdir().unwrap();
    let tune = |c: &mut cellmesh_cell::CellConfig| {
        c.cell_id = CELL.into();
        c.backup.local_dir = backups.path().to_path_buf();
        c.queue = queue.clone();
    };
    let mut config = test_config(new_dir.path());
    tune(&mut config);
    assert!(Backups::open(&config.backup, CELL, &config.data_dir).is_ok());
    restore::restore(&config, CELL, "", None, now_ms())
        .await
        .unwrap();
    let b = TestCell::start_in(new_dir, tune, Arc::new(SystemClock)).await;
    let mut c = b.client().await;
    let next = send(&mut c, "restored-1".into()).await;
    assert!(next.seq > *lost.iter().max().unwrap(), "no seq reused");
    let history: BTreeSet<u64> = pull_all(&mut c, T, 2, conv)
        .await
        .iter()
        .map(|m| m.seq)
        .collect();
    assert!(history.contains(&next.seq));
    assert!(
        lost.iter().all(|s| !history.contains(s)),
        "lost with the cell"
    );

    // A device of the member reads its (new) queue from the start: every
    // message it is told of is in the history, the new one included.
    let mut sync = connect_sync(&b.endpoint).await;
    let mut phone = subscribe(&mut sync, T, 2, "tablet", 0).await;
    let told = messages(&mut phone, 11, Duration::from_secs(20)).await;
    let told: Vec<u64> = told
        .iter()
        .filter(|e| e.kind == SyncEventKind::Message as i32 && e.conversation_id == conv)
        .map(|e| e.seq)
        .collect();
    assert!(
        told.contains(&next.seq),
        "the new message reaches the device: {told:?}"
    );
    for seq in &told {
        assert!(
            history.contains(seq),
            "the device was told of seq {seq}, which the history of {} lacks",
            ConversationId(conv)
        );
    }
}
