//! gRPC handlers of the Attachments API: unwrap, convert, call the
//! [`MessageService`], map the error.

use std::sync::Arc;

use cellmesh_proto::ids::ConversationId;
use cellmesh_proto::v1::attachments_server::Attachments;
use cellmesh_proto::v1::*;
use tonic::{Request, Response};

use super::{Reply, to_end};
use crate::convert::{caller, conversation_id};
use crate::message::{CreateUploadCommand, MessageService};

pub struct AttachmentsApi {
    service: Arc<MessageService>,
}

impl AttachmentsApi {
    pub fn new(service: Arc<MessageService>) -> Self {
        Self { service }
    }
}

#[tonic::async_trait]
impl Attachments for AttachmentsApi {
    async fn create_upload(&self, request: Request<CreateUploadRequest>) -> Reply<UploadResponse> {
        let r = request.into_inner();
        let cmd = CreateUploadCommand {
            caller: caller(r.caller)?,
            conversation: conversation_id(r.conversation_id)?,
            name: r.name,
            content_type: r.content_type,
            size: r.size,
            sha256: r.sha256,
            client_req_id: r.client_req_id,
        };
        let upload = to_end(&self.service, |s| async move { s.create_upload(cmd).await }).await?;
        Ok(Response::new(upload))
    }

    async fn get_upload(&self, request: Request<GetUploadRequest>) -> Reply<UploadResponse> {
        let r = request.into_inner();
        let (who, conversation) = (
            caller(r.caller)?,
            conversation_id((ConversationId(r.conversation_id)).get())?,
        );
        let upload = self
            .service
            .get_upload(who, conversation, r.upload_id)
            .await?;
        Ok(Response::new(upload))
    }

    async fn complete_upload(
        &self,
        request: Request<CompleteUploadRequest>,
    ) -> Reply<CompleteUploadResponse> {
        let r = request.into_inner();
        let (who, conversation) = (
            caller(r.caller)?,
            conversation_id((ConversationId(r.conversation_id)).get())?,
        );
        let attachment = to_end(&self.service, |s| async move {
            s.complete_upload(who, conversation, r.upload_id).await
        })
        .await?;
        Ok(Response::new(CompleteUploadResponse {
            attachment: Some(attachment),
        }))
    }

    async fn get_download_url(
        &self,
        request: Request<GetDownloadUrlRequest>,
    ) -> Reply<GetDownloadUrlResponse> {
        let r = request.into_inner();
        let (who, conversation) = (
            caller(r.caller)?,
            conversation_id((ConversationId(r.conversation_id)).get())?,
        );
        let url = (self.service)
            .download_url(who, conversation, r.seq, r.attachment_id, r.thumbnail)
            .await?;
        Ok(Response::new(url))
    }
}
