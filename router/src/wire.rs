//! Protobuf forms of openraft's types (`cellmesh.raft.v1`): the RaftPeer
//! messages replicas exchange and the records a replica keeps on disk (log
//! entries, vote, membership, snapshots). Decoding checks every required
//! field and answers [`Malformed`], never panics.

use std::collections::{BTreeMap, BTreeSet};

use cellmesh_proto::raft::v1 as pb;
use cellmesh_proto::raft::v1::{append_entries_response, entry, install_snapshot_response};
use cellmesh_proto::v1 as routing_pb;
use cellmesh_route_client::convert::{change_to_pb, command_from_pb, command_to_pb};
use openraft::error::{InstallSnapshotError, SnapshotMismatch};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{CommittedLeaderId, EntryPayload, Membership, SnapshotSegmentId, Vote};

use crate::table::{Change, Command};
use crate::types::{
    Commands, Entry, LogId, NodeId, RouterNode, SnapshotMeta, StoredMembership, TypeConfig,
};

/// A record or message that does not decode: which field, and why.
#[derive(Debug, thiserror::Error)]
#[error("malformed raft record: {0}")]
pub struct Malformed(pub String);

fn missing(field: &str) -> Malformed {
    Malformed(format!("{field} is missing"))
}

pub fn decode<M: prost::Message + Default>(bytes: &[u8]) -> Result<M, Malformed> {
    M::decode(bytes).map_err(|e| Malformed(e.to_string()))
}

pub fn log_id_to_pb(id: &LogId) -> pb::LogId {
    pb::LogId {
        term: id.leader_id.term,
        node_id: id.leader_id.node_id,
        index: id.index,
    }
}

pub fn log_id_from_pb(id: pb::LogId) -> LogId {
    LogId::new(CommittedLeaderId::new(id.term, id.node_id), id.index)
}

fn opt_log_id_to_pb(id: &Option<LogId>) -> Option<pb::LogId> {
    id.as_ref().map(log_id_to_pb)
}

fn opt_log_id_from_pb(id: Option<pb::LogId>) -> Option<LogId> {
    id.map(log_id_from_pb)
}

pub fn vote_to_pb(v: &Vote<NodeId>) -> pb::Vote {
    pb::Vote {
        term: v.leader_id.term,
        node_id: v.leader_id.node_id,
        committed: v.committed,
    }
}

pub fn vote_from_pb(v: Option<pb::Vote>) -> Result<Vote<NodeId>, Malformed> {
    let v = v.ok_or_else(|| missing("vote"))?;
    Ok(if v.committed {
        Vote::new_committed(v.term, v.node_id)
    } else {
        Vote::new(v.term, v.node_id)
    })
}

pub fn node_to_pb(id: NodeId, n: &RouterNode) -> routing_pb::RouterNode {
    routing_pb::RouterNode {
        node_id: id,
        region: n.region.clone(),
        raft_address: n.raft_addr.clone(),
        api_address: n.api_addr.clone(),
    }
}

fn membership_to_pb(m: &Membership<NodeId, RouterNode>) -> pb::Membership {
    pb::Membership {
        configs: m
            .get_joint_config()
            .iter()
            .map(|c| pb::NodeIdSet {
                ids: c.iter().copied().collect(),
            })
            .collect(),
        nodes: m.nodes().map(|(id, n)| (*id, node_to_pb(*id, n))).collect(),
    }
}

fn membership_from_pb(
    m: Option<pb::Membership>,
) -> Result<Membership<NodeId, RouterNode>, Malformed> {
    let m = m.ok_or_else(|| missing("membership"))?;
    let configs: Vec<BTreeSet<NodeId>> = m
        .configs
        .into_iter()
        .map(|c| c.ids.into_iter().collect())
        .collect();
    let nodes: BTreeMap<NodeId, RouterNode> = m
        .nodes
        .into_iter()
        .map(|(id, n)| {
            (
                id,
                RouterNode {
                    region: n.region,
                    raft_addr: n.raft_address,
                    api_addr: n.api_address,
                },
            )
        })
        .collect();
    Ok(Membership::new(configs, nodes))
}

pub fn stored_membership_to_pb(m: &StoredMembership) -> pb::StoredMembership {
    pb::StoredMembership {
        log_id: opt_log_id_to_pb(m.log_id()),
        membership: Some(membership_to_pb(m.membership())),
    }
}

pub fn stored_membership_from_pb(m: pb::StoredMembership) -> Result<StoredMembership, Malformed> {
    Ok(StoredMembership::new(
        opt_log_id_from_pb(m.log_id),
        membership_from_pb(m.membership)?,
    ))
}

