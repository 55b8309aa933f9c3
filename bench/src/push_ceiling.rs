//! The ceiling of a push on this machine (`bench push --ceiling`): a
//! server that answers the push bench over the cell's own gRPC services,
//! server stack and connection handling, with nothing behind them.
//! Conversations and members live in a map; a send is answered at once
//! and handed to every member's device stream through the cell's
//! [`Hub`] and inboxes, with a pts per user, as the cell pushes a live
//! event. No storage, fsync, queue or processor: what the bench measures
//! against it is what gRPC, HTTP/2 and the hand-off to device streams
//! cost on these cores, the most a cell could push here. Every other call
//! is refused as UNIMPLEMENTED.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use cellmesh_cell::UserKey;
use cellmesh_cell::sync::{Hub, Next, Subscription};
use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::v1 as pb;
use cellmesh_proto::v1::messaging_server::{Messaging, MessagingServer};
use cellmesh_proto::v1::sync_server::{Sync as SyncService, SyncServer};
use futures::Stream;
use tonic::{Request, Response, Status};

/// Streams one user may hold (the bench opens one per user).
const STREAMS_PER_USER: usize = 4;

/// A running ceiling server on its own runtime (as many worker threads as
/// a cell's runtime has here), stopped on drop.
pub struct CeilingServer {
    pub endpoint: String,
    runtime: Option<tokio::runtime::Runtime>,
    hub: Arc<Hub>,
}

impl CeilingServer {
    /// Starts serving on a free loopback port.
    pub fn start() -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .thread_name("ceiling")
            .enable_all()
            .build()?;
        let hub = Arc::new(Hub::new(60_000, STREAMS_PER_USER));
        let state = Ceiling {
            hub: hub.clone(),
            table: Arc::default(),
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        runtime.spawn(async move {
            let listener = match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => listener,
                Err(e) => return eprintln!("push ceiling server: {e}"),
            };
            let served = cellmesh_proto::server::builder()
                .layer(cellmesh_telemetry::server::ServerLayer)
                .add_service(MessagingServer::new(state.clone()))
                .add_service(SyncServer::new(state))
                .serve_with_incoming(cellmesh_proto::server::incoming(listener))
                .await;
            if let Err(e) = served {
                eprintln!("push ceiling server stopped: {e}");
            }
        });
        Ok(Self {
            endpoint,
            runtime: Some(runtime),
            hub,
        })
    }
}

