//! What one outbox event fans out to, decided without IO: which users get
//! which sync record (write diffusion), or which members get a transient
//! hint instead (read diffusion above the large-group threshold), and
//! whether the event's answer and the conversation's meta go to the
//! standbys. The processor reads membership through a [`Members`] view,
//! executes the plan (appends, forwards, pushes) and commits it.

use cellmesh_proto::ids::UserId;
use cellmesh_proto::storage::v1::{OutboxEvent, OutboxKind, SyncRecord};
use cellmesh_proto::v1::{ConversationHint, SyncEventKind};

/// Membership of the event's conversation, as the plan needs it.
pub trait Members {
    type Error;
    /// Every member (ids ascending).
    fn all(&self) -> Result<Vec<u64>, Self::Error>;
    /// How many members there are (without reading them).
    fn count(&self) -> Result<usize, Self::Error>;
    fn contains(&self, user: UserId) -> Result<bool, Self::Error>;
}

/// Where the event's effects go.
#[derive(Debug, Clone, PartialEq)]
pub enum Fanout {
    /// Nothing per user.
    None,
    /// One sync record per user (user ids of the event's tenant).
    Records(Vec<(u64, SyncRecord)>),
    /// Read diffusion: a hint to whichever members are online (found from
    /// who is online, not by reading every member).
    Hint { hint: ConversationHint },
}

/// The effects of one event.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub fanout: Fanout,
    /// The send's answer goes to the standbys (a new message).
    pub replicate_answer: bool,
    /// The conversation's meta and members go to the standbys.
    pub replicate_meta: bool,
    /// The answers a move copied here with the messages at the event's
    /// `items` go to the standbys.
    pub replicate_copied_answers: bool,
}

