//! Stable error codes on the wire. Every cellmesh error travels as a
//! `tonic::Status` whose details hold an encoded [`ErrorDetail`]; this module
//! builds such statuses and reads them back, so servers and clients agree on
//! one mapping.

use prost::Message;

use crate::v1::{ErrorCode, ErrorDetail, Route};

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

    /// Whether the same request may simply be sent again later.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::RetryLater | ErrorCode::RateLimited | ErrorCode::WrongCell
        )
    }
}

/// Builds the status for an error.
pub fn to_status(
    code: ErrorCode,
    reason: &str,
    message: String,
    retry_after_ms: u64,
    route: Option<Route>,
) -> tonic::Status {
    let detail = ErrorDetail {
        code: code as i32,
        reason: reason.to_string(),
        message: message.clone(),
        retry_after_ms,
        route,
    };
    tonic::Status::with_details(code.grpc_code(), message, detail.encode_to_vec().into())
}

/// The stable detail of a status. Statuses produced outside cellmesh (the
/// transport, a proxy) get one derived from their gRPC code.
pub fn error_detail(status: &tonic::Status) -> ErrorDetail {
    if let Ok(detail) = ErrorDetail::decode(status.details())
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
            "NOT_OWNER",
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
