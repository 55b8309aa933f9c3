//! Whether a standby takes a conversation's meta or a send's answer that
//! another cell replicated to it. Only a cell that holds the conversation
//! may replicate it: its owner, or the target of a move under way, which
//! stores the copied conversation (and emits its meta) before the route
//! switches to it — a standby that waited for the switch would never see
//! that meta again. Everything else is refused for good: a cell this one
//! does not follow the route of has no business writing here.
//!
//! The caller (`DeliverBatch`) first waits until this cell's route view is
//! at least as new as the sender's, and answers `ROUTE_BEHIND` (the sender
//! defers the events (the sender keeps them and retries) when it is not, so
//! a refusal here is never the result of a view that merely lags.
//!
//! [`RecentAnswers`] keeps the answers a cell shipped lately, for a standby
//! that joins (a cell back Up, a new cell of the region): a failover may
//! pick it at once, and it must answer re-sends of what was acknowledged
//! while it was no standby.

use cellmesh_proto::ids::TenantId;
use std::collections::VecDeque;

use cellmesh_proto::v1::PeerEvent;

use crate::homes::Owner;

/// What is known of one replicated event.
pub struct Replicated<'a> {
    /// The replicating cell.
    pub source: &'a str,
    /// The tenant the event names.
    pub tenant: TenantId,
    /// The tenant its conversation record names (meta only).
    pub claimed_tenant: Option<u64>,
    /// The tenant of the conversation as stored here, if it is.
    pub held_tenant: Option<u64>,
}

/// Why a standby refuses a replicated event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("its record names tenant {claimed}, the event tenant {event}")]
    OtherTenantsRecord { claimed: u64, event: u64 },
    #[error("the conversation here belongs to tenant {0}")]
    HeldForOtherTenant(u64),
    #[error("this cell owns the conversation")]
    OwnedHere,
    #[error("the conversation is owned by {0}")]
    OwnedBy(String),
}

/// `Ok` to store the event on `this_cell`, or why it is refused.
pub fn verdict(this_cell: &str, e: &Replicated, owner: Option<&Owner>) -> Result<(), Refusal> {
    if let Some(claimed) = e.claimed_tenant.filter(|t| *t != e.tenant.get()) {
        return Err(Refusal::OtherTenantsRecord {
            claimed,
            event: e.tenant.get(),
        });
    }
    if let Some(held) = e.held_tenant.filter(|t| *t != e.tenant.get()) {
        return Err(Refusal::HeldForOtherTenant(held));
    }
    match owner {
        Some(owner) if owner.cell == this_cell => Err(Refusal::OwnedHere),
        Some(owner) if !owner.holds(e.source) => Err(Refusal::OwnedBy(owner.cell.clone())),
        // Without a route (no table, or none yet) the event is taken.
        _ => Ok(()),
    }
}

/// The answers a cell shipped to its standbys lately (at most `cap`), and
/// the standbys it shipped them to.
pub struct RecentAnswers {
    answers: VecDeque<PeerEvent>,
    cap: usize,
    standbys: Vec<String>,
}

impl RecentAnswers {
    pub fn new(cap: usize) -> Self {
        Self {
            answers: VecDeque::new(),
            cap,
            standbys: Vec::new(),
        }
    }

    /// Notes an answer shipped to the standbys.
    pub fn shipped(&mut self, answer: &PeerEvent) {
        if self.answers.len() == self.cap {
            self.answers.pop_front();
        }
        self.answers.push_back(answer.clone());
    }

