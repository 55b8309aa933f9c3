//! Connecting to a cellmesh endpoint and showing its errors to a person.

use anyhow::Context;
use cellmesh_proto::v1::Caller;
use cellmesh_proto::v1::messaging_client::MessagingClient;
use tonic::transport::Channel;

/// Responses may carry pages of up to a few MiB.
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

pub async fn connect(endpoint: &str) -> anyhow::Result<MessagingClient<Channel>> {
    let channel = Channel::from_shared(endpoint.to_string())
        .with_context(|| format!("invalid endpoint {endpoint:?}"))?
        .connect()
        .await
        .with_context(|| format!("cannot connect to {endpoint}"))?;
    Ok(MessagingClient::new(channel).max_decoding_message_size(MAX_RESPONSE_BYTES))
}

/// Adds `authorization: Bearer TOKEN` (when there is a token) to every call.
#[derive(Clone)]
pub struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

pub type Authed = tonic::service::interceptor::InterceptedService<Channel, Bearer>;

/// A channel to `endpoint` and the interceptor that carries `token`.
async fn authed(endpoint: &str, token: Option<&str>) -> anyhow::Result<(Channel, Bearer)> {
    let channel = Channel::from_shared(endpoint.to_string())
        .with_context(|| format!("invalid endpoint {endpoint:?}"))?
        .connect()
        .await
        .with_context(|| format!("cannot connect to {endpoint}"))?;
    let bearer = Bearer(
        token
            .map(|t| format!("Bearer {t}").parse())
            .transpose()
            .context("the token is not valid header text")?,
    );
    Ok((channel, bearer))
}

/// Messaging and sync clients of `endpoint` (an edge when `token` is set).
pub async fn connect_as(
    endpoint: &str,
    token: Option<&str>,
) -> anyhow::Result<(
    MessagingClient<Authed>,
    cellmesh_proto::v1::sync_client::SyncClient<Authed>,
)> {
    let (channel, bearer) = authed(endpoint, token).await?;
    Ok((
        MessagingClient::with_interceptor(channel.clone(), bearer.clone())
            .max_decoding_message_size(MAX_RESPONSE_BYTES),
        cellmesh_proto::v1::sync_client::SyncClient::with_interceptor(channel, bearer)
            .max_decoding_message_size(MAX_RESPONSE_BYTES),
    ))
}

/// An Attachments client of `endpoint` (an edge when `token` is set).
pub async fn attachments_as(
    endpoint: &str,
    token: Option<&str>,
) -> anyhow::Result<cellmesh_proto::v1::attachments_client::AttachmentsClient<Authed>> {
    let (channel, bearer) = authed(endpoint, token).await?;
    Ok(
        cellmesh_proto::v1::attachments_client::AttachmentsClient::with_interceptor(
            channel, bearer,
        ),
    )
}

pub fn caller(tenant: u64, user: u64) -> Option<Caller> {
    Some(Caller {
        tenant_id: tenant,
        user_id: user,
        device_id: String::new(),
    })
}

pub use cellmesh_proto::status::describe;

/// Turns a failed call into an error a person can read.
pub fn call_error(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!(describe(&status))
}
