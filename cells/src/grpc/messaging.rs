//! gRPC handlers of the messaging API: unwrap, convert, call the
//! [`MessageService`], map the error.

use std::sync::Arc;

use cellmesh_proto::v1::messaging_server::Messaging;
use cellmesh_proto::v1::*;
use tonic::{Request, Response, Status};

use crate::message::MessageService;

pub struct MessagingApi {
    service: Arc<MessageService>,
}

impl MessagingApi {
    pub fn new(service: Arc<MessageService>) -> Self {
        Self { service }
    }
}

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl Messaging for MessagingApi {
    async fn create_conversation(
        &self,
        request: Request<CreateConversationRequest>,
    ) -> Reply<CreateConversationResponse> {
        let cmd = request.into_inner().try_into()?;
        let conversation = self.service.create_conversation(cmd).await?;
        Ok(Response::new(CreateConversationResponse {
            conversation: Some(conversation),
        }))
    }

    async fn add_members(
        &self,
        request: Request<ChangeMembersRequest>,
    ) -> Reply<ChangeMembersResponse> {
        let cmd = request.into_inner().try_into()?;
        Ok(Response::new(self.service.change_members(cmd, true).await?))
    }

    async fn remove_members(
        &self,
        request: Request<ChangeMembersRequest>,
    ) -> Reply<ChangeMembersResponse> {
        let cmd = request.into_inner().try_into()?;
        Ok(Response::new(
            self.service.change_members(cmd, false).await?,
        ))
    }

    async fn get_conversation(
        &self,
        request: Request<GetConversationRequest>,
    ) -> Reply<GetConversationResponse> {
        let cmd = request.into_inner().try_into()?;
        Ok(Response::new(self.service.get_conversation(cmd)?))
    }

    async fn send(&self, request: Request<SendRequest>) -> Reply<SendResponse> {
        let cmd = request.into_inner().try_into()?;
        Ok(Response::new(self.service.send(cmd).await?))
    }

    async fn pull(&self, request: Request<PullRequest>) -> Reply<PullResponse> {
        let cmd = request.into_inner().try_into()?;
        Ok(Response::new(self.service.pull(cmd)?))
    }

    async fn mark_read(&self, request: Request<MarkReadRequest>) -> Reply<MarkReadResponse> {
        let cmd = request.into_inner().try_into()?;
        Ok(Response::new(self.service.mark_read(cmd).await?))
    }

    async fn recall(&self, request: Request<RecallRequest>) -> Reply<MessageUpdateResponse> {
        let cmd = request.into_inner().try_into()?;
        let message = self.service.recall(cmd).await?;
        Ok(Response::new(MessageUpdateResponse {
            message: Some(message),
        }))
    }

    async fn edit(&self, request: Request<EditRequest>) -> Reply<MessageUpdateResponse> {
        let cmd = request.into_inner().try_into()?;
        let message = self.service.edit(cmd).await?;
        Ok(Response::new(MessageUpdateResponse {
            message: Some(message),
        }))
    }

    async fn delete_for_me(
        &self,
        request: Request<DeleteForMeRequest>,
    ) -> Reply<DeleteForMeResponse> {
        let cmd = request.into_inner().try_into()?;
        Ok(Response::new(self.service.delete_for_me(cmd).await?))
    }
}
