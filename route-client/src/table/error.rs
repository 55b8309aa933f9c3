//! Why a route write was refused. Deterministic: every replica applying the
//! same command reaches the same error, which is returned as the command's
//! result rather than failing the Raft log.

use cellmesh_proto::reason::Reason;
use cellmesh_proto::v1::ErrorCode;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum RouteError {
    #[error("invalid {field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("unknown cell {0:?}")]
    UnknownCell(String),
    #[error("no route for {0}")]
    NoRoute(String),
    #[error("{key} is at epoch {current}, not {expected}")]
    StaleEpoch {
        key: String,
        expected: u64,
        current: u64,
    },
    #[error("{key} is {state}: cannot {transition}")]
    IllegalTransition {
        key: String,
        state: String,
        transition: String,
    },
    /// A release older than the cluster version, or a finalize that some
    /// process is not ready for.
    #[error("{0}")]
    VersionBehind(String),
    /// A route of a tenant bound to regions, towards a cell outside them.
    #[error("{0}")]
    Residency(String),
}

impl RouteError {
    pub fn invalid(field: &str, reason: impl Into<String>) -> Self {
        RouteError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The stable code and reason on the wire.
    pub fn code(&self) -> (ErrorCode, Reason) {
        match self {
            RouteError::Invalid { .. } => (ErrorCode::InvalidArgument, Reason::InvalidRouteCommand),
            RouteError::UnknownCell(_) => (ErrorCode::NotFound, Reason::UnknownCell),
            RouteError::NoRoute(_) => (ErrorCode::NotFound, Reason::NoRoute),
            RouteError::StaleEpoch { .. } => (ErrorCode::InvalidArgument, Reason::StaleEpoch),
            RouteError::IllegalTransition { .. } => {
                (ErrorCode::InvalidArgument, Reason::IllegalTransition)
            }
            RouteError::VersionBehind(_) => (ErrorCode::InvalidArgument, Reason::VersionBehind),
            RouteError::Residency(_) => (ErrorCode::PermissionDenied, Reason::ResidencyViolation),
        }
    }

    pub fn to_status(&self) -> tonic::Status {
        let (code, reason) = self.code();
        cellmesh_proto::status::to_status(code, reason, self.to_string(), 0, None)
    }
}
