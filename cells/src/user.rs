//! A user as this cell knows them: always within their tenant. User ids are
//! chosen by tenants and overlap between them, so everything a cell keeps or
//! serves per user — sync queues, conversation lists, mute flags, device
//! cursors, presence, live streams, forwards, moves — is keyed by
//! [`UserKey`], and no storage or hub method takes a bare user id.

use std::fmt;

/// A user of one tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UserKey {
    pub tenant: u64,
    pub user: u64,
}

impl UserKey {
    pub const fn new(tenant: u64, user: u64) -> Self {
        Self { tenant, user }
    }

    /// Another user of the same tenant.
    pub const fn peer(&self, user: u64) -> Self {
        Self {
            tenant: self.tenant,
            user,
        }
    }
}

impl fmt::Display for UserKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "user {} of tenant {}", self.user, self.tenant)
    }
}
