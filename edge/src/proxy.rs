//! Sends one client request to the cell that owns it: authenticates the
//! token and stamps the caller, resolves the owner from the route cache,
//! and retries with bounded backoff on `WRONG_CELL` (after refreshing the
//! route) and on the transient answers of a migration (`FROZEN`), of a cell
//! whose route view is behind, or of one whose owner lease lapsed (a
//! renewal late under load; a cut-off owner's route moves meanwhile). An
//! owner that cannot be reached (a killed or hung cell, a cut link) is retried within the deadline with the route
//! refreshed, then answered `RETRY_LATER` (gRPC `UNAVAILABLE`) with reason
//! `OWNER_UNREACHABLE` and the route: a transport failure never reaches a
//! client without a stable code. Other answers go back to the client as-is.
//! Conversations are created on their tenant's cell, or on the target of
//! the tenant's migration while it moves.

use cellmesh_proto::reason::Reason;
use std::future::Future;
use std::time::{Duration, Instant};

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::status::{error_detail, to_status};
use cellmesh_proto::v1::{self as pb, ErrorCode};
use cellmesh_telemetry::trace::grpc::Channel;
use tonic::{Request, Response, Status};

use super::auth::{Claims, TokenKey};
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::convert::route_to_pb;
use cellmesh_route_client::peers::Peers;
use cellmesh_route_client::table::{Key, Resolved, Scope};

/// Reasons of RETRY_LATER answers the edge retries itself.
const RETRIED_REASONS: [Reason; 5] = [
    Reason::Frozen,
    Reason::RouteBehind,
    Reason::NoRoute,
    Reason::OwnerLeaseExpired,
    Reason::PreviousOwnerLease,
];

/// A request that names its caller.
pub trait HasCaller {
    fn caller_mut(&mut self) -> &mut Option<pb::Caller>;
    /// Stamps the route epoch the owner was resolved at (sends only).
    fn set_route_epoch(&mut self, _epoch: u64) {}
}

macro_rules! has_caller {
    ($($t:ty),*) => {$(
        impl HasCaller for $t {
            fn caller_mut(&mut self) -> &mut Option<pb::Caller> {
                &mut self.caller
            }
        }
    )*};
}

has_caller!(
    pb::CreateConversationRequest,
    pb::ChangeMembersRequest,
    pb::SetMemberRoleRequest,
    pb::GetConversationRequest,
    pb::PullRequest,
    pb::MarkReadRequest,
    pb::ReadCountRequest,
    pb::RecallRequest,
    pb::EditRequest,
    pb::DeleteForMeRequest,
    pb::SubscribeRequest,
    pb::AckRequest,
    pb::ListConversationsRequest,
    pb::SetMutedRequest,
    pb::HeartbeatRequest,
    pb::GetPresenceRequest,
    pb::TypingRequest,
    pb::CreateUploadRequest,
    pb::GetUploadRequest,
    pb::CompleteUploadRequest,
    pb::GetDownloadUrlRequest,
    pb::SearchRequest
);

impl HasCaller for pb::SendRequest {
    fn caller_mut(&mut self) -> &mut Option<pb::Caller> {
        &mut self.caller
    }
    fn set_route_epoch(&mut self, epoch: u64) {
        self.route_epoch = epoch;
    }
}

pub struct Proxy {
    pub routes: RouteClient,
    secret: ClusterSecret,
    tokens: TokenKey,
    /// Channels to the cells, through the deployment's links.
    peers: Peers,
    /// How long one request may keep retrying.
    deadline: Duration,
    attempts: usize,
}

impl Proxy {
    pub fn new(
        routes: RouteClient,
        secret: ClusterSecret,
        tokens: TokenKey,
        deadline: Duration,
        attempts: usize,
        links: std::collections::BTreeMap<String, String>,
    ) -> Self {
        Self {
            routes,
            secret,
            tokens,
            peers: Peers::new(links),
            deadline,
            attempts,
        }
    }

    /// Verifies the token and makes the request's caller the token's.
    /// The token checks this proxy runs.
    pub fn tokens(&self) -> &TokenKey {
        &self.tokens
    }

    pub async fn authenticate<T: HasCaller>(
        &self,
        request: Request<T>,
    ) -> Result<(Claims, T), Status> {
        let claims = self.tokens.verify_metadata(request.metadata()).await?;
        let mut message = request.into_inner();
        let caller = message.caller_mut();
        if let Some(c) = caller.as_ref() {
            if c.tenant_id != 0 && c.tenant_id != claims.tenant.get() {
                return Err(to_status(
                    ErrorCode::PermissionDenied,
                    Reason::CrossTenant,
                    format!(
                        "the token is for tenant {}, the request names {}",
                        claims.tenant, c.tenant_id
                    ),
                    0,
                    None,
                ));
            }
            if c.user_id != 0 && c.user_id != claims.user.get() {
                return Err(to_status(
                    ErrorCode::PermissionDenied,
                    Reason::CallerMismatch,
                    "the request names another user than the token".into(),
                    0,
                    None,
                ));
            }
        }
        *caller = Some(pb::Caller {
            tenant_id: claims.tenant.get(),
            user_id: claims.user.get(),
            device_id: claims.device.clone(),
        });
        Ok((claims, message))
    }

