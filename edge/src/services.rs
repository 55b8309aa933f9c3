//! The client-facing Messaging and Sync services of the edge: each handler
//! authenticates, picks the key that decides the owner (the conversation,
//! the tenant for a new conversation, the caller's home for sync) and
//! proxies to that cell. A sync stream that breaks at the owner's end ends
//! with `OWNER_UNREACHABLE` and the route, like a unary call.

use cellmesh_proto::ids::ConversationId;
use std::sync::Arc;

use cellmesh_proto::v1::attachments_client::AttachmentsClient;
use cellmesh_proto::v1::attachments_server::Attachments;
use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::messaging_server::Messaging;
use cellmesh_proto::v1::sync_client::SyncClient;
use cellmesh_proto::v1::sync_server::Sync;
use cellmesh_proto::v1::*;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status};

use cellmesh_telemetry::trace::grpc::record_call;

use super::open_streams::{OpenStreams, PushStream};
use super::proxy::{Proxy, is_transport_failure, owner_unreachable};
use cellmesh_route_client::table::Key;

/// How long one unary attempt at a cell may take before the edge looks
/// for a new owner (a hung cell must not hold requests past a failover).
const ATTEMPT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Clone)]
pub struct EdgeApi {
    pub proxy: Arc<Proxy>,
    /// The sync streams open through this edge, their tokens checked by
    /// one sweep.
    pub streams: Arc<OpenStreams>,
}

/// One proxied unary call: authenticate, resolve by `$key`, call `$method`.
macro_rules! proxied {
    ($self:ident, $request:ident, $client:ident, $method:ident, |$claims:ident, $m:ident| $key:expr) => {
        proxied!(
            $self,
            $request,
            $client,
            $method,
            Some(ATTEMPT_TIMEOUT),
            |$claims, $m| $key
        )
    };
    ($self:ident, $request:ident, $client:ident, $method:ident, $timeout:expr, |$claims:ident, $m:ident| $key:expr) => {{
        let ($claims, $m) = $self.proxy.authenticate($request).await?;
        let key = $key;
        $self
            .proxy
            .call(key, $m, $timeout, |channel, r| async move {
                $client::new(channel).$method(r).await
            })
            .await
    }};
}

#[tonic::async_trait]
impl Messaging for EdgeApi {
    async fn create_conversation(
        &self,
        request: Request<CreateConversationRequest>,
    ) -> Result<Response<CreateConversationResponse>, Status> {
        proxied!(
            self,
            request,
            MessagingClient,
            create_conversation,
            |c, m| Key::tenant(c.tenant)
        )
    }
    async fn add_members(
        &self,
        request: Request<ChangeMembersRequest>,
    ) -> Result<Response<ChangeMembersResponse>, Status> {
        proxied!(self, request, MessagingClient, add_members, |c, m| {
            Key::conversation(c.tenant, ConversationId(m.conversation_id))
        })
    }
    async fn remove_members(
        &self,
        request: Request<ChangeMembersRequest>,
    ) -> Result<Response<ChangeMembersResponse>, Status> {
        proxied!(self, request, MessagingClient, remove_members, |c, m| {
            Key::conversation(c.tenant, ConversationId(m.conversation_id))
        })
    }
    async fn set_member_role(
        &self,
        request: Request<SetMemberRoleRequest>,
    ) -> Result<Response<ChangeMembersResponse>, Status> {
        proxied!(self, request, MessagingClient, set_member_role, |c, m| {
            Key::conversation(c.tenant, ConversationId(m.conversation_id))
        })
    }
    async fn get_conversation(
        &self,
        request: Request<GetConversationRequest>,
    ) -> Result<Response<GetConversationResponse>, Status> {
        proxied!(self, request, MessagingClient, get_conversation, |c, m| {
            Key::conversation(c.tenant, ConversationId(m.conversation_id))
        })
    }
    async fn send(&self, request: Request<SendRequest>) -> Result<Response<SendResponse>, Status> {
        proxied!(self, request, MessagingClient, send, |c, m| {
            record_call(
                c.tenant.get(),
                m.conversation_id,
                c.user.get(),
                &m.client_req_id,
            );
            Key::conversation(c.tenant, ConversationId(m.conversation_id))
        })
    }
    async fn pull(&self, request: Request<PullRequest>) -> Result<Response<PullResponse>, Status> {
        proxied!(self, request, MessagingClient, pull, |c, m| {
            Key::conversation(c.tenant, ConversationId(m.conversation_id))
        })
    }
    async fn mark_read(
        &self,
        request: Request<MarkReadRequest>,
    ) -> Result<Response<MarkReadResponse>, Status> {
        proxied!(self, request, MessagingClient, mark_read, |c, m| {
            Key::conversation(c.tenant, ConversationId(m.conversation_id))
        })
    }
    async fn read_count(
        &self,
        request: Request<ReadCountRequest>,
    ) -> Result<Response<ReadCountResponse>, Status> {
        proxied!(self, request, MessagingClient, read_count, |c, m| {
            Key::conversation(c.tenant, ConversationId(m.conversation_id))
        })
    }
    async fn recall(
        &self,
        request: Request<RecallRequest>,
    ) -> Result<Response<MessageUpdateResponse>, Status> {
        proxied!(self, request, MessagingClient, recall, |c, m| {
            Key::conversation(c.tenant, ConversationId(m.conversation_id))
        })
    }
    async fn edit(
        &self,
        request: Request<EditRequest>,
    ) -> Result<Response<MessageUpdateResponse>, Status> {
        proxied!(self, request, MessagingClient, edit, |c, m| {
            Key::conversation(c.tenant, ConversationId(m.conversation_id))
        })
    }
    async fn delete_for_me(
        &self,
        request: Request<DeleteForMeRequest>,
    ) -> Result<Response<DeleteForMeResponse>, Status> {
        proxied!(self, request, MessagingClient, delete_for_me, |c, m| {
            Key::conversation(c.tenant, ConversationId(m.conversation_id))
        })
    }
    async fn search(
        &self,
        request: Request<SearchRequest>,
    ) -> Result<Response<SearchResponse>, Status> {
        crate::search::search(&self.proxy, request).await
    }
}