impl Drop for CeilingServer {
    fn drop(&mut self) {
        self.hub.close();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[derive(Clone)]
struct Ceiling {
    hub: Arc<Hub>,
    table: Arc<Mutex<Table>>,
}

#[derive(Default)]
struct Table {
    /// conversation → (members, its latest seq)
    conversations: HashMap<ConversationId, (Vec<UserKey>, u64)>,
    /// user → the pts of their latest event
    pts: HashMap<UserKey, u64>,
}

fn user_of(caller: Option<&pb::Caller>) -> Result<UserKey, Status> {
    let caller = caller.ok_or_else(|| Status::invalid_argument("caller is required"))?;
    Ok(UserKey::new(
        TenantId(caller.tenant_id),
        UserId(caller.user_id),
    ))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Ceiling {
    fn create(&self, r: pb::CreateConversationRequest) -> Result<pb::Conversation, Status> {
        let creator = user_of(r.caller.as_ref())?;
        let mut members = vec![creator];
        members.extend((r.member_ids.iter()).map(|&u| UserKey::new(creator.tenant, UserId(u))));
        let mut table = self.table.lock().expect("ceiling table");
        let id = ConversationId(table.conversations.len() as u64 + 1);
        let member_count = members.len() as u32;
        table.conversations.insert(id, (members, 0));
        Ok(pb::Conversation {
            conversation_id: id.get(),
            tenant_id: creator.tenant.get(),
            kind: r.kind,
            created_by: creator.user.get(),
            member_count,
            ..Default::default()
        })
    }

    /// Answers a send and hands its message to every member's devices,
    /// each push with the member's next pts.
    fn deliver(&self, r: pb::SendRequest) -> Result<pb::SendResponse, Status> {
        let sender = user_of(r.caller.as_ref())?;
        let server_ts_ms = now_ms();
        let mut table = self.table.lock().expect("ceiling table");
        let Table { conversations, pts } = &mut *table;
        let (members, latest) = (conversations.get_mut(&ConversationId(r.conversation_id)))
            .filter(|(members, _)| members.contains(&sender))
            .ok_or_else(|| Status::not_found("no such conversation for this caller"))?;
        *latest += 1;
        let seq = *latest;
        let message = pb::Message {
            conversation_id: r.conversation_id,
            seq,
            msg_id: seq,
            sender_id: sender.user.get(),
            r#type: r.r#type,
            body: r.body,
            server_ts_ms,
            ..Default::default()
        };
        for member in members.iter() {
            let pts = pts.entry(*member).or_default();
            *pts += 1;
            let push = pb::SyncPush {
                push: Some(pb::sync_push::Push::Event(pb::SyncEvent {
                    pts: *pts,
                    kind: pb::SyncEventKind::Message as i32,
                    conversation_id: r.conversation_id,
                    seq,
                    message: Some(message.clone()),
                    items: Vec::new(),
                    server_ts_ms,
                    queue_id: 1,
                })),
            };
            self.hub.push(std::slice::from_ref(member), &push);
        }
        Ok(pb::SendResponse {
            msg_id: seq,
            seq,
            server_ts_ms,
            duplicate: false,
        })
    }
}

/// A device's stream: what its inbox holds, until the server stops.
pub struct Pushes {
    subscription: Subscription,
}

impl Stream for Pushes {
    type Item = Result<pb::SyncPush, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            return match self.subscription.inbox.poll_next(cx) {
                Poll::Ready(Next::Push(push)) => Poll::Ready(Some(Ok(push))),
                Poll::Ready(Next::Event(_) | Next::Lagged) => continue,
                Poll::Ready(Next::Superseded | Next::Closed) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            };
        }
    }
}

fn refused() -> Status {
    Status::unimplemented("not served by the push ceiling")
}

/// `impl $service for Ceiling`: the methods given, and every method
/// named after `refused` answering UNIMPLEMENTED.
macro_rules! ceiling_service {
    ($service:ident { $($given:tt)* } refused { $($name:ident($req:ident) -> $resp:ident;)* }) => {
        #[tonic::async_trait]
        impl $service for Ceiling {
            $($given)*
            $(async fn $name(&self, _: Request<pb::$req>) -> Result<Response<pb::$resp>, Status> {
                Err(refused())
            })*
        }
    };
}

ceiling_service!(Messaging {
    async fn create_conversation(
        &self,
        request: Request<pb::CreateConversationRequest>,
    ) -> Result<Response<pb::CreateConversationResponse>, Status> {
        let conversation = self.create(request.into_inner())?;
        Ok(Response::new(pb::CreateConversationResponse {
            conversation: Some(conversation),
        }))
    }

    async fn send(
        &self,
        request: Request<pb::SendRequest>,
    ) -> Result<Response<pb::SendResponse>, Status> {
        self.deliver(request.into_inner()).map(Response::new)
    }
} refused {
    add_members(ChangeMembersRequest) -> ChangeMembersResponse;
    remove_members(ChangeMembersRequest) -> ChangeMembersResponse;
    set_member_role(SetMemberRoleRequest) -> ChangeMembersResponse;
    get_conversation(GetConversationRequest) -> GetConversationResponse;
    pull(PullRequest) -> PullResponse;
    mark_read(MarkReadRequest) -> MarkReadResponse;
    read_count(ReadCountRequest) -> ReadCountResponse;
    recall(RecallRequest) -> MessageUpdateResponse;
    edit(EditRequest) -> MessageUpdateResponse;
    delete_for_me(DeleteForMeRequest) -> DeleteForMeResponse;
    search(SearchRequest) -> SearchResponse;
});

ceiling_service!(SyncService {
    type SubscribeStream = Pushes;

    async fn subscribe(
        &self,
        request: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Pushes>, Status> {
        let request = request.into_inner();
        let user = user_of(request.caller.as_ref())?;
        let device = request.caller.map(|c| c.device_id).unwrap_or_default();
        let subscription = (self.hub.subscribe(user, &device))
            .map_err(|_| Status::resource_exhausted("too many streams for this user"))?;
        Ok(Response::new(Pushes { subscription }))
    }
} refused {
    ack(AckRequest) -> AckResponse;
    list_conversations(ListConversationsRequest) -> ListConversationsResponse;
    set_muted(SetMutedRequest) -> SetMutedResponse;
    heartbeat(HeartbeatRequest) -> HeartbeatResponse;
    get_presence(GetPresenceRequest) -> GetPresenceResponse;
    typing(TypingRequest) -> TypingResponse;
});

#[cfg(test)]
mod tests {
    use super::*;
    use cellmesh_proto::v1::messaging_client::MessagingClient;
    use cellmesh_proto::v1::sync_client::SyncClient;

    fn caller(user: u64) -> Option<pb::Caller> {
        Some(pb::Caller {
            tenant_id: 7,
            user_id: user,
            device_id: format!("d{user}"),
        })
    }

    #[tokio::test]
    async fn every_member_gets_each_message_in_pts_order_and_strangers_are_refused() {
        let server = CeilingServer::start().unwrap();
        let channel = tonic::transport::Channel::from_shared(server.endpoint.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut messaging = MessagingClient::new(channel.clone());
        let mut sync = SyncClient::new(channel);
        let created = messaging
            .create_conversation(pb::CreateConversationRequest {
                caller: caller(1),
                member_ids: vec![2, 3],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let id = created.conversation.unwrap().conversation_id;
        let mut streams = Vec::new();
        for user in 1..=3 {
            let request = pb::SubscribeRequest {
                caller: caller(user),
                ..Default::default()
            };
            streams.push(sync.subscribe(request).await.unwrap().into_inner());
        }
        for body in [b"one".to_vec(), b"two".to_vec()] {
            let request = pb::SendRequest {
                caller: caller(2),
                conversation_id: id,
                body,
                ..Default::default()
            };
            messaging.send(request).await.unwrap();
        }
        let stranger = pb::SendRequest {
            caller: caller(9),
            conversation_id: id,
            ..Default::default()
        };
        let refused = messaging.send(stranger).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::NotFound);
        for stream in &mut streams {
            for (pts, body) in [(1, &b"one"[..]), (2, &b"two"[..])] {
                let push = stream.message().await.unwrap().unwrap();
                let Some(pb::sync_push::Push::Event(event)) = push.push else {
                    panic!("not an event: {push:?}");
                };
                assert_eq!((event.pts, event.seq), (pts, pts));
                assert_eq!(event.message.unwrap().body, body);
            }
        }
        let pull = messaging
            .pull(pb::PullRequest::default())
            .await
            .unwrap_err();
        assert_eq!(pull.code(), tonic::Code::Unimplemented);
    }
}
