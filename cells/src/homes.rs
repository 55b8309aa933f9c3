//! Where users live: this cell, or another cell whose endpoint the fan-out
//! forwards their events to. A static map from config serves until the
//! route table answers user-home lookups.

use std::collections::HashMap;

use crate::config::HomesConfig;

pub trait Homes: Send + Sync + 'static {
    /// The endpoint of `user`'s home cell, or None when it is this cell.
    fn remote_home(&self, tenant: u64, user: u64) -> Option<String>;

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
    fn remote_home(&self, _tenant: u64, user: u64) -> Option<String> {
        self.0.get(&user).cloned()
    }
}
