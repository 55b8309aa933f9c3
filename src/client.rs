//! Connecting to a cellmesh endpoint and showing its errors to a person.

use anyhow::Context;
use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::{Caller, ErrorCode};
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

pub fn caller(tenant: u64, user: u64) -> Option<Caller> {
    Some(Caller {
        tenant_id: tenant,
        user_id: user,
        device_id: String::new(),
    })
}

/// `CODE (REASON): message` for a failed call.
pub fn describe(status: &tonic::Status) -> String {
    let detail = error_detail(status);
    let code = ErrorCode::try_from(detail.code)
        .map(|c| {
            c.as_str_name()
                .trim_start_matches("ERROR_CODE_")
                .to_string()
        })
        .unwrap_or_else(|_| "UNKNOWN".into());
    let mut text = format!("{code} ({}): {}", detail.reason, detail.message);
    if detail.retry_after_ms > 0 {
        text.push_str(&format!(" [retry after {} ms]", detail.retry_after_ms));
    }
    text
}

/// Turns a failed call into an error a person can read.
pub fn call_error(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!(describe(&status))
}
