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
//! keeps the events and retries) when it is not, so a refusal here is never
//! the result of a view that merely lags.

use crate::homes::Owner;

/// What is known of one replicated event.
pub struct Replicated<'a> {
    /// The replicating cell.
    pub source: &'a str,
    /// The tenant the event names.
    pub tenant: u64,
    /// The tenant its conversation record names (meta only).
    pub claimed_tenant: Option<u64>,
    /// The tenant of the conversation as stored here, if it is.
    pub held_tenant: Option<u64>,
}

/// `Ok` to store the event on `this_cell`, or why it is refused.
pub fn verdict(this_cell: &str, e: &Replicated, owner: Option<&Owner>) -> Result<(), String> {
    if let Some(claimed) = e.claimed_tenant.filter(|t| *t != e.tenant) {
        return Err(format!(
            "its record names tenant {claimed}, the event tenant {}",
            e.tenant
        ));
    }
    if let Some(held) = e.held_tenant.filter(|t| *t != e.tenant) {
        return Err(format!("the conversation here belongs to tenant {held}"));
    }
    match owner {
        Some(owner) if owner.cell == this_cell => Err("this cell owns the conversation".into()),
        Some(owner) if !owner.holds(e.source) => {
            Err(format!("the conversation is owned by {}", owner.cell))
        }
        // Without a route (no table, or none yet) the event is taken.
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(source: &str) -> Replicated<'_> {
        Replicated {
            source,
            tenant: 1,
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
        assert_eq!(
            refused,
            Err("the conversation is owned by eu-west/c1".to_string())
        );
        // A cancelled move leaves the former target holding nothing.
        let elsewhere = owner("eu-west/c1", Some("ap-south/c1"));
        assert!(verdict("us-east/c2", &event("us-east/c1"), Some(&elsewhere)).is_err());
    }

    #[test]
    fn a_cell_never_takes_a_replica_of_what_it_owns_or_of_another_tenant() {
        let mine = owner("us-east/c2", None);
        assert!(verdict("us-east/c2", &event("us-east/c1"), Some(&mine)).is_err());
        let foreign = Replicated {
            claimed_tenant: Some(2),
            ..event("us-east/c1")
        };
        assert!(verdict("us-east/c2", &foreign, None).is_err());
        let taken = Replicated {
            held_tenant: Some(2),
            ..event("us-east/c1")
        };
        assert!(verdict("us-east/c2", &taken, None).is_err());
        assert_eq!(verdict("us-east/c2", &event("us-east/c1"), None), Ok(()));
    }
}
