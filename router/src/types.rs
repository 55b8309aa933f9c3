//! The openraft type configuration of the RoutingService: log entries carry
//! route [`Command`]s, the state machine answers with [`Applied`], and each
//! replica is a [`RouterNode`] with separate Raft and API addresses.

use std::fmt;
use std::io::Cursor;

use serde::{Deserialize, Serialize};

use crate::table::{Change, Command, RouteError};

/// A replica as the Raft membership records it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterNode {
    pub region: String,
    /// Where its RaftPeer service listens.
    pub raft_addr: String,
    /// Where its Routing API listens.
    pub api_addr: String,
}

impl fmt::Display for RouterNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (raft {}, api {})",
            self.region, self.raft_addr, self.api_addr
        )
    }
}

/// One log entry's commands: concurrent writes proposed together (see
/// `grpc::propose`), applied in order at the entry's index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Commands(pub Vec<Command>);

/// The state machine's answer to an entry: for each of its commands, the
/// changes, or why it was refused. A refusal is a result, not a failure
/// of the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub index: u64,
    pub results: Vec<Result<Vec<Change>, RouteError>>,
}

openraft::declare_raft_types!(
    pub TypeConfig:
        D = Commands,
        R = Applied,
        NodeId = u64,
        Node = RouterNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type NodeId = u64;
pub type StorageError = openraft::StorageError<NodeId>;
pub type LogId = openraft::LogId<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, RouterNode>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, RouterNode>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
