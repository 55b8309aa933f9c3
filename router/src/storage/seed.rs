//! A new replica seeded from a route-table backup (the data of a Raft
//! snapshot, see `Routing.Snapshot`): its state machine installs the
//! snapshot at the backup's applied index with a membership of this
//! replica alone, and its log starts purged up to that index. Started, it
//! elects itself (the only voter) and goes on from the next index, so the
//! route table's indices and epochs keep rising; the other replicas join
//! as learners and voters the usual way. Only an empty database is seeded.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Cursor;

use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{CommittedLeaderId, Membership, StorageIOError};

use super::record::SnapshotData;
use super::{LogStore, StateMachine, decode};
use crate::types::{LogId, NodeId, RouterNode, SnapshotMeta, StorageError, StoredMembership};

/// Seeds `log` and `state` (an empty database) from `data`; the applied
/// index it starts from.
pub async fn seed(
    log: &mut LogStore,
    state: &mut StateMachine,
    data: Vec<u8>,
    node_id: NodeId,
    node: RouterNode,
) -> Result<u64, StorageError> {
    let refused = |why: &str| StorageError::IO {
        source: StorageIOError::read(openraft::AnyError::error(why)),
    };
    let (applied, _) = state.applied_state().await?;
    let logs = log.get_log_state().await?;
    if applied.is_some() || logs.last_log_id.is_some() || log.read_vote().await?.is_some() {
        return Err(refused(
            "the data dir already holds a replica: a route-table restore seeds only an empty one",
        ));
    }
    let snapshot: SnapshotData = decode(&data)?;
    if snapshot.applied == 0 {
        return Err(refused("the route-table backup is empty"));
    }
    let last = LogId::new(CommittedLeaderId::new(0, node_id), snapshot.applied);
    let membership = Membership::new(
        vec![BTreeSet::from([node_id])],
        BTreeMap::from([(node_id, node)]),
    );
    let meta = SnapshotMeta {
        last_log_id: Some(last),
        last_membership: StoredMembership::new(Some(last), membership),
        snapshot_id: format!("restored-{}", snapshot.applied),
    };
    state
        .install_snapshot(&meta, Box::new(Cursor::new(data)))
        .await?;
    log.purge(last).await?;
    Ok(snapshot.applied)
}
