//! The deployment's shared secret. Components of one deployment (edges,
//! cells, routers, control plane) attach it to every internal call; servers
//! that are not client-facing refuse calls that lack it. An empty secret
//! disables the check (a standalone dev cell).

use crate::reason::Reason;
use std::sync::Arc;

use tonic::metadata::MetadataValue;
use tonic::{Request, Status};

use crate::status::to_status;
use crate::v1::ErrorCode;

/// The metadata key the secret travels under.
pub const HEADER: &str = "x-cellmesh-secret";

#[derive(Clone, Default)]
pub struct ClusterSecret(Option<Arc<str>>);

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ClusterSecret(set)"
        } else {
            "ClusterSecret(none)"
        })
    }
}

impl ClusterSecret {
    pub fn new(secret: &str) -> Self {
        Self((!secret.is_empty()).then(|| Arc::from(secret)))
    }

    /// Adds the secret to an outgoing request.
    pub fn attach<T>(&self, request: &mut Request<T>) {
        if let Some(secret) = &self.0
            && let Ok(value) = MetadataValue::try_from(secret.as_ref())
        {
            request.metadata_mut().insert(HEADER, value);
        }
    }

    /// Checks an incoming request (a tonic interceptor).
    pub fn check(&self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(secret) = &self.0 else {
            return Ok(request);
        };
        let presented = request
            .metadata()
            .get(HEADER)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        if constant_time_eq(presented, secret.as_bytes()) {
            Ok(request)
        } else {
            Err(to_status(
                ErrorCode::Unauthenticated,
                Reason::NotADeploymentComponent,
                "this endpoint only serves the deployment's own components".into(),
                0,
                None,
            ))
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_right_secret_passes() {
        let secret = ClusterSecret::new("s3cret");
        let mut ok = Request::new(());
        secret.attach(&mut ok);
        assert!(secret.check(ok).is_ok());
        assert!(secret.check(Request::new(())).is_err());
        let mut wrong = Request::new(());
        ClusterSecret::new("s3creT").attach(&mut wrong);
        let err = secret.check(wrong).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
        assert!(ClusterSecret::default().check(Request::new(())).is_ok());
    }
}