pub fn entry_to_pb(e: &Entry) -> pb::Entry {
    pb::Entry {
        log_id: Some(log_id_to_pb(&e.log_id)),
        payload: Some(match &e.payload {
            EntryPayload::Blank => entry::Payload::Blank(pb::Blank {}),
            EntryPayload::Normal(Commands(c)) if c.len() == 1 => {
                entry::Payload::Command(command_to_pb(&c[0]))
            }
            EntryPayload::Normal(Commands(c)) => entry::Payload::Batch(pb::CommandBatch {
                commands: c.iter().map(command_to_pb).collect(),
            }),
            EntryPayload::Membership(m) => entry::Payload::Membership(membership_to_pb(m)),
        }),
    }
}

pub fn entry_from_pb(e: pb::Entry) -> Result<Entry, Malformed> {
    let log_id = log_id_from_pb(e.log_id.ok_or_else(|| missing("entry.log_id"))?);
    let payload = match e.payload.ok_or_else(|| missing("entry.payload"))? {
        entry::Payload::Blank(_) => EntryPayload::Blank,
        entry::Payload::Command(c) => {
            EntryPayload::Normal(Commands(vec![entry_command(&log_id, c)?]))
        }
        entry::Payload::Batch(b) if b.commands.is_empty() => {
            return Err(missing("entry.batch.commands"));
        }
        entry::Payload::Batch(b) => EntryPayload::Normal(Commands(
            (b.commands.into_iter())
                .map(|c| entry_command(&log_id, c))
                .collect::<Result<_, _>>()?,
        )),
        // A membership entry names at least one config (only a replica's
        // initial, stored membership is empty).
        entry::Payload::Membership(m) if m.configs.is_empty() => {
            return Err(missing("entry.membership.configs"));
        }
        entry::Payload::Membership(m) => EntryPayload::Membership(membership_from_pb(Some(m))?),
    };
    Ok(Entry { log_id, payload })
}

fn entry_command(log_id: &LogId, c: routing_pb::RouteCommand) -> Result<Command, Malformed> {
    command_from_pb(c).map_err(|s| Malformed(format!("entry {log_id}: {}", s.message())))
}

pub fn snapshot_meta_to_pb(m: &SnapshotMeta) -> pb::SnapshotMeta {
    pb::SnapshotMeta {
        last_log_id: opt_log_id_to_pb(&m.last_log_id),
        last_membership: Some(stored_membership_to_pb(&m.last_membership)),
        snapshot_id: m.snapshot_id.clone(),
    }
}

pub fn snapshot_meta_from_pb(m: Option<pb::SnapshotMeta>) -> Result<SnapshotMeta, Malformed> {
    let m = m.ok_or_else(|| missing("snapshot meta"))?;
    Ok(SnapshotMeta {
        last_log_id: opt_log_id_from_pb(m.last_log_id),
        last_membership: stored_membership_from_pb(
            m.last_membership
                .ok_or_else(|| missing("snapshot meta.last_membership"))?,
        )?,
        snapshot_id: m.snapshot_id,
    })
}

pub fn changes_to_pb(changes: &[Change]) -> Vec<routing_pb::RouteChange> {
    changes.iter().map(change_to_pb).collect()
}

pub fn change_from_pb(c: routing_pb::RouteChange) -> Result<Change, Malformed> {
    cellmesh_route_client::convert::change_from_pb(c).map_err(|s| Malformed(s.message().into()))
}

pub fn changes_from_pb(changes: Vec<routing_pb::RouteChange>) -> Result<Vec<Change>, Malformed> {
    changes.into_iter().map(change_from_pb).collect()
}

pub fn append_request_to_pb(r: &AppendEntriesRequest<TypeConfig>) -> pb::AppendEntriesRequest {
    pb::AppendEntriesRequest {
        vote: Some(vote_to_pb(&r.vote)),
        prev_log_id: opt_log_id_to_pb(&r.prev_log_id),
        entries: r.entries.iter().map(entry_to_pb).collect(),
        leader_commit: opt_log_id_to_pb(&r.leader_commit),
    }
}

pub fn append_request_from_pb(
    r: pb::AppendEntriesRequest,
) -> Result<AppendEntriesRequest<TypeConfig>, Malformed> {
    Ok(AppendEntriesRequest {
        vote: vote_from_pb(r.vote)?,
        prev_log_id: opt_log_id_from_pb(r.prev_log_id),
        entries: r
            .entries
            .into_iter()
            .map(entry_from_pb)
            .collect::<Result<_, _>>()?,
        leader_commit: opt_log_id_from_pb(r.leader_commit),
    })
}

