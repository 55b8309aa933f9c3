//! Where users live: this cell, another cell whose endpoint the fan-out
//! forwards their events to, or a home frozen for a move (events wait). A
//! static map from config serves until the route table answers user-home
//! lookups.

use std::collections::HashMap;

use crate::config::HomesConfig;
use crate::error::CellError;

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

pub trait Homes: Send + Sync + 'static {
    /// The home of `user`.
    fn home(&self, tenant: u64, user: u64) -> Home;

    /// Checks that this cell serves `user`'s sync state: reads, or with
    /// `write` acks and settings (refused while the home is frozen). A
    /// static map serves every user who asks.
    fn check_home(&self, _tenant: u64, _user: u64, _write: bool) -> Result<(), CellError> {
        Ok(())
    }

    /// The endpoints of this cell's standbys (its failover targets), which
    /// receive a copy of every conversation's meta and members.
    fn standbys(&self) -> Vec<String> {
        Vec::new()
    }
}

pub struct StaticHomes(HashMap<u64, String>);

impl StaticHomes {
    /// From a validated config (entries that do not parse are skipped).
    pub fn from_config(config: &HomesConfig) -> Self {
        Self(
            config
                .remote
                .iter()
                .filter_map(|(user, endpoint)| Some((user.parse().ok()?, endpoint.clone())))
                .collect(),
        )
    }
}

impl Homes for StaticHomes {
    fn home(&self, _tenant: u64, user: u64) -> Home {
        match self.0.get(&user) {
            Some(endpoint) => Home::Remote(endpoint.clone()),
            None => Home::Here,
        }
    }
}
