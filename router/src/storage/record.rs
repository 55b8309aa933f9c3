//! How each kind of value is written in the replica's database: its
//! protobuf form from `cellmesh.raft.v1` (see [`crate::wire`]), so a log
//! entry on disk is byte for byte the entry replication sends.

use cellmesh_proto::raft::v1 as pb;
use openraft::Vote;
use prost::Message;

use crate::table::Change;
use crate::types::{Entry, LogId, NodeId, SnapshotMeta, StoredMembership};
use crate::wire::{self, Malformed};

/// A value stored in the database.
pub(super) trait Record: Sized {
    fn to_bytes(&self) -> Vec<u8>;
    fn from_bytes(bytes: &[u8]) -> Result<Self, Malformed>;
}

impl Record for Entry {
    fn to_bytes(&self) -> Vec<u8> {
        wire::entry_to_pb(self).encode_to_vec()
    }
    fn from_bytes(bytes: &[u8]) -> Result<Self, Malformed> {
        wire::entry_from_pb(wire::decode(bytes)?)
    }
}

impl Record for Vote<NodeId> {
    fn to_bytes(&self) -> Vec<u8> {
        wire::vote_to_pb(self).encode_to_vec()
    }
    fn from_bytes(bytes: &[u8]) -> Result<Self, Malformed> {
        wire::vote_from_pb(Some(wire::decode(bytes)?))
    }
}

impl Record for LogId {
    fn to_bytes(&self) -> Vec<u8> {
        wire::log_id_to_pb(self).encode_to_vec()
    }
    fn from_bytes(bytes: &[u8]) -> Result<Self, Malformed> {
        Ok(wire::log_id_from_pb(wire::decode(bytes)?))
    }
}

impl Record for Option<LogId> {
    fn to_bytes(&self) -> Vec<u8> {
        pb::LogPosition {
            log_id: self.as_ref().map(wire::log_id_to_pb),
        }
        .encode_to_vec()
    }
    fn from_bytes(bytes: &[u8]) -> Result<Self, Malformed> {
        let p: pb::LogPosition = wire::decode(bytes)?;
        Ok(p.log_id.map(wire::log_id_from_pb))
    }
}

impl Record for u64 {
    fn to_bytes(&self) -> Vec<u8> {
        self.to_be_bytes().to_vec()
    }
    fn from_bytes(bytes: &[u8]) -> Result<Self, Malformed> {
        let b: [u8; 8] = bytes
            .try_into()
            .map_err(|_| Malformed(format!("a u64 record of {} bytes", bytes.len())))?;
        Ok(u64::from_be_bytes(b))
    }
}

impl Record for StoredMembership {
    fn to_bytes(&self) -> Vec<u8> {
        wire::stored_membership_to_pb(self).encode_to_vec()
    }
    fn from_bytes(bytes: &[u8]) -> Result<Self, Malformed> {
        wire::stored_membership_from_pb(wire::decode(bytes)?)
    }
}

impl Record for Change {
    fn to_bytes(&self) -> Vec<u8> {
        cellmesh_route_client::convert::change_to_pb(self).encode_to_vec()
    }
    fn from_bytes(bytes: &[u8]) -> Result<Self, Malformed> {
        wire::change_from_pb(wire::decode(bytes)?)
    }
}

/// The changes one log index made (the watch history).
impl Record for Vec<Change> {
    fn to_bytes(&self) -> Vec<u8> {
        pb::ChangeBatch {
            index: 0,
            changes: wire::changes_to_pb(self),
        }
        .encode_to_vec()
    }
    fn from_bytes(bytes: &[u8]) -> Result<Self, Malformed> {
        let b: pb::ChangeBatch = wire::decode(bytes)?;
        wire::changes_from_pb(b.changes)
    }
}

/// The current snapshot: its meta and its (already encoded) data.
pub(super) struct StoredSnapshot {
    pub meta: SnapshotMeta,
    pub data: Vec<u8>,
}

impl Record for StoredSnapshot {
    fn to_bytes(&self) -> Vec<u8> {
        pb::StoredSnapshot {
            meta: Some(wire::snapshot_meta_to_pb(&self.meta)),
            data: self.data.clone(),
        }
        .encode_to_vec()
    }
    fn from_bytes(bytes: &[u8]) -> Result<Self, Malformed> {
        let s: pb::StoredSnapshot = wire::decode(bytes)?;
        Ok(Self {
            meta: wire::snapshot_meta_from_pb(s.meta)?,
            data: s.data,
        })
    }
}

/// A snapshot's data: the table as changes and the retained history.
pub(super) struct SnapshotData {
    pub applied: u64,
    pub table: Vec<Change>,
    pub history: Vec<super::WatchBatch>,
    pub compacted_through: u64,
}

impl Record for SnapshotData {
    fn to_bytes(&self) -> Vec<u8> {
        pb::RouteSnapshot {
            applied: self.applied,
            table: wire::changes_to_pb(&self.table),
            history: self
                .history
                .iter()
                .map(|(index, changes)| pb::ChangeBatch {
                    index: *index,
                    changes: wire::changes_to_pb(changes),
                })
                .collect(),
            compacted_through: self.compacted_through,
        }
        .encode_to_vec()
    }
    fn from_bytes(bytes: &[u8]) -> Result<Self, Malformed> {
        let s: pb::RouteSnapshot = wire::decode(bytes)?;
        Ok(Self {
            applied: s.applied,
            table: wire::changes_from_pb(s.table)?,
            history: s
                .history
                .into_iter()
                .map(|b| Ok((b.index, wire::changes_from_pb(b.changes)?)))
                .collect::<Result<_, Malformed>>()?,
            compacted_through: s.compacted_through,
        })
    }
}
