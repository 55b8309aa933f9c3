//! `cellmesh chat tail` and `list`: a device following its sync queue live,
//! acknowledging as it goes, and the conversation list a client shows after
//! a Rebase.

use cellmesh_proto::v1::sync_client::SyncClient;
use cellmesh_proto::v1::{
    AckRequest, Caller, ListConversationsRequest, SubscribeRequest, SyncEventKind, sync_push,
};

use super::render;
use crate::connect::{Authed, call_error};

fn device(tenant: u64, user: u64, device: &str) -> Option<Caller> {
    Some(Caller {
        tenant_id: tenant,
        user_id: user,
        device_id: device.to_string(),
    })
}

pub async fn run(
    mut sync: SyncClient<Authed>,
    tenant: u64,
    user: u64,
    name: String,
    from: u64,
) -> anyhow::Result<()> {
    let mut stream = sync
        .subscribe(SubscribeRequest {
            caller: device(tenant, user, &name),
            from_pts: from,
            queue_id: 0,
        })
        .await
        .map_err(call_error)?
        .into_inner();
    eprintln!("following user {user} on device {name:?}; Ctrl-C to stop");
    while let Some(push) = stream.message().await.map_err(call_error)? {
        match push.push {
            Some(sync_push::Push::Event(e)) => {
                let kind = SyncEventKind::try_from(e.kind).unwrap_or_default();
                match (&e.message, kind) {
                    (Some(m), SyncEventKind::Message) => {
                        println!("[{}] {}", e.conversation_id, render(m))
                    }
                    (Some(m), _) => println!("[{}] {} ({kind:?})", e.conversation_id, render(m)),
                    (None, _) => println!("[{}] {kind:?} {:?}", e.conversation_id, e.items),
                }
                sync.ack(AckRequest {
                    caller: device(tenant, user, &name),
                    pts: e.pts,
                    queue_id: e.queue_id,
                })
                .await
                .map_err(call_error)?;
            }
            Some(sync_push::Push::Rebase(r)) => {
                println!(
                    "(far behind: skipping to pts {}; your conversations:)",
                    r.latest_pts
                );
                list(sync.clone(), tenant, user).await?;
            }
            Some(sync_push::Push::Hint(h)) => {
                println!(
                    "[{}] new message #{} (large group: see history)",
                    h.conversation_id, h.latest_seq
                )
            }
            Some(sync_push::Push::Typing(t)) => {
                println!("[{}] user {} is typing…", t.conversation_id, t.user_id)
            }
            None => {}
        }
    }
    Ok(())
}

pub async fn list(mut sync: SyncClient<Authed>, tenant: u64, user: u64) -> anyhow::Result<()> {
    let list = sync
        .list_conversations(ListConversationsRequest {
            caller: device(tenant, user, ""),
            limit: 0,
            ids_only: false,
        })
        .await
        .map_err(call_error)?
        .into_inner();
    for c in list.conversations {
        let conv = c.conversation.unwrap_or_default();
        let last = c.last_message.as_ref().map(render).unwrap_or_default();
        let muted = if c.muted { " (muted)" } else { "" };
        println!(
            "{:<20} {:<16} unread {:<4}{muted} {last}",
            conv.conversation_id, conv.title, c.unread
        );
    }
    Ok(())
}
