//! Invariant 3 (second half): all devices of a user see one order. The same
//! pts of the same queue always names the same event, on every device and
//! every session; and within one subscription, pts only increase.

use std::collections::HashMap;

use super::Violation;
use crate::history::History;

pub const NAME: &str = "all devices of a user see one order";

/// A user's place in one queue: (tenant, user, queue, pts).
type Place = (u64, u64, u64, u64);
/// What a device saw there: (conversation, seq, kind, device).
type Seen<'a> = (u64, u64, i32, &'a str);

pub fn check(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut at_pts: HashMap<Place, Seen> = HashMap::new();
    let mut last_in_session: HashMap<(u64, u64, &str, u64), u64> = HashMap::new();
    for d in &h.deliveries {
        let event = (d.conversation, d.seq, d.kind, d.device.as_str());
        let place = (d.tenant, d.user, d.queue, d.pts);
        match at_pts.get(&place) {
            Some(seen) if (seen.0, seen.1, seen.2) != (event.0, event.1, event.2) => {
                out.push(Violation::new(
                    NAME,
                    format!(
                        "tenant {} user {} pts {}: device {:?} saw conversation {} seq {}, device {:?} saw conversation {} seq {}",
                        d.tenant, d.user, d.pts, seen.3, seen.0, seen.1, d.device, d.conversation, d.seq
                    ),
                ))
            }
            Some(_) => {}
            None => {
                at_pts.insert(place, event);
            }
        }
        let session = (d.tenant, d.user, d.device.as_str(), d.session);
        if let Some(previous) = last_in_session.insert(session, d.pts)
            && d.pts <= previous
        {
            out.push(Violation::new(
                NAME,
                format!(
                    "tenant {} user {} device {:?} session {}: pts {} after {previous}",
                    d.tenant, d.user, d.device, d.session, d.pts
                ),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn devices_that_disagree_on_an_event_are_caught() {
        let mut h = good();
        // The laptop's pts 2 names another message than the phone's.
        let laptop = h
            .deliveries
            .iter_mut()
            .find(|d| d.device == "laptop" && d.pts == 2)
            .unwrap();
        laptop.seq = 3;
        assert_eq!(check(&h).len(), 1);
        // In a queue started afresh (a failed-over home) pts 2 is another
        // event, and that is no disagreement.
        let laptop = h.deliveries.iter_mut().find(|d| d.seq == 3 && d.pts == 2);
        laptop.unwrap().queue = 9;
        assert!(check(&h).is_empty());
    }

    #[test]
    fn out_of_order_delivery_within_a_session_is_caught_but_redelivery_after_reconnect_is_not() {
        let mut h = good();
        h.deliveries.push(delivery("phone", 1, 2, 2));
        assert_eq!(check(&h).len(), 1, "pts 2 again in the same session");
        let mut h = good();
        h.deliveries.push(delivery("phone", 2, 2, 2));
        h.deliveries.push(delivery("phone", 2, 3, 3));
        assert!(check(&h).is_empty(), "at-least-once after a reconnect");
    }
}
