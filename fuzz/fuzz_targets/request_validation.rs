//! Arbitrary client requests against a running cell (real gRPC on a
//! loopback port, RocksDB in a temp dir). The first byte picks the call,
//! the rest is decoded as its request; conversation ids 1 and 2 stand for
//! a group and a direct conversation made at start, so inputs reach past
//! the lookups. Every answer is a success or an error with a stable
//! cellmesh reason; a panic anywhere in the cell aborts the run.

#![no_main]

use std::sync::OnceLock;

use cellmesh_proto::reason::Reason;
use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::sync_client::SyncClient;
use cellmesh_proto::v1::*;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use tonic::transport::Channel;

struct Cell {
    runtime: tokio::runtime::Runtime,
    channel: Channel,
    known: [u64; 2],
    _dir: tempfile::TempDir,
    _cell: cellmesh_cell::RunningCell,
}

fn caller(user: u64) -> Option<Caller> {
    Some(Caller {
        tenant_id: 1,
        user_id: user,
        device_id: "fuzz".into(),
    })
}

fn cell() -> &'static Cell {
    static CELL: OnceLock<Cell> = OnceLock::new();
    CELL.get_or_init(|| {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = cellmesh_cell::CellConfig {
            listen: "127.0.0.1:0".parse().expect("address"),
            data_dir: dir.path().to_path_buf(),
            ..Default::default()
        };
        config.storage.block_cache_mb = 16;
        config.storage.write_buffer_mb = 8;
        config.rate_limit.user_calls_per_sec = 1_000_000;
        config.rate_limit.user_calls_burst = 1_000_000;
        config.rate_limit.user_per_sec = 1_000_000;
        config.rate_limit.user_burst = 1_000_000;
        config.rate_limit.conversation_per_sec = 1_000_000;
        config.rate_limit.conversation_burst = 1_000_000;
        let (cell, channel, known) = runtime.block_on(async {
            let cell = cellmesh_cell::start(
                config,
                std::sync::Arc::new(cellmesh_cell::ownership::OwnAll),
                std::sync::Arc::new(cellmesh_cell::clock::SystemClock),
            )
            .await
            .expect("cell starts");
            let channel = Channel::from_shared(format!("http://{}", cell.addr))
                .expect("url")
                .connect()
                .await
                .expect("connects");
            let mut m = MessagingClient::new(channel.clone());
            let mut known = [0; 2];
            for (i, (kind, members)) in [
                (ConversationKind::Group, vec![2, 3]),
                (ConversationKind::Direct, vec![2]),
            ]
            .into_iter()
            .enumerate()
            {
                known[i] = m
                    .create_conversation(CreateConversationRequest {
                        caller: caller(1),
                        kind: kind as i32,
                        member_ids: members,
                        ..Default::default()
                    })
                    .await
                    .expect("created")
                    .into_inner()
                    .conversation
                    .expect("conversation")
                    .conversation_id;
            }
            (cell, channel, known)
        });
        Cell {
            runtime,
            channel,
            known,
            _dir: dir,
            _cell: cell,
        }
    })
}

/// Decodes the request, points ids 1 and 2 at the known conversations,
/// calls, and checks the answer.
macro_rules! call {
    ($cell:ident, $bytes:ident, $client:ident, $method:ident, $request:ty) => {{
        let Ok(mut request) = <$request>::decode($bytes) else {
            return;
        };
        remap(&mut request.conversation_id, &$cell.known);
        let mut client = $client::new($cell.channel.clone());
        check($cell.runtime.block_on(client.$method(request)).map(|_| ()));
    }};
    ($cell:ident, $bytes:ident, $client:ident, $method:ident, $request:ty, no_conversation) => {{
        let Ok(request) = <$request>::decode($bytes) else {
            return;
        };
        let mut client = $client::new($cell.channel.clone());
        check($cell.runtime.block_on(client.$method(request)).map(|_| ()));
    }};
}

fn remap(id: &mut u64, known: &[u64; 2]) {
    if (1..=2).contains(id) {
        *id = known[*id as usize - 1];
    }
}

fn check(answer: Result<(), tonic::Status>) {
    let Err(status) = answer else { return };
    let detail = error_detail(&status);
    assert!(
        Reason::parse(&detail.reason).is_some(),
        "an answer without a stable reason: {status:?}"
    );
    assert!(
        !matches!(status.code(), tonic::Code::Unknown | tonic::Code::Internal),
        "an internal error for a client's request: {status:?}"
    );
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    let cell = cell();
    match which % 17 {
        0 => call!(cell, bytes, MessagingClient, send, SendRequest),
        1 => call!(
            cell,
            bytes,
            MessagingClient,
            create_conversation,
            CreateConversationRequest,
            no_conversation
        ),
        2 => call!(cell, bytes, MessagingClient, add_members, ChangeMembersRequest),
        3 => call!(cell, bytes, MessagingClient, remove_members, ChangeMembersRequest),
        4 => call!(cell, bytes, MessagingClient, set_member_role, SetMemberRoleRequest),
        5 => call!(cell, bytes, MessagingClient, get_conversation, GetConversationRequest),
        6 => call!(cell, bytes, MessagingClient, pull, PullRequest),
        7 => call!(cell, bytes, MessagingClient, mark_read, MarkReadRequest),
        8 => call!(cell, bytes, MessagingClient, recall, RecallRequest),
        9 => call!(cell, bytes, MessagingClient, edit, EditRequest),
        10 => call!(cell, bytes, MessagingClient, delete_for_me, DeleteForMeRequest),
        11 => call!(cell, bytes, SyncClient, ack, AckRequest, no_conversation),
        12 => call!(
            cell,
            bytes,
            SyncClient,
            list_conversations,
            ListConversationsRequest,
            no_conversation
        ),
        13 => call!(cell, bytes, SyncClient, set_muted, SetMutedRequest),
        14 => call!(cell, bytes, SyncClient, heartbeat, HeartbeatRequest, no_conversation),
        15 => call!(cell, bytes, MessagingClient, read_count, ReadCountRequest),
        _ => call!(cell, bytes, SyncClient, typing, TypingRequest),
    }
});
