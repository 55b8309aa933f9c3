//! gRPC handlers of the sync API.

use cellmesh_proto::ids::{ConversationId, UserId};
use std::sync::Arc;

use cellmesh_proto::v1::sync_server::Sync;
use cellmesh_proto::v1::*;
use tonic::{Request, Response, Status};

use crate::convert::{caller, conversation_id, device};
use crate::sync::SyncService;
use crate::sync::stream::PushStream;

pub struct SyncApi {
    service: Arc<SyncService>,
}

impl SyncApi {
    pub fn new(service: Arc<SyncService>) -> Self {
        Self { service }
    }
}

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl Sync for SyncApi {
    type SubscribeStream = PushStream;

    async fn subscribe(&self, request: Request<SubscribeRequest>) -> Reply<Self::SubscribeStream> {
        let r = request.into_inner();
        let pushes = self
            .service
            .subscribe(device(r.caller)?, r.from_pts, r.queue_id)
            .await?;
        Ok(Response::new(pushes))
    }

    async fn ack(&self, request: Request<AckRequest>) -> Reply<AckResponse> {
        let r = request.into_inner();
        Ok(Response::new(
            self.service
                .ack(device(r.caller)?, r.pts, r.queue_id)
                .await?,
        ))
    }

    async fn list_conversations(
        &self,
        request: Request<ListConversationsRequest>,
    ) -> Reply<ListConversationsResponse> {
        let r = request.into_inner();
        let caller = caller(r.caller)?;
        if r.ids_only {
            return Ok(Response::new(ListConversationsResponse {
                conversation_ids: (self.service.conversation_ids(caller)?.into_iter())
                    .map(ConversationId::get)
                    .collect(),
                ..Default::default()
            }));
        }
        let list = self.service.list_conversations(caller, r.limit)?;
        Ok(Response::new(list))
    }

    async fn set_muted(&self, request: Request<SetMutedRequest>) -> Reply<SetMutedResponse> {
        let r = request.into_inner();
        let conversation = conversation_id((ConversationId(r.conversation_id)).get())?;
        self.service
            .set_muted(caller(r.caller)?, conversation, r.muted)
            .await?;
        Ok(Response::new(SetMutedResponse {}))
    }

    async fn heartbeat(&self, request: Request<HeartbeatRequest>) -> Reply<HeartbeatResponse> {
        let device = device(request.into_inner().caller)?;
        let interval_ms = self.service.heartbeat(&device)?;
        Ok(Response::new(HeartbeatResponse { interval_ms }))
    }

    async fn get_presence(
        &self,
        request: Request<GetPresenceRequest>,
    ) -> Reply<GetPresenceResponse> {
        let r = request.into_inner();
        let caller = caller(r.caller)?;
        Ok(Response::new(
            self.service.presence(caller, &UserId::many(&r.user_ids))?,
        ))
    }

    async fn typing(&self, request: Request<TypingRequest>) -> Reply<TypingResponse> {
        let r = request.into_inner();
        let conversation = conversation_id((ConversationId(r.conversation_id)).get())?;
        self.service.typing(caller(r.caller)?, conversation)?;
        Ok(Response::new(TypingResponse {}))
    }
}
