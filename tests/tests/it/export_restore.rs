//! Tenant exports and their restore beside the live data: an export holds
//! every message of the tenant, hot and cold, and nothing of another
//! tenant's; restored into a new tenant it reads back identical while the
//! live conversation is untouched; one conversation restored into its own
//! tenant is a new conversation its members see, that takes sends above
//! the restored history; unknown exports and conversations are refused.

use std::sync::Arc;
use std::time::Duration;

use cellmesh_cell::backup::Backups;
use cellmesh_cell::clock::SystemClock;
use cellmesh_proto::v1::backups_client::BackupsClient;
use cellmesh_proto::v1::*;
use cellmesh_tests::sync::connect_sync;
use cellmesh_tests::*;

const T: u64 = 41;

async fn backups_client(endpoint: &str) -> BackupsClient<tonic::transport::Channel> {
    BackupsClient::connect(endpoint.to_string()).await.unwrap()
}

/// Tenant `T`'s group of users 1 and 2 (60 messages, 50 of them cold,
/// the 5th recalled) beside another tenant's, exported; (the group, the
/// export).
async fn exported(cell: &TestCell) -> (u64, ExportInfo) {
    let mut c = cell.client().await;
    let conv = create_group(&mut c, T, 1, &[2]).await;
    let other = create_group(&mut c, T + 1, 1, &[2]).await;
    for i in 1..=60 {
        c.send(text(T, 1, conv, &format!("x-{i}"), &format!("message {i}")))
            .await
            .unwrap();
    }
    c.send(text(T + 1, 1, other, "o-1", "not this tenant's"))
        .await
        .unwrap();
    let tiered = cell.cell.service.tier_once().await.unwrap();
    assert!(tiered.messages_tiered >= 50, "{tiered:?}");
    // A recall of a cold message: the export shows the overlay.
    c.recall(RecallRequest {
        caller: caller(T, 1),
        conversation_id: conv,
        seq: 5,
    })
    .await
    .unwrap();

    let mut admin = backups_client(&cell.endpoint).await;
    let info = admin
        .export_tenant(ExportTenantRequest { tenant_id: T })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((info.conversations, info.messages), (1, 60), "{info:?}");
    (conv, info)
}

/// A cell that tiers everything beyond a conversation's newest 10
/// messages, in segments of at most 25, when asked.
pub async fn tiered_cell() -> TestCell {
    TestCell::start_with(
        |c| {
            let t = &mut c.tiering;
            t.enabled = true;
            t.hot_messages_per_conversation = 10;
            t.segment_max_messages = 25;
        },
        Arc::new(SystemClock),
    )
    .await
}

#[tokio::test]
async fn a_tenant_export_holds_every_message_hot_and_cold_and_nothing_of_other_tenants() {
    let cell = tiered_cell().await;
    let (conv, info) = exported(&cell).await;
    let mut c = cell.client().await;
    let mut admin = backups_client(&cell.endpoint).await;
    let missing = admin
        .export_tenant(ExportTenantRequest { tenant_id: 0 })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::InvalidArgument);

    let config = cell.cell.service.config().clone();
    let backups = Backups::open(&config.backup, &config.cell_id, &config.data_dir).unwrap();
    let conversations: Vec<serde_json::Value> = backups
        .export_lines(
            cellmesh_proto::ids::TenantId(T),
            &info.id,
            "conversations.jsonl",
        )
        .await
        .unwrap();
    assert_eq!(conversations.len(), 1);
    assert_eq!(conversations[0]["conversation"], conv);
    assert_eq!(conversations[0]["members"], serde_json::json!([1, 2]));
    let lines: Vec<serde_json::Value> = backups
        .export_lines(cellmesh_proto::ids::TenantId(T), &info.id, "messages.jsonl")
        .await
        .unwrap();
    let seqs: Vec<u64> = lines.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=60).collect::<Vec<_>>());
    let pulled = pull_all(&mut c, T, 2, conv).await;
    for (line, message) in lines.iter().zip(&pulled) {
        assert_eq!(line["msg_id"], message.msg_id);
        assert_eq!(line["state"], message.state);
        if message.seq != 5 {
            assert_eq!(
                line["body"],
                String::from_utf8_lossy(&message.body).as_ref()
            );
        }
    }
    assert_eq!(lines[4]["state"], MessageState::Recalled as i32);
}

#[tokio::test]
async fn an_export_restores_into_a_new_tenant_identical_and_one_conversation_beside_the_live_one() {
    let cell = tiered_cell().await;
    let (conv, info) = exported(&cell).await;
    let mut c = cell.client().await;
    let live = pull_all(&mut c, T, 2, conv).await;
    let mut admin = backups_client(&cell.endpoint).await;
    let restore = |into: u64, conversation: u64| RestoreExportRequest {
        tenant_id: T,
        export_id: info.id.clone(),
        into_tenant_id: into,
        conversation_id: conversation,
    };

    // The whole export into a new tenant: same seqs, ids, bodies, states.
    let into = T + 100;
    let r = admin
        .restore_export(restore(into, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.into_tenant_id, into);
    assert_eq!(r.conversations.len(), 1, "{r:?}");
    let copy = r.conversations[0];
    assert_eq!((copy.from_conversation_id, copy.messages), (conv, 60));
    assert_ne!(copy.to_conversation_id, conv);
    let mut restored = pull_all(&mut c, into, 2, copy.to_conversation_id).await;
    for m in &mut restored {
        assert_eq!(m.conversation_id, copy.to_conversation_id);
        m.conversation_id = conv;
    }
    assert_eq!(restored, live, "the copy reads back as the live one did");
    // The live conversation is untouched, and the copy is not the source
    // tenant's.
    assert_eq!(pull_all(&mut c, T, 2, conv).await, live);
    let foreign = c
        .pull(PullRequest {
            caller: caller(T, 2),
            conversation_id: copy.to_conversation_id,
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_ne!(foreign.code(), tonic::Code::Ok);

    // One conversation into its own tenant: announced to its members, and
    // sends continue above the restored history.
    let r = admin
        .restore_export(restore(0, conv))
        .await
        .unwrap()
        .into_inner();
    let again = r.conversations[0].to_conversation_id;
    assert!(again != conv && again != copy.to_conversation_id);
    let sync = connect_sync(&cell.endpoint).await;
    let listed = eventually(Duration::from_secs(10), || {
        let mut sync = sync.clone();
        async move {
            let l = sync
                .list_conversations(ListConversationsRequest {
                    caller: caller(T, 2),
                    limit: 0,
                    ids_only: true,
                })
                .await
                .unwrap()
                .into_inner();
            l.conversation_ids.contains(&again)
        }
    })
    .await;
    assert!(listed, "user 2 sees the restored conversation");
    let sent = c
        .send(text(T, 1, again, "after-restore", "hello again"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(sent.seq, 61);
    assert_eq!(pull_all(&mut c, T, 2, again).await.len(), 61);

    // Unknown exports and conversations, and a request naming neither.
    for (request, code) in [
        (
            RestoreExportRequest {
                export_id: "no-such-export".into(),
                ..restore(0, 0)
            },
            tonic::Code::NotFound,
        ),
        (restore(0, conv + 12345), tonic::Code::NotFound),
        (
            RestoreExportRequest {
                export_id: String::new(),
                ..restore(0, 0)
            },
            tonic::Code::InvalidArgument,
        ),
    ] {
        let refused = admin.restore_export(request.clone()).await.unwrap_err();
        assert_eq!(refused.code(), code, "{request:?}: {refused:?}");
    }
}
