//! The cell's error type. Each variant is something a caller can act on, and
//! maps to one of the stable codes of the API (`cellmesh.v1.ErrorCode`).

use cellmesh_proto::reason::Reason;
use std::time::Duration;

use cellmesh_proto::status::to_status;
use cellmesh_proto::v1::ErrorCode;

use crate::cold::ColdError;
use crate::storage::StorageError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum CellError {
    #[error("{message}")]
    InvalidArgument { reason: Reason, message: String },
    #[error("{message}")]
    Unauthenticated { message: String },
    #[error("{message}")]
    PermissionDenied { reason: Reason, message: String },
    #[error("{what} {id} not found")]
    NotFound { what: &'static str, id: u64 },
    #[error("rate limit of the {scope} exceeded")]
    RateLimited {
        scope: &'static str,
        retry_after: Duration,
    },
    #[error("{message}")]
    RetryLater {
        reason: Reason,
        message: String,
        retry_after: Duration,
    },
    /// This cell does not own the key; `route` says who does.
    #[error("{message}")]
    WrongCell {
        message: String,
        route: Box<cellmesh_proto::v1::Route>,
    },
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    #[error("cold tier: {0}")]
    Cold(#[from] ColdError),
}

pub type Result<T, E = CellError> = std::result::Result<T, E>;

impl CellError {
    pub fn invalid(reason: Reason, message: impl Into<String>) -> Self {
        Self::InvalidArgument {
            reason,
            message: message.into(),
        }
    }

    pub fn denied(reason: Reason, message: impl Into<String>) -> Self {
        Self::PermissionDenied {
            reason,
            message: message.into(),
        }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            Self::InvalidArgument { .. } => ErrorCode::InvalidArgument,
            Self::Unauthenticated { .. } => ErrorCode::Unauthenticated,
            Self::PermissionDenied { .. } => ErrorCode::PermissionDenied,
            Self::NotFound { .. } => ErrorCode::NotFound,
            Self::RateLimited { .. } => ErrorCode::RateLimited,
            Self::RetryLater { .. } => ErrorCode::RetryLater,
            Self::WrongCell { .. } => ErrorCode::WrongCell,
            Self::Storage(StorageError::Closed) => ErrorCode::RetryLater,
            Self::Storage(_) => ErrorCode::Internal,
            Self::Cold(ColdError::Store(_)) => ErrorCode::RetryLater,
            Self::Cold(_) => ErrorCode::Internal,
        }
    }

    /// Stable machine-readable reason within the code.
    pub fn reason(&self) -> Reason {
        match self {
            Self::InvalidArgument { reason, .. }
            | Self::PermissionDenied { reason, .. }
            | Self::RetryLater { reason, .. } => *reason,
            Self::Unauthenticated { .. } => Reason::NoCaller,
            Self::WrongCell { .. } => Reason::NotOwner,
            Self::NotFound { what, .. } => match *what {
                "message" => Reason::MessageNotFound,
                _ => Reason::ConversationNotFound,
            },
            Self::RateLimited { scope, .. } => match *scope {
                "user" | "user_calls" => Reason::UserRateLimited,
                "streams" => Reason::TooManyStreams,
                "uploads" => Reason::UploadRateLimited,
                _ => Reason::ConversationRateLimited,
            },
            Self::Storage(StorageError::Closed) => Reason::ShuttingDown,
            Self::Storage(StorageError::Failed(_)) => Reason::StorageFailed,
            Self::Storage(_) => Reason::StorageError,
            Self::Cold(ColdError::Corrupt { .. }) => Reason::SegmentCorrupt,
            Self::Cold(ColdError::Missing { .. }) => Reason::SegmentMissing,
            Self::Cold(ColdError::Store(_)) => Reason::ColdTierUnavailable,
        }
    }

    fn retry_after(&self) -> Duration {
        match self {
            Self::RateLimited { retry_after, .. } | Self::RetryLater { retry_after, .. } => {
                *retry_after
            }
            Self::Cold(ColdError::Store(_)) => Duration::from_millis(500),
            _ => Duration::ZERO,
        }
    }
}

impl From<CellError> for tonic::Status {
    fn from(err: CellError) -> Self {
        if err.code() == ErrorCode::Internal {
            tracing::error!(error = %err, "request failed");
        }
        // A non-zero wait never rounds down to "no wait".
        let retry_ms = err.retry_after().as_nanos().div_ceil(1_000_000) as u64;
        let route = match &err {
            CellError::WrongCell { route, .. } => Some((**route).clone()),
            _ => None,
        };
        to_status(err.code(), err.reason(), err.to_string(), retry_ms, route)
    }
}

/// Runs a storage scan on the blocking pool, off the request threads; one
/// that does not finish is retryable.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, CellError> + Send + 'static,
) -> Result<T, CellError> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        Err(CellError::RetryLater {
            reason: Reason::StorageError,
            message: format!("a storage scan did not finish: {e}"),
            retry_after: std::time::Duration::from_millis(200),
        })
    })
}