    fn channel(&self, address: &str) -> Result<Channel, Status> {
        (self.peers.channel(address)).map_err(|e| Status::internal(e.to_string()))
    }

    /// Calls the owner of `key` with `message`, retrying as described above.
    pub async fn call<T, R, F, Fut>(
        &self,
        key: Key,
        message: T,
        attempt_timeout: Option<Duration>,
        f: F,
    ) -> Result<Response<R>, Status>
    where
        T: HasCaller + Clone,
        F: Fn(Channel, Request<T>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        let started = Instant::now();
        let mut last = None;
        for attempt in 0..self.attempts {
            if attempt > 0 && started.elapsed() > self.deadline {
                break;
            }
            let Some(route) = self.routes.resolve(&key) else {
                last = Some(to_status(
                    ErrorCode::RetryLater,
                    Reason::NoRoute,
                    format!("{key} has no placement yet"),
                    500,
                    None,
                ));
                crate::metrics::retried("no_route");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let mut m = message.clone();
            m.set_route_epoch(route.entry.epoch);
            let mut request = Request::new(m);
            self.secret.attach(&mut request);
            if let Some(t) = attempt_timeout {
                // A hung owner must not hold the request past a reroute.
                request.set_timeout(t);
            }
            // A tenant key stands for creating a conversation: while the
            // tenant moves, that happens on its target.
            let address = match key.scope {
                Scope::Tenant => self
                    .routes
                    .read(|t| t.creation_cell(key.tenant).map(|c| c.address.clone()))
                    .unwrap_or_else(|| route.cell_address.clone()),
                _ => route.cell_address.clone(),
            };
            let result = f(self.channel(&address)?, request).await;
            let status = match result {
                Ok(r) => return Ok(r),
                Err(status) => status,
            };
            let detail = error_detail(&status);
            match ErrorCode::try_from(detail.code) {
                Ok(ErrorCode::WrongCell) => {
                    crate::metrics::retried("wrong_cell");
                    let epoch = detail.route.as_ref().map_or(0, |r| r.epoch);
                    self.routes
                        .refresh(epoch.max(route.entry.epoch + 1))
                        .await
                        .ok();
                }
                Ok(ErrorCode::RetryLater)
                    if detail
                        .known_reason()
                        .is_some_and(|r| RETRIED_REASONS.contains(&r)) =>
                {
                    crate::metrics::retried(match detail.known_reason() {
                        Some(Reason::Frozen) => "frozen",
                        Some(Reason::RouteBehind) => "route_behind",
                        Some(Reason::OwnerLeaseExpired) => "owner_lease_expired",
                        Some(Reason::PreviousOwnerLease) => "previous_owner_lease",
                        _ => "no_route",
                    });
                    let wait = Duration::from_millis(detail.retry_after_ms)
                        .clamp(Duration::from_millis(10), Duration::from_millis(500));
                    tokio::time::sleep(wait).await;
                }
                _ if is_transport_failure(&status) => {
                    // The owner is unreachable; the route may be moving.
                    let status = owner_unreachable(&key, &route, &status);
                    crate::metrics::retried("owner_unreachable");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    self.routes.refresh(route.entry.epoch + 1).await.ok();
                    last = Some(status);
                    continue;
                }
                _ => return Err(status),
            }
            last = Some(status);
        }
        Err(last.unwrap_or_else(|| Status::unavailable("no attempt made")))
    }
}

/// A status the transport made, not the owner: no cellmesh detail, and a
/// code that says the call did not complete (a reset connection surfaces
/// as `UNKNOWN` "transport error", a connection torn down mid-call as
/// `INTERNAL` "h2 protocol error").
pub fn is_transport_failure(status: &Status) -> bool {
    error_detail(status).reason.starts_with("GRPC_")
        && matches!(
            status.code(),
            tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Cancelled
                | tonic::Code::Unknown
                | tonic::Code::Internal
        )
}

/// `RETRY_LATER` / `OWNER_UNREACHABLE` for `key`, with the route that names
/// the owner the edge could not reach.
pub fn owner_unreachable(key: &Key, route: &Resolved, cause: &Status) -> Status {
    to_status(
        ErrorCode::RetryLater,
        Reason::OwnerUnreachable,
        format!(
            "the owner of {key} ({}) could not be reached: {}",
            route.entry.cell,
            cause.message()
        ),
        200,
        Some(route_to_pb(route)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_the_transport_made_are_told_from_the_owners() {
        // A cell stopped mid-call: hyper's h2 error, no detail.
        assert!(is_transport_failure(&Status::internal(
            "h2 protocol error: http2 error"
        )));
        assert!(is_transport_failure(&Status::unknown("transport error")));
        assert!(is_transport_failure(&Status::unavailable(
            "connection refused"
        )));
        // The owner's own answers carry a reason and are passed on.
        let owners = to_status(
            ErrorCode::Internal,
            Reason::StorageFailed,
            "disk".into(),
            0,
            None,
        );
        assert!(!is_transport_failure(&owners));
        let refused = to_status(
            ErrorCode::PermissionDenied,
            Reason::NotAMember,
            "no".into(),
            0,
            None,
        );
        assert!(!is_transport_failure(&refused));
    }
}
