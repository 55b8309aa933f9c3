//! Invariant 1 (first half): every acknowledged send appears in its
//! conversation's history, with the seq and msg_id it was acknowledged
//! with; a definitely rejected send does not appear.

use std::collections::HashMap;

use super::Violation;
use crate::history::{History, Outcome, Stored};

pub const NAME: &str = "acknowledged sends are never lost";

pub fn check(h: &History) -> Vec<Violation> {
    let by_tag: HashMap<(u64, &str), &Stored> = h
        .conversations
        .iter()
        .flat_map(|(conv, msgs)| msgs.iter().map(move |m| ((*conv, m.tag.as_str()), m)))
        .collect();
    let mut out = Vec::new();
    for send in &h.sends {
        let found = by_tag.get(&(send.conversation, send.client_req_id.as_str()));
        match (&send.outcome, found) {
            (Outcome::Ok { .. }, None) => out.push(Violation::new(
                NAME,
                format!(
                    "acked send {:?} to conversation {} is missing",
                    send.client_req_id, send.conversation
                ),
            )),
            (Outcome::Ok { msg_id, seq }, Some(m)) if (m.seq, m.msg_id) != (*seq, *msg_id) => {
                out.push(Violation::new(
                    NAME,
                    format!(
                        "send {:?} was acked as seq {seq} msg {msg_id} but is stored as seq {} msg {}",
                        send.client_req_id, m.seq, m.msg_id
                    ),
                ))
            }
            (Outcome::Rejected { code }, Some(m)) => out.push(Violation::new(
                NAME,
                format!(
                    "send {:?} was rejected ({code}) yet stored at seq {}",
                    send.client_req_id, m.seq
                ),
            )),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn a_lost_acked_send_is_caught() {
        let mut h = good();
        h.conversations.get_mut(&7).unwrap().remove(1);
        let v = check(&h);
        assert_eq!(v.len(), 1);
        assert!(v[0].detail.contains("\"b\""));
    }

    #[test]
    fn a_stored_message_that_differs_from_its_ack_is_caught() {
        let mut h = good();
        h.conversations.get_mut(&7).unwrap()[2].msg_id = 1;
        assert_eq!(check(&h).len(), 1);
    }

    #[test]
    fn a_rejected_send_must_not_be_stored_but_an_unknown_one_may() {
        let mut h = good();
        h.sends[0].outcome = Outcome::Rejected {
            code: "RATE_LIMITED".into(),
        };
        assert_eq!(check(&h).len(), 1);
        h.sends[0].outcome = Outcome::Unknown;
        assert!(check(&h).is_empty());
        h.conversations.get_mut(&7).unwrap().remove(0);
        assert!(
            check(&h).is_empty(),
            "absent is fine for an unknown outcome"
        );
    }
}
