//! Where users live: this cell, another cell whose endpoint the fan-out
//! forwards their events to, or a home frozen for a move (events wait). A
//! static map from config serves until the route table answers user-home
//! lookups.

use std::collections::HashMap;

use cellmesh_proto::ids::{ConversationId, TenantId};

use crate::config::HomesConfig;
use crate::error::CellError;
use crate::user::UserKey;

/// A user's home as this cell sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Home {
    Here,
    /// Another cell, at this endpoint.
    Remote(String),
    /// Frozen for a move of the user's home: events for the user wait until
    /// the route switches.
    Moving,
}

/// The cells the route table gives a conversation: its owner, and the
/// target of a move under way (which holds a copy and replicates its meta
/// to its own standbys ahead of the switch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub cell: String,
    pub incoming: Option<String>,
}

impl Owner {
    /// Whether `cell` holds the conversation now: its owner, or the target
    /// copying it.
    pub fn holds(&self, cell: &str) -> bool {
        self.cell == cell || self.incoming.as_deref() == Some(cell)
    }
}

pub trait Homes: Send + Sync + 'static {
    /// The home of `user`.
    fn home(&self, user: UserKey) -> Home;

    /// Checks that this cell serves `user`'s sync state: reads, or with
    /// `write` acks and settings (refused while the home is frozen). A
    /// static map serves every user who asks.
    fn check_home(&self, _user: UserKey, _write: bool) -> Result<(), CellError> {
        Ok(())
    }

    /// The endpoints of this cell's standbys (its failover targets), which
    /// receive a copy of every conversation's meta and members.
    fn standbys(&self) -> Vec<String> {
        Vec::new()
    }

    /// Whether the standby at `endpoint` may hold `tenant`'s data: a
    /// tenant bound to regions gets no copy on a standby outside them.
    fn may_hold(&self, _tenant: TenantId, _endpoint: &str) -> bool {
        true
    }

    /// Who holds `conversation` in the route table (`None`: no table, or no
    /// route yet).
    fn conversation_owner(
        &self,
        _tenant: TenantId,
        _conversation: ConversationId,
    ) -> Option<Owner> {
        None
    }

    /// The route table index this cell has applied (0: no table).
    fn route_index(&self) -> u64 {
        0
    }
}

pub struct StaticHomes(HashMap<UserKey, String>);

impl StaticHomes {
    /// From a validated config (entries that do not parse are skipped).
    pub fn from_config(config: &HomesConfig) -> Self {
        Self(
            config
                .remote
                .iter()
                .filter_map(|(user, endpoint)| Some((UserKey::parse(user)?, endpoint.clone())))
                .collect(),
        )
    }
}

impl Homes for StaticHomes {
    fn home(&self, user: UserKey) -> Home {
        match self.0.get(&user) {
            Some(endpoint) => Home::Remote(endpoint.clone()),
            None => Home::Here,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellmesh_proto::ids::UserId;

    #[test]
    fn static_homes_are_per_tenant() {
        let mut config = HomesConfig::default();
        config.remote.insert("1/3".into(), "http://a".into());
        let homes = StaticHomes::from_config(&config);
        assert_eq!(
            homes.home(UserKey::new(TenantId(1), UserId(3))),
            Home::Remote("http://a".into())
        );
        assert_eq!(homes.home(UserKey::new(TenantId(2), UserId(3))), Home::Here);
        assert_eq!(UserKey::parse("3"), None);
        assert_eq!(UserKey::parse("0/3"), None);
        assert_eq!(UserKey::parse("1/x"), None);
    }
}
