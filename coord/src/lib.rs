//! Coordination between the deployment's processes (DESIGN.md §6): members
//! registered under a lease that they keep alive (cells), and leader
//! election (the active control-plane replica). Three backends: etcd for
//! production, lock files for the processes of one host (`cellmesh dev`),
//! and an embedded in-process one for single-process use and unit tests.

pub mod embedded;
pub mod etcd;
pub mod local;

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    #[error("coordination store: {0}")]
    Store(String),
}

/// Held while a registration or leadership lasts; dropping it gives it up.
/// `lost` turns true if the lease expired underneath (keep-alive failed).
pub struct Lease {
    pub lost: watch::Receiver<bool>,
    pub(crate) _guard: tokio::sync::oneshot::Sender<()>,
}

impl Lease {
    pub fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }
}

#[tonic::async_trait]
pub trait Coordination: Send + Sync {
    /// Puts `key = value` for as long as the returned lease is held and kept
    /// alive (expires `ttl` after the holder dies).
    async fn register(&self, key: &str, value: &str, ttl: Duration) -> Result<Lease, CoordError>;

    /// Live registrations under `prefix`.
    async fn list(&self, prefix: &str) -> Result<BTreeMap<String, String>, CoordError>;

    /// Waits until `candidate` leads `election`; leadership lasts as long as
    /// the returned lease.
    async fn campaign(
        &self,
        election: &str,
        candidate: &str,
        ttl: Duration,
    ) -> Result<Lease, CoordError>;

    /// The current leader of `election`, if any.
    async fn leader(&self, election: &str) -> Result<Option<String>, CoordError>;

    /// Stores `key = value` durably (no lease): records such as the
    /// control plane's operations, which outlive the replica that wrote them.
    async fn put(&self, key: &str, value: &str) -> Result<(), CoordError>;

    /// Stores `key = value` durably only if the key's value is still
    /// `expected` (`None`: the key does not exist); whether it did. Two
    /// writers of one record (an operator's request and the runner's
    /// progress) never undo each other's change.
    async fn compare_and_put(
        &self,
        key: &str,
        expected: Option<&str>,
        value: &str,
    ) -> Result<bool, CoordError>;

    /// Deletes the record `key` only if its value is still `expected`;
    /// whether it did (a record another writer changed meanwhile stays).
    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool, CoordError>;

    /// Durable records (see [`Coordination::put`]) under `prefix`.
    async fn records(&self, prefix: &str) -> Result<BTreeMap<String, String>, CoordError>;
}

/// Where the control plane records operations: `cellmesh/operations/<id>`.
pub const OPERATIONS_PREFIX: &str = "cellmesh/operations/";

/// Where cells register: `cellmesh/cells/<cell id>` = address.
pub const CELLS_PREFIX: &str = "cellmesh/cells/";
/// Where the control plane records failover holds (planned restarts):
/// `cellmesh/holds/<cell id>`.
pub const HOLDS_PREFIX: &str = "cellmesh/holds/";
/// The control plane's election.
pub const CONTROL_PLANE_ELECTION: &str = "cellmesh/control-plane";
