//! gRPC handlers of the messaging API: unwrap, convert, call the
//! [`MessageService`], map the error.

use std::sync::Arc;

use cellmesh_proto::v1::messaging_server::Messaging;
use cellmesh_proto::v1::*;
use tonic::{Request, Response, Status};

use cellmesh_telemetry::trace::grpc::record_call;

use crate::error::CellError;
use crate::message::{MessageService, SendCommand};

pub struct MessagingApi {
    service: Arc<MessageService>,
}

impl MessagingApi {
    pub fn new(service: Arc<MessageService>) -> Self {
        Self { service }
    }

    async fn to_end<T, F>(&self, write: impl FnOnce(Arc<MessageService>) -> F) -> Result<T, Status>
    where
        F: Future<Output = Result<T, CellError>> + Send + 'static,
        T: Send + 'static,
    {
        super::to_end(&self.service, write).await
    }
}

use super::Reply;

#[tonic::async_trait]
impl Messaging for MessagingApi {
    async fn create_conversation(
        &self,
        request: Request<CreateConversationRequest>,
    ) -> Reply<CreateConversationResponse> {
        let cmd = request.into_inner().try_into()?;
        let conversation = self
            .to_end(|s| async move { s.create_conversation(cmd).await })
            .await?;
        Ok(Response::new(CreateConversationResponse {
            conversation: Some(conversation),
        }))
    }

    async fn add_members(
        &self,
        request: Request<ChangeMembersRequest>,
    ) -> Reply<ChangeMembersResponse> {
        let cmd = request.into_inner().try_into()?;
        Ok(Response::new(
            self.to_end(|s| async move { s.change_members(cmd, true).await })
                .await?,
        ))
    }

    async fn remove_members(
        &self,
        request: Request<ChangeMembersRequest>,
    ) -> Reply<ChangeMembersResponse> {
        let cmd = request.into_inner().try_into()?;
        Ok(Response::new(
            self.to_end(|s| async move { s.change_members(cmd, false).await })
                .await?,
        ))
    }

    async fn set_member_role(
        &self,
        request: Request<SetMemberRoleRequest>,
    ) -> Reply<ChangeMembersResponse> {
        let cmd = request.into_inner().try_into()?;
        Ok(Response::new(
            self.to_end(|s| async move { s.set_member_role(cmd).await })
                .await?,
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
        let cmd: SendCommand = request.into_inner().try_into()?;
        record_call(
            cmd.caller.tenant.get(),
            cmd.conversation.get(),
            cmd.caller.user.get(),
            &cmd.client_req_id,
        );
        Ok(Response::new(
            self.to_end(|s| async move { s.send(cmd).await }).await?,
        ))
    }

    async fn pull(&self, request: Request<PullRequest>) -> Reply<PullResponse> {
        let cmd = request.into_inner().try_into()?;
        Ok(Response::new(self.service.pull(cmd).await?))
    }

    async fn search(&self, request: Request<SearchRequest>) -> Reply<SearchResponse> {
        let cmd = request.into_inner().try_into()?;
        Ok(Response::new(self.service.search(cmd).await?))
    }

    async fn mark_read(&self, request: Request<MarkReadRequest>) -> Reply<MarkReadResponse> {
        let cmd = request.into_inner().try_into()?;
        Ok(Response::new(
            self.to_end(|s| async move { s.mark_read(cmd).await })
                .await?,
        ))
    }

    async fn read_count(&self, request: Request<ReadCountRequest>) -> Reply<ReadCountResponse> {
        let cmd = request.into_inner().try_into()?;
        Ok(Response::new(
            self.to_end(|s| async move { s.read_count(cmd).await })
                .await?,
        ))
    }

    async fn recall(&self, request: Request<RecallRequest>) -> Reply<MessageUpdateResponse> {
        let cmd = request.into_inner().try_into()?;
        let message = self.to_end(|s| async move { s.recall(cmd).await }).await?;
        Ok(Response::new(MessageUpdateResponse {
            message: Some(message),
        }))
    }

    async fn edit(&self, request: Request<EditRequest>) -> Reply<MessageUpdateResponse> {
        let cmd = request.into_inner().try_into()?;
        let message = self.to_end(|s| async move { s.edit(cmd).await }).await?;
        Ok(Response::new(MessageUpdateResponse {
            message: Some(message),
        }))
    }

    async fn delete_for_me(
        &self,
        request: Request<DeleteForMeRequest>,
    ) -> Reply<DeleteForMeResponse> {
        let cmd = request.into_inner().try_into()?;
        Ok(Response::new(
            self.to_end(|s| async move { s.delete_for_me(cmd).await })
                .await?,
        ))
    }
}