pub fn append_response_to_pb(r: &AppendEntriesResponse<NodeId>) -> pb::AppendEntriesResponse {
    use append_entries_response::Result as R;
    pb::AppendEntriesResponse {
        result: Some(match r {
            AppendEntriesResponse::Success => R::Success(pb::Blank {}),
            AppendEntriesResponse::PartialSuccess(m) => R::PartialSuccess(pb::PartialSuccess {
                matched: opt_log_id_to_pb(m),
            }),
            AppendEntriesResponse::Conflict => R::Conflict(pb::Blank {}),
            AppendEntriesResponse::HigherVote(v) => R::HigherVote(vote_to_pb(v)),
        }),
    }
}

pub fn append_response_from_pb(
    r: pb::AppendEntriesResponse,
) -> Result<AppendEntriesResponse<NodeId>, Malformed> {
    use append_entries_response::Result as R;
    Ok(match r.result.ok_or_else(|| missing("result"))? {
        R::Success(_) => AppendEntriesResponse::Success,
        R::PartialSuccess(p) => {
            AppendEntriesResponse::PartialSuccess(opt_log_id_from_pb(p.matched))
        }
        R::Conflict(_) => AppendEntriesResponse::Conflict,
        R::HigherVote(v) => AppendEntriesResponse::HigherVote(vote_from_pb(Some(v))?),
    })
}

pub fn vote_request_to_pb(r: &VoteRequest<NodeId>) -> pb::VoteRequest {
    pb::VoteRequest {
        vote: Some(vote_to_pb(&r.vote)),
        last_log_id: opt_log_id_to_pb(&r.last_log_id),
    }
}

pub fn vote_request_from_pb(r: pb::VoteRequest) -> Result<VoteRequest<NodeId>, Malformed> {
    Ok(VoteRequest::new(
        vote_from_pb(r.vote)?,
        opt_log_id_from_pb(r.last_log_id),
    ))
}

pub fn vote_response_to_pb(r: &VoteResponse<NodeId>) -> pb::VoteResponse {
    pb::VoteResponse {
        vote: Some(vote_to_pb(&r.vote)),
        vote_granted: r.vote_granted,
        last_log_id: opt_log_id_to_pb(&r.last_log_id),
    }
}

pub fn vote_response_from_pb(r: pb::VoteResponse) -> Result<VoteResponse<NodeId>, Malformed> {
    Ok(VoteResponse {
        vote: vote_from_pb(r.vote)?,
        vote_granted: r.vote_granted,
        last_log_id: opt_log_id_from_pb(r.last_log_id),
    })
}

pub fn snapshot_request_to_pb(
    r: &InstallSnapshotRequest<TypeConfig>,
) -> pb::InstallSnapshotRequest {
    pb::InstallSnapshotRequest {
        vote: Some(vote_to_pb(&r.vote)),
        meta: Some(snapshot_meta_to_pb(&r.meta)),
        offset: r.offset,
        data: r.data.clone(),
        done: r.done,
    }
}

pub fn snapshot_request_from_pb(
    r: pb::InstallSnapshotRequest,
) -> Result<InstallSnapshotRequest<TypeConfig>, Malformed> {
    Ok(InstallSnapshotRequest {
        vote: vote_from_pb(r.vote)?,
        meta: snapshot_meta_from_pb(r.meta)?,
        offset: r.offset,
        data: r.data,
        done: r.done,
    })
}

fn segment_to_pb(s: &SnapshotSegmentId) -> pb::SnapshotSegment {
    pb::SnapshotSegment {
        snapshot_id: s.id.clone(),
        offset: s.offset,
    }
}

fn segment_from_pb(s: Option<pb::SnapshotSegment>) -> Result<SnapshotSegmentId, Malformed> {
    let s = s.ok_or_else(|| missing("snapshot segment"))?;
    Ok(SnapshotSegmentId {
        id: s.snapshot_id,
        offset: s.offset,
    })
}

/// The answer to a snapshot segment: the receiver's vote, or the mismatch
/// that makes the sender start over.
pub fn snapshot_response_to_pb(
    r: &Result<InstallSnapshotResponse<NodeId>, SnapshotMismatch>,
) -> pb::InstallSnapshotResponse {
    use install_snapshot_response::Result as R;
    pb::InstallSnapshotResponse {
        result: Some(match r {
            Ok(resp) => R::Vote(vote_to_pb(&resp.vote)),
            Err(m) => R::Mismatch(pb::SnapshotMismatch {
                expect: Some(segment_to_pb(&m.expect)),
                got: Some(segment_to_pb(&m.got)),
            }),
        }),
    }
}