/// Completing an upload reads the file back to check its digest: it may
/// take long for a large file.
const COMPLETE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

#[tonic::async_trait]
impl Attachments for EdgeApi {
    async fn create_upload(
        &self,
        request: Request<CreateUploadRequest>,
    ) -> Result<Response<UploadResponse>, Status> {
        proxied!(
            self,
            request,
            AttachmentsClient,
            create_upload,
            Some(std::time::Duration::from_secs(10)),
            |c, m| Key::conversation(c.tenant, ConversationId(m.conversation_id))
        )
    }
    async fn get_upload(
        &self,
        request: Request<GetUploadRequest>,
    ) -> Result<Response<UploadResponse>, Status> {
        proxied!(
            self,
            request,
            AttachmentsClient,
            get_upload,
            Some(std::time::Duration::from_secs(10)),
            |c, m| Key::conversation(c.tenant, ConversationId(m.conversation_id))
        )
    }
    async fn complete_upload(
        &self,
        request: Request<CompleteUploadRequest>,
    ) -> Result<Response<CompleteUploadResponse>, Status> {
        proxied!(
            self,
            request,
            AttachmentsClient,
            complete_upload,
            Some(COMPLETE_TIMEOUT),
            |c, m| Key::conversation(c.tenant, ConversationId(m.conversation_id))
        )
    }
    async fn get_download_url(
        &self,
        request: Request<GetDownloadUrlRequest>,
    ) -> Result<Response<GetDownloadUrlResponse>, Status> {
        proxied!(
            self,
            request,
            AttachmentsClient,
            get_download_url,
            |c, m| { Key::conversation(c.tenant, ConversationId(m.conversation_id)) }
        )
    }
}

#[tonic::async_trait]
impl Sync for EdgeApi {
    type SubscribeStream = PushStream;

    async fn subscribe(
        &self,
        request: Request<SubscribeRequest>,
    ) -> Result<Response<PushStream>, Status> {
        // A stream lives long: no attempt timeout.
        let (claims, m) = self.proxy.authenticate(request).await?;
        let key = Key::user(claims.tenant, claims.user);
        let response = (self.proxy)
            .call(key, m, None, |channel, r| async move {
                SyncClient::new(channel).subscribe(r).await
            })
            .await?;
        // A stream the owner's end of broke ends with a stable code too.
        let proxy = self.proxy.clone();
        let stream = response.into_inner().map(move |item| {
            item.map_err(|status| match proxy.routes.resolve(&key) {
                Some(route) if is_transport_failure(&status) => {
                    owner_unreachable(&key, &route, &status)
                }
                _ => status,
            })
        });
        Ok(Response::new(
            self.streams.cut_when_refused(Box::pin(stream), claims),
        ))
    }
    async fn ack(&self, request: Request<AckRequest>) -> Result<Response<AckResponse>, Status> {
        proxied!(self, request, SyncClient, ack, |c, m| Key::user(
            c.tenant, c.user
        ))
    }
    async fn list_conversations(
        &self,
        request: Request<ListConversationsRequest>,
    ) -> Result<Response<ListConversationsResponse>, Status> {
        proxied!(self, request, SyncClient, list_conversations, |c, m| {
            Key::user(c.tenant, c.user)
        })
    }
    async fn set_muted(
        &self,
        request: Request<SetMutedRequest>,
    ) -> Result<Response<SetMutedResponse>, Status> {
        proxied!(self, request, SyncClient, set_muted, |c, m| Key::user(
            c.tenant, c.user
        ))
    }
    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        proxied!(self, request, SyncClient, heartbeat, |c, m| Key::user(
            c.tenant, c.user
        ))
    }
    async fn get_presence(
        &self,
        request: Request<GetPresenceRequest>,
    ) -> Result<Response<GetPresenceResponse>, Status> {
        proxied!(self, request, SyncClient, get_presence, |c, m| Key::user(
            c.tenant, c.user
        ))
    }
    async fn typing(
        &self,
        request: Request<TypingRequest>,
    ) -> Result<Response<TypingResponse>, Status> {
        proxied!(self, request, SyncClient, typing, |c, m| Key::conversation(
            c.tenant,
            ConversationId(m.conversation_id)
        ))
    }
}
