//! Rate limits (GCRA token buckets from `governor`, one per key): sends per
//! user and per conversation, and every other call that changes something
//! (create, members, edit, recall, delete, read marks, mute, typing,
//! heartbeat) per user. Idle keys are forgotten by [`SendLimits::prune`],
//! which the service calls periodically.

use std::num::NonZeroU32;
use std::time::Duration;

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

use crate::config::RateLimitConfig;
use crate::error::CellError;

pub struct SendLimits {
    users: DefaultKeyedRateLimiter<(TenantId, UserId)>,
    conversations: DefaultKeyedRateLimiter<ConversationId>,
    calls: DefaultKeyedRateLimiter<(TenantId, UserId)>,
    uploads: DefaultKeyedRateLimiter<(TenantId, UserId)>,
    clock: DefaultClock,
}

fn quota(per_sec: u32, burst: u32) -> Quota {
    let nz = |v: u32| NonZeroU32::new(v.max(1)).expect("at least 1");
    Quota::per_second(nz(per_sec)).allow_burst(nz(burst.max(per_sec)))
}

impl SendLimits {
    pub fn new(config: &RateLimitConfig) -> Self {
        Self {
            users: DefaultKeyedRateLimiter::keyed(quota(config.user_per_sec, config.user_burst)),
            conversations: DefaultKeyedRateLimiter::keyed(quota(
                config.conversation_per_sec,
                config.conversation_burst,
            )),
            calls: DefaultKeyedRateLimiter::keyed(quota(
                config.user_calls_per_sec,
                config.user_calls_burst,
            )),
            uploads: DefaultKeyedRateLimiter::keyed({
                let n = NonZeroU32::new(config.user_uploads_per_minute.max(1)).expect("at least 1");
                Quota::per_minute(n).allow_burst(n)
            }),
            clock: DefaultClock::default(),
        }
    }

    /// Takes one send from the sender's and the conversation's budgets.
    pub fn check(
        &self,
        tenant: TenantId,
        user: UserId,
        conversation: ConversationId,
    ) -> Result<(), CellError> {
        if let Err(not_until) = self.users.check_key(&(tenant, user)) {
            return Err(self.limited("user", not_until.wait_time_from(self.clock.now())));
        }
        if let Err(not_until) = self.conversations.check_key(&conversation) {
            return Err(self.limited("conversation", not_until.wait_time_from(self.clock.now())));
        }
        Ok(())
    }

    /// Takes one call that changes something other than a send from the
    /// user's budget (`USER_RATE_LIMITED`, scope `user_calls`).
    pub fn check_call(&self, tenant: TenantId, user: UserId) -> Result<(), CellError> {
        self.calls.check_key(&(tenant, user)).map_err(|not_until| {
            self.limited("user_calls", not_until.wait_time_from(self.clock.now()))
        })
    }

    /// Takes one upload reservation from the user's budget
    /// (`UPLOAD_RATE_LIMITED`).
    pub fn check_upload(&self, tenant: TenantId, user: UserId) -> Result<(), CellError> {
        self.uploads
            .check_key(&(tenant, user))
            .map_err(|not_until| {
                self.limited("uploads", not_until.wait_time_from(self.clock.now()))
            })
    }

    fn limited(&self, scope: &'static str, retry_after: Duration) -> CellError {
        crate::metrics::metrics()
            .rate_limited
            .get_or_create(&crate::metrics::ScopeLabel { scope })
            .inc();
        CellError::RateLimited {
            scope,
            retry_after: retry_after.max(Duration::from_millis(1)),
        }
    }

    /// Drops the state of keys whose buckets are full again.
    pub fn prune(&self) {
        self.users.retain_recent();
        self.users.shrink_to_fit();
        self.conversations.retain_recent();
        self.conversations.shrink_to_fit();
        self.calls.retain_recent();
        self.calls.shrink_to_fit();
        self.uploads.retain_recent();
        self.uploads.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellmesh_proto::reason::Reason;
    use cellmesh_proto::v1::ErrorCode;

    fn limits(user: u32, conv: u32) -> SendLimits {
        SendLimits::new(&RateLimitConfig {
            user_per_sec: user,
            user_burst: user,
            conversation_per_sec: conv,
            conversation_burst: conv,
            user_calls_per_sec: 2,
            user_calls_burst: 2,
            user_uploads_per_minute: 2,
        })
    }

    #[test]
    fn a_user_over_budget_is_limited_with_a_retry_hint() {
        let l = limits(5, 1000);
        for _ in 0..5 {
            l.check(TenantId(1), UserId(1), ConversationId(10)).unwrap();
        }
        let err = l
            .check(TenantId(1), UserId(1), ConversationId(10))
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::RateLimited);
        assert_eq!(err.reason(), Reason::UserRateLimited);
        match err {
            CellError::RateLimited { retry_after, .. } => {
                assert!(retry_after > Duration::ZERO && retry_after <= Duration::from_millis(200))
            }
            other => panic!("{other:?}"),
        }
        // Another user of the same tenant is unaffected.
        l.check(TenantId(1), UserId(2), ConversationId(10)).unwrap();
    }

    #[test]
    fn a_busy_conversation_is_limited_across_senders() {
        let l = limits(1000, 3);
        for user in 0..3 {
            l.check(TenantId(1), UserId(user), ConversationId(77))
                .unwrap();
        }
        let err = l
            .check(TenantId(1), UserId(99), ConversationId(77))
            .unwrap_err();
        assert_eq!(err.reason(), Reason::ConversationRateLimited);
        l.check(TenantId(1), UserId(99), ConversationId(78))
            .unwrap();
    }

    #[test]
    fn other_calls_have_their_own_budget_per_user() {
        let l = limits(1000, 1000);
        l.check_call(TenantId(1), UserId(1)).unwrap();
        l.check_call(TenantId(1), UserId(1)).unwrap();
        let err = l.check_call(TenantId(1), UserId(1)).unwrap_err();
        assert_eq!(err.reason(), Reason::UserRateLimited);
        assert!(err.to_string().contains("user_calls"), "{err}");
        l.check_call(TenantId(1), UserId(2)).unwrap();
        l.check_call(TenantId(2), UserId(1)).unwrap();
        l.check(TenantId(1), UserId(1), ConversationId(10)).unwrap();
    }

    #[test]
    fn uploads_have_their_own_budget_per_user() {
        let l = limits(1000, 1000);
        l.check_upload(TenantId(1), UserId(1)).unwrap();
        l.check_upload(TenantId(1), UserId(1)).unwrap();
        assert_eq!(
            l.check_upload(TenantId(1), UserId(1)).unwrap_err().reason(),
            "UPLOAD_RATE_LIMITED"
        );
        l.check_upload(TenantId(1), UserId(2)).unwrap();
        l.check_call(TenantId(1), UserId(1)).unwrap();
    }
}