    /// The standbys in `now` that were not standbys at the last call, with
    /// the answers to ship them first (oldest first).
    pub fn joined(&mut self, now: &[String]) -> (Vec<String>, Vec<PeerEvent>) {
        let new: Vec<String> = (now.iter())
            .filter(|s| !self.standbys.contains(s))
            .cloned()
            .collect();
        if now != self.standbys.as_slice() {
            self.standbys = now.to_vec();
        }
        let replay = match new.is_empty() {
            true => Vec::new(),
            false => self.answers.iter().cloned().collect(),
        };
        (new, replay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(seq: u64) -> PeerEvent {
        PeerEvent {
            seq,
            ..Default::default()
        }
    }

    #[test]
    fn a_standby_that_joins_gets_the_recent_answers_and_no_one_else_does() {
        let mut recent = RecentAnswers::new(2);
        let both = ["eu/c2".to_string(), "us/c1".to_string()];
        // The first standbys seen join with nothing shipped yet.
        assert_eq!(recent.joined(&both[1..]), (vec!["us/c1".into()], vec![]));
        for seq in 1..=3 {
            recent.shipped(&answer(seq));
        }
        // Unchanged: nothing to replay.
        assert_eq!(recent.joined(&both[1..]).0, Vec::<String>::new());
        // eu/c2 is back: the last two answers (the cap) go to it alone.
        let (new, replay) = recent.joined(&both);
        assert_eq!(new, vec!["eu/c2".to_string()]);
        assert_eq!(replay.iter().map(|a| a.seq).collect::<Vec<_>>(), [2, 3]);
        // It leaves and returns: replayed again.
        recent.joined(&both[1..]);
        assert_eq!(recent.joined(&both).0, vec!["eu/c2".to_string()]);
    }

    fn event(source: &str) -> Replicated<'_> {
        Replicated {
            source,
            tenant: TenantId(1),
            claimed_tenant: Some(1),
            held_tenant: None,
        }
    }

    fn owner(cell: &str, incoming: Option<&str>) -> Owner {
        Owner {
            cell: cell.into(),
            incoming: incoming.map(Into::into),
        }
    }

    #[test]
    fn meta_from_a_move_target_before_the_switch_is_taken() {
        // The view has the move (eu-west/c1 → us-east/c1) but not its switch:
        // the target's meta of the copied conversation lands on its standby.
        let moving = owner("eu-west/c1", Some("us-east/c1"));
        assert_eq!(
            verdict("us-east/c2", &event("us-east/c1"), Some(&moving)),
            Ok(())
        );
        // And after the switch, from the new owner.
        let switched = owner("us-east/c1", None);
        assert_eq!(
            verdict("us-east/c2", &event("us-east/c1"), Some(&switched)),
            Ok(())
        );
        // The source still holds it while moving: its meta is taken too.
        assert_eq!(
            verdict("us-east/c2", &event("eu-west/c1"), Some(&moving)),
            Ok(())
        );
    }

    #[test]
    fn meta_from_a_cell_that_holds_nothing_is_refused() {
        let settled = owner("eu-west/c1", None);
        let refused = verdict("us-east/c2", &event("us-east/c1"), Some(&settled));
        assert_eq!(refused, Err(Refusal::OwnedBy("eu-west/c1".into())));
        // A cancelled move leaves the former target holding nothing.
        let elsewhere = owner("eu-west/c1", Some("ap-south/c1"));
        assert_eq!(
            verdict("us-east/c2", &event("us-east/c1"), Some(&elsewhere)),
            Err(Refusal::OwnedBy("eu-west/c1".into()))
        );
    }

    #[test]
    fn a_cell_never_takes_a_replica_of_what_it_owns_or_of_another_tenant() {
        let mine = owner("us-east/c2", None);
        assert_eq!(
            verdict("us-east/c2", &event("us-east/c1"), Some(&mine)),
            Err(Refusal::OwnedHere)
        );
        let foreign = Replicated {
            claimed_tenant: Some(2),
            ..event("us-east/c1")
        };
        assert_eq!(
            verdict("us-east/c2", &foreign, None),
            Err(Refusal::OtherTenantsRecord {
                claimed: 2,
                event: 1
            })
        );
        let taken = Replicated {
            held_tenant: Some(2),
            ..event("us-east/c1")
        };
        assert_eq!(
            verdict("us-east/c2", &taken, None),
            Err(Refusal::HeldForOtherTenant(2))
        );
        assert_eq!(verdict("us-east/c2", &event("us-east/c1"), None), Ok(()));
    }
}
