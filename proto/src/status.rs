//! Stable error codes on the wire. Every cellmesh error travels as a
//! `tonic::Status` whose details are a standard `google.rpc.Status` — so any
//! gRPC client's status helpers decode it — holding a `google.rpc.ErrorInfo`
//! (the stable reason, domain [`DOMAIN`], the code and route as metadata), a
//! `google.rpc.RetryInfo` when a retry should wait, and the full
//! [`ErrorDetail`]. This module builds such statuses and reads them back
//! ([`error_detail`]), so servers and clients agree on one mapping.

use std::collections::HashMap;

use prost::Message;
use prost_types::Any;

use crate::google::rpc::{ErrorInfo, RetryInfo, Status as RpcStatus};
use crate::reason::Reason;
use crate::v1::{ErrorCode, ErrorDetail, Route};

/// The `ErrorInfo.domain` of every cellmesh error.
pub const DOMAIN: &str = "cellmesh";

const TYPE_ERROR_INFO: &str = "type.googleapis.com/google.rpc.ErrorInfo";
const TYPE_RETRY_INFO: &str = "type.googleapis.com/google.rpc.RetryInfo";
const TYPE_ERROR_DETAIL: &str = "type.googleapis.com/cellmesh.v1.ErrorDetail";

impl ErrorCode {
    /// The gRPC status code each stable code travels under.
    pub fn grpc_code(self) -> tonic::Code {
        match self {
            ErrorCode::Unspecified | ErrorCode::Internal => tonic::Code::Internal,
            ErrorCode::InvalidArgument => tonic::Code::InvalidArgument,
            ErrorCode::Unauthenticated => tonic::Code::Unauthenticated,
            ErrorCode::PermissionDenied => tonic::Code::PermissionDenied,
            ErrorCode::NotFound => tonic::Code::NotFound,
            ErrorCode::WrongCell => tonic::Code::FailedPrecondition,
            ErrorCode::RetryLater => tonic::Code::Unavailable,
            ErrorCode::RateLimited => tonic::Code::ResourceExhausted,
        }
    }

    /// The code's name without the enum prefix, e.g. `RETRY_LATER`.
    pub fn short_name(self) -> &'static str {
        let name = self.as_str_name();
        name.strip_prefix("ERROR_CODE_").unwrap_or(name)
    }

    /// Whether the same request may simply be sent again later.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::RetryLater | ErrorCode::RateLimited | ErrorCode::WrongCell
        )
    }
}

impl ErrorDetail {
    /// The reason as one of ours (`None` for a status some other server or
    /// the transport produced, e.g. `GRPC_UNAVAILABLE`).
    pub fn known_reason(&self) -> Option<Reason> {
        Reason::parse(&self.reason)
    }
}

/// Builds the status for an error.
pub fn to_status(
    code: ErrorCode,
    reason: Reason,
    message: String,
    retry_after_ms: u64,
    route: Option<Route>,
) -> tonic::Status {
    let mut metadata = HashMap::from([("code".to_string(), code.short_name().to_string())]);
    if let Some(route) = &route {
        metadata.insert("cell_id".into(), route.cell_id.clone());
        metadata.insert("address".into(), route.cell_address.clone());
        metadata.insert("epoch".into(), route.epoch.to_string());
    }
    let mut details = vec![Any {
        type_url: TYPE_ERROR_INFO.into(),
        value: ErrorInfo {
            reason: reason.as_str().to_string(),
            domain: DOMAIN.into(),
            metadata,
        }
        .encode_to_vec(),
    }];
    if retry_after_ms > 0 {
        let delay = std::time::Duration::from_millis(retry_after_ms);
        details.push(Any {
            type_url: TYPE_RETRY_INFO.into(),
            value: RetryInfo {
                retry_delay: Some(prost_types::Duration {
                    seconds: delay.as_secs() as i64,
                    nanos: delay.subsec_nanos() as i32,
                }),
            }
            .encode_to_vec(),
        });
    }
    details.push(Any {
        type_url: TYPE_ERROR_DETAIL.into(),
        value: ErrorDetail {
            code: code as i32,
            reason: reason.to_string(),
            message: message.clone(),
            retry_after_ms,
            route,
        }
        .encode_to_vec(),
    });
    let grpc = code.grpc_code();
    let status = RpcStatus {
        code: grpc as i32,
        message: message.clone(),
        details,
    };
    tonic::Status::with_details(grpc, message, status.encode_to_vec().into())
}

