//! A user as this cell knows them: always within their tenant. User ids are
//! chosen by tenants and overlap between them, so everything a cell keeps or
//! serves per user — sync queues, conversation lists, mute flags, device
//! cursors, presence, live streams, forwards, moves — is keyed by
//! [`UserKey`], and no storage or hub method takes a bare user id.

use std::fmt;

use cellmesh_proto::ids::{TenantId, UserId};

/// A user of one tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UserKey {
    pub tenant: TenantId,
    pub user: UserId,
}

impl UserKey {
    pub const fn new(tenant: TenantId, user: UserId) -> Self {
        Self { tenant, user }
    }

    /// `"TENANT/USER"`, both ids non-zero (as `homes.remote` names users).
    pub fn parse(key: &str) -> Option<Self> {
        let (tenant, user) = key.split_once('/')?;
        let (tenant, user): (u64, u64) = (tenant.parse().ok()?, user.parse().ok()?);
        (tenant > 0 && user > 0).then_some(Self::new(TenantId(tenant), UserId(user)))
    }

    /// Another user of the same tenant.
    pub const fn peer(&self, user: UserId) -> Self {
        Self {
            tenant: self.tenant,
            user,
        }
    }
}

/// A user acting from one of their devices.
#[derive(Debug, Clone)]
pub struct Device {
    pub caller: UserKey,
    pub device: String,
}

impl fmt::Display for UserKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "user {} of tenant {}", self.user, self.tenant)
    }
}