pub fn snapshot_response_from_pb(
    r: pb::InstallSnapshotResponse,
) -> Result<Result<InstallSnapshotResponse<NodeId>, InstallSnapshotError>, Malformed> {
    use install_snapshot_response::Result as R;
    Ok(match r.result.ok_or_else(|| missing("result"))? {
        R::Vote(v) => Ok(InstallSnapshotResponse {
            vote: vote_from_pb(Some(v))?,
        }),
        R::Mismatch(m) => Err(InstallSnapshotError::SnapshotMismatch(SnapshotMismatch {
            expect: segment_from_pb(m.expect)?,
            got: segment_from_pb(m.got)?,
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{Command, Key, Transition};
    use cellmesh_proto::ids::{ConversationId, TenantId};

    fn log_id(term: u64, node: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, node), index)
    }

    fn node(region: &str, port: u16) -> RouterNode {
        RouterNode {
            region: region.into(),
            raft_addr: format!("http://127.0.0.1:{port}"),
            api_addr: format!("http://127.0.0.1:{}", port + 1),
        }
    }

    #[test]
    fn every_entry_kind_survives_the_round_trip() {
        let joint = Membership::new(
            vec![[1, 2, 3].into(), [2, 3, 4].into()],
            BTreeMap::from([
                (1, node("eu", 100)),
                (2, node("us", 200)),
                (3, node("ap", 300)),
                (4, node("eu", 400)),
                (5, node("us", 500)),
            ]),
        );
        let entries = [
            Entry {
                log_id: log_id(1, 1, 1),
                payload: EntryPayload::Blank,
            },
            Entry {
                log_id: log_id(2, 3, 9),
                payload: EntryPayload::Membership(joint),
            },
            Entry {
                log_id: log_id(2, 3, 10),
                payload: EntryPayload::Normal(Commands(vec![Command::UpdateRoute {
                    key: Key::conversation(TenantId(7), ConversationId(42)),
                    expect_epoch: 9,
                    transition: Transition::Failover {
                        to: "eu/c2".into(),
                        seq_floor: 100,
                        floor_margin: 1_000,
                    },
                }])),
            },
            Entry {
                log_id: log_id(2, 3, 11),
                payload: EntryPayload::Normal(Commands(vec![
                    Command::AssignTenant {
                        tenant: 5,
                        cell: "eu/c1".into(),
                        expect_epoch: 0,
                    },
                    Command::AssignTenant {
                        tenant: 6,
                        cell: "eu/c2".into(),
                        expect_epoch: 0,
                    },
                ])),
            },
        ];
        for e in entries {
            let bytes = prost::Message::encode_to_vec(&entry_to_pb(&e));
            let back = entry_from_pb(decode(&bytes).unwrap()).unwrap();
            assert_eq!(back, e);
        }
    }

    #[test]
    fn replication_messages_survive_the_round_trip() {
        let vote = Vote::new_committed(4, 2);
        let req = VoteRequest::new(Vote::new(5, 3), Some(log_id(4, 2, 17)));
        let back = vote_request_from_pb(vote_request_to_pb(&req)).unwrap();
        assert_eq!((back.vote, back.last_log_id), (req.vote, req.last_log_id));
        for resp in [
            AppendEntriesResponse::Success,
            AppendEntriesResponse::PartialSuccess(Some(log_id(4, 2, 3))),
            AppendEntriesResponse::PartialSuccess(None),
            AppendEntriesResponse::Conflict,
            AppendEntriesResponse::HigherVote(vote),
        ] {
            assert_eq!(
                append_response_from_pb(append_response_to_pb(&resp)).unwrap(),
                resp
            );
        }
        let mismatch = SnapshotMismatch {
            expect: SnapshotSegmentId {
                id: "9-1".into(),
                offset: 0,
            },
            got: SnapshotSegmentId {
                id: "9-1".into(),
                offset: 4096,
            },
        };
        let back = snapshot_response_from_pb(snapshot_response_to_pb(&Err(mismatch.clone())));
        assert!(matches!(
            back.unwrap(),
            Err(InstallSnapshotError::SnapshotMismatch(m)) if m == mismatch
        ));
    }

    #[test]
    fn a_message_without_its_required_fields_is_malformed_not_a_panic() {
        assert!(append_request_from_pb(pb::AppendEntriesRequest::default()).is_err());
        assert!(entry_from_pb(pb::Entry::default()).is_err());
        assert!(
            entry_from_pb(pb::Entry {
                log_id: Some(pb::LogId::default()),
                payload: Some(entry::Payload::Membership(pb::Membership::default())),
            })
            .is_err()
        );
        assert!(snapshot_request_from_pb(pb::InstallSnapshotRequest::default()).is_err());
        assert!(append_response_from_pb(pb::AppendEntriesResponse::default()).is_err());
        assert!(decode::<pb::Entry>(&[0xff, 0xff, 0xff]).is_err());
    }
}