/// The plan for `event`, with conversations above `large_group_threshold`
/// members fanned out by hints.
pub fn plan<M: Members>(
    event: &OutboxEvent,
    members: &M,
    large_group_threshold: usize,
) -> Result<Plan, M::Error> {
    let kind = OutboxKind::try_from(event.kind).unwrap_or(OutboxKind::Unspecified);
    let mut plan = Plan {
        fanout: Fanout::None,
        replicate_answer: kind == OutboxKind::Message,
        replicate_copied_answers: kind == OutboxKind::AnswerSync,
        replicate_meta: matches!(
            kind,
            OutboxKind::MetaSync | OutboxKind::ConversationCreated | OutboxKind::MembersChanged
        ),
    };
    let sync_kind = match kind {
        OutboxKind::Message => SyncEventKind::Message,
        OutboxKind::Recall => SyncEventKind::Recall,
        OutboxKind::Edit => SyncEventKind::Edit,
        OutboxKind::DeleteForMe => SyncEventKind::DeleteForMe,
        OutboxKind::Read => SyncEventKind::Read,
        OutboxKind::ConversationCreated | OutboxKind::MembersChanged => SyncEventKind::Joined,
        OutboxKind::Unspecified
        | OutboxKind::MetaSync
        | OutboxKind::AnswerSync
        | OutboxKind::HistoryImported
        | OutboxKind::HistoryDropped => {
            return Ok(plan);
        }
    };
    let record = SyncRecord {
        kind: sync_kind as i32,
        conversation_id: event.conversation_id,
        seq: event.seq,
        msg_id: event.msg_id,
        items: match kind {
            OutboxKind::DeleteForMe => event.items.clone(),
            _ => Vec::new(),
        },
        server_ts_ms: event.server_ts_ms,
        remote_message: Vec::new(),
    };
    let to = |users: Vec<u64>| users.into_iter().map(|u| (u, record.clone())).collect();
    plan.fanout = match kind {
        OutboxKind::Message | OutboxKind::Recall | OutboxKind::Edit if !event.items.is_empty() => {
            // Directed: the recipients and the sender, if still members.
            let mut targets = event.items.clone();
            targets.push(event.user_id);
            targets.sort_unstable();
            targets.dedup();
            let mut users = Vec::with_capacity(targets.len());
            for user in targets {
                if members.contains(UserId(user))? {
                    users.push(user);
                }
            }
            Fanout::Records(to(users))
        }
        OutboxKind::Message | OutboxKind::Recall | OutboxKind::Edit => {
            if members.count()? > large_group_threshold {
                Fanout::Hint {
                    hint: ConversationHint {
                        conversation_id: event.conversation_id,
                        latest_seq: event.seq,
                        msg_id: event.msg_id,
                    },
                }
            } else {
                Fanout::Records(to(members.all()?))
            }
        }
        OutboxKind::DeleteForMe | OutboxKind::Read => Fanout::Records(to(vec![event.user_id])),
        OutboxKind::ConversationCreated => Fanout::Records(to(event.items.clone())),
        OutboxKind::MembersChanged => {
            let mut records = Vec::with_capacity(event.items.len());
            for user in &event.items {
                let mut record = record.clone();
                if !members.contains(UserId(*user))? {
                    record.kind = SyncEventKind::Left as i32;
                }
                records.push((*user, record));
            }
            Fanout::Records(records)
        }
        OutboxKind::Unspecified
        | OutboxKind::MetaSync
        | OutboxKind::AnswerSync
        | OutboxKind::HistoryImported
        | OutboxKind::HistoryDropped => Fanout::None,
    };
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    struct Set(Vec<u64>);

    impl Members for Set {
        type Error = Infallible;
        fn all(&self) -> Result<Vec<u64>, Infallible> {
            Ok(self.0.clone())
        }
        fn count(&self) -> Result<usize, Infallible> {
            Ok(self.0.len())
        }
        fn contains(&self, user: UserId) -> Result<bool, Infallible> {
            Ok(self.0.contains(&user.get()))
        }
    }

    fn event(kind: OutboxKind, user: u64, items: Vec<u64>) -> OutboxEvent {
        OutboxEvent {
            kind: kind as i32,
            tenant_id: 1,
            conversation_id: 9,
            seq: 5,
            msg_id: 77,
            user_id: user,
            items,
            ..Default::default()
        }
    }

    fn users(plan: &Plan) -> Vec<(u64, i32)> {
        match &plan.fanout {
            Fanout::Records(records) => records.iter().map(|(u, r)| (*u, r.kind)).collect(),
            other => panic!("records expected: {other:?}"),
        }
    }

    const MESSAGE: i32 = SyncEventKind::Message as i32;

    #[test]
    fn a_message_reaches_every_member_and_its_answer_the_standbys() {
        let p = plan(
            &event(OutboxKind::Message, 1, vec![]),
            &Set(vec![1, 2, 3]),
            10,
        )
        .unwrap();
        assert_eq!(users(&p), [(1, MESSAGE), (2, MESSAGE), (3, MESSAGE)]);
        assert!(p.replicate_answer && !p.replicate_meta);
    }

    #[test]
    fn an_answer_a_move_copied_goes_to_the_standbys_and_to_nobody_else() {
        let p = plan(
            &event(OutboxKind::AnswerSync, 1, vec![]),
            &Set(vec![1, 2, 3]),
            10,
        )
        .unwrap();
        assert_eq!(p.fanout, Fanout::None);
        assert!(p.replicate_copied_answers && !p.replicate_answer && !p.replicate_meta);
    }

    #[test]
    fn a_directed_message_reaches_its_members_among_recipients_and_the_sender() {
        // 4 left the conversation; 2 is named twice.
        let e = event(OutboxKind::Message, 1, vec![2, 4, 2]);
        let p = plan(&e, &Set(vec![1, 2, 3]), 10).unwrap();
        assert_eq!(users(&p), [(1, MESSAGE), (2, MESSAGE)]);
        // A recall of it goes the same way, without an answer to ship.
        let p = plan(
            &event(OutboxKind::Recall, 1, vec![3]),
            &Set(vec![1, 2, 3]),
            10,
        )
        .unwrap();
        let recall = SyncEventKind::Recall as i32;
        assert_eq!(users(&p), [(1, recall), (3, recall)]);
        assert!(!p.replicate_answer);
    }

    #[test]
    fn a_large_group_gets_a_hint_instead_of_records() {
        let members: Vec<u64> = (1..=11).collect();
        let p = plan(&event(OutboxKind::Edit, 1, vec![]), &Set(members), 10).unwrap();
        assert_eq!(
            p.fanout,
            Fanout::Hint {
                hint: ConversationHint {
                    conversation_id: 9,
                    latest_seq: 5,
                    msg_id: 77
                }
            }
        );
    }

    #[test]
    fn read_marks_and_deletes_go_to_their_user_only() {
        let p = plan(&event(OutboxKind::Read, 2, vec![]), &Set(vec![1, 2, 3]), 10).unwrap();
        assert_eq!(users(&p), [(2, SyncEventKind::Read as i32)]);
        let p = plan(
            &event(OutboxKind::DeleteForMe, 3, vec![5]),
            &Set(vec![3]),
            10,
        )
        .unwrap();
        let Fanout::Records(records) = &p.fanout else {
            panic!("records")
        };
        assert_eq!(records[0].1.items, [5], "the deleted seqs travel along");
    }

    #[test]
    fn membership_changes_say_joined_or_left_and_ship_the_meta() {
        let e = event(OutboxKind::MembersChanged, 1, vec![2, 5]);
        let p = plan(&e, &Set(vec![1, 2]), 10).unwrap();
        assert_eq!(
            users(&p),
            [
                (2, SyncEventKind::Joined as i32),
                (5, SyncEventKind::Left as i32)
            ]
        );
        assert!(p.replicate_meta && !p.replicate_answer);
        let p = plan(
            &event(OutboxKind::ConversationCreated, 1, vec![1, 2]),
            &Set(vec![]),
            10,
        );
        assert_eq!(users(&p.unwrap()).len(), 2);
    }

    #[test]
    fn meta_sync_and_unknown_events_fan_out_nothing() {
        let p = plan(&event(OutboxKind::MetaSync, 1, vec![]), &Set(vec![1]), 10).unwrap();
        assert_eq!((p.fanout, p.replicate_meta), (Fanout::None, true));
        let p = plan(
            &event(OutboxKind::Unspecified, 1, vec![]),
            &Set(vec![1]),
            10,
        )
        .unwrap();
        assert_eq!((p.fanout, p.replicate_meta), (Fanout::None, false));
    }
}