/// The cellmesh detail inside a status's standard details, if it has one.
fn cellmesh_detail(status: &tonic::Status) -> Option<ErrorDetail> {
    let standard = RpcStatus::decode(status.details()).ok()?;
    let mut from_info = None;
    for any in &standard.details {
        match any.type_url.as_str() {
            TYPE_ERROR_DETAIL => return ErrorDetail::decode(any.value.as_slice()).ok(),
            TYPE_ERROR_INFO => {
                let info = ErrorInfo::decode(any.value.as_slice()).ok()?;
                let code = info
                    .metadata
                    .get("code")
                    .and_then(|c| ErrorCode::from_str_name(&format!("ERROR_CODE_{c}")));
                if info.domain == DOMAIN
                    && let Some(code) = code
                {
                    from_info = Some(ErrorDetail {
                        code: code as i32,
                        reason: info.reason,
                        message: status.message().to_string(),
                        retry_after_ms: 0,
                        route: None,
                    });
                }
            }
            _ => {}
        }
    }
    from_info
}

/// The stable detail of a status. Statuses produced outside cellmesh (the
/// transport, a proxy) get one derived from their gRPC code.
pub fn error_detail(status: &tonic::Status) -> ErrorDetail {
    if let Some(detail) = cellmesh_detail(status)
        && detail.code != ErrorCode::Unspecified as i32
    {
        return detail;
    }
    let code = match status.code() {
        tonic::Code::InvalidArgument | tonic::Code::OutOfRange => ErrorCode::InvalidArgument,
        tonic::Code::Unauthenticated => ErrorCode::Unauthenticated,
        tonic::Code::PermissionDenied => ErrorCode::PermissionDenied,
        tonic::Code::NotFound => ErrorCode::NotFound,
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Aborted => {
            ErrorCode::RetryLater
        }
        tonic::Code::ResourceExhausted => ErrorCode::RateLimited,
        _ => ErrorCode::Internal,
    };
    ErrorDetail {
        code: code as i32,
        reason: format!("GRPC_{:?}", status.code()).to_uppercase(),
        message: status.message().to_string(),
        retry_after_ms: 0,
        route: None,
    }
}

/// `CODE (REASON): message` for a failed call, for people.
pub fn describe(status: &tonic::Status) -> String {
    let detail = error_detail(status);
    let code = ErrorCode::try_from(detail.code)
        .map(|c| c.short_name().to_string())
        .unwrap_or_else(|_| "UNKNOWN".into());
    let mut text = format!("{code} ({}): {}", detail.reason, detail.message);
    if detail.retry_after_ms > 0 {
        text.push_str(&format!(" [retry after {} ms]", detail.retry_after_ms));
    }
    text
}

/// The stable code of a status (see [`error_detail`]).
pub fn error_code(status: &tonic::Status) -> ErrorCode {
    ErrorCode::try_from(error_detail(status).code).unwrap_or(ErrorCode::Internal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detail_round_trips_through_status() {
        let route = Route {
            epoch: 7,
            cell_id: "eu-west/c2".into(),
            ..Default::default()
        };
        let status = to_status(
            ErrorCode::WrongCell,
            Reason::NotOwner,
            "moved".into(),
            0,
            Some(route.clone()),
        );
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        let detail = error_detail(&status);
        assert_eq!(detail.code, ErrorCode::WrongCell as i32);
        assert_eq!(detail.reason, "NOT_OWNER");
        assert_eq!(detail.route, Some(route));
    }

    #[test]
    fn details_are_a_standard_google_rpc_status() {
        let status = to_status(
            ErrorCode::RetryLater,
            Reason::OwnerUnreachable,
            "owner down".into(),
            250,
            None,
        );
        let standard = RpcStatus::decode(status.details()).unwrap();
        assert_eq!(standard.code, tonic::Code::Unavailable as i32);
        let info = standard
            .details
            .iter()
            .find(|a| a.type_url == TYPE_ERROR_INFO)
            .map(|a| ErrorInfo::decode(a.value.as_slice()).unwrap())
            .unwrap();
        assert_eq!(
            (info.reason.as_str(), info.domain.as_str()),
            ("OWNER_UNREACHABLE", DOMAIN)
        );
        assert_eq!(info.metadata["code"], "RETRY_LATER");
        let retry = standard
            .details
            .iter()
            .find(|a| a.type_url == TYPE_RETRY_INFO)
            .map(|a| RetryInfo::decode(a.value.as_slice()).unwrap())
            .unwrap();
        assert_eq!(retry.retry_delay.unwrap().nanos, 250_000_000);
        assert_eq!(error_detail(&status).retry_after_ms, 250);
    }

    #[test]
    fn foreign_status_maps_to_a_stable_code() {
        let status = tonic::Status::resource_exhausted("message too large");
        assert_eq!(error_code(&status), ErrorCode::RateLimited);
        let status = tonic::Status::out_of_range("decode");
        assert_eq!(error_code(&status), ErrorCode::InvalidArgument);
        assert_eq!(
            error_code(&tonic::Status::unknown("x")),
            ErrorCode::Internal
        );
    }
}
