//! A backup's manifest: what it holds (each file with its object key, size
//! and SHA-256) and where the cell stood when it was taken (the route
//! table's index, each conversation's latest seq, each user's latest pts
//! and sync queue). Written last: a backup without its manifest does not
//! exist, and its objects are swept as orphans.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// The file's name in the database directory.
    pub name: String,
    /// Its object key, under the cell's prefix.
    pub key: String,
    pub size: u64,
    /// Lowercase hex.
    pub sha256: String,
}

/// A conversation at the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConversationMark {
    pub tenant: TenantId,
    pub conversation: ConversationId,
    /// Its latest seq (or floor, if higher).
    pub seq: u64,
}

/// A user's sync queue at the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserMark {
    pub tenant: TenantId,
    pub user: UserId,
    pub pts: u64,
    pub queue_id: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Sorts by time: `<created_ms, 13 digits>-<random hex>`.
    pub id: String,
    pub cell: String,
    pub created_ms: u64,
    /// The release that wrote it.
    pub release: String,
    /// The route table index this cell had applied (0: standalone).
    pub route_index: u64,
    pub files: Vec<FileEntry>,
    /// Files and bytes this backup uploaded (the rest it shares with an
    /// earlier one).
    pub uploaded_files: u64,
    pub uploaded_bytes: u64,
    pub conversations: Vec<ConversationMark>,
    pub users: Vec<UserMark>,
}

impl Manifest {
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    pub fn info(&self) -> cellmesh_proto::v1::BackupInfo {
        cellmesh_proto::v1::BackupInfo {
            id: self.id.clone(),
            cell_id: self.cell.clone(),
            created_ms: self.created_ms,
            release: self.release.clone(),
            route_index: self.route_index,
            files: self.files.len() as u64,
            bytes: self.bytes(),
            uploaded_files: self.uploaded_files,
            uploaded_bytes: self.uploaded_bytes,
            conversations: self.conversations.len() as u64,
            users: self.users.len() as u64,
        }
    }
}

/// A new backup id at `now_ms`.
pub fn new_id(now_ms: u64) -> String {
    format!("{now_ms:013}-{:08x}", rand::random::<u32>())
}
