//! Invariant 1 (its precondition): a conversation that acknowledged a send
//! exists from then on. A cell that answers "not found" for it — a
//! failover target that never received the conversation's record — makes
//! its acknowledged history unreadable, whatever that cell stores.

use std::collections::HashMap;

use super::Violation;
use crate::history::{History, Outcome};

pub const NAME: &str = "acknowledged conversations are never answered not found";

pub fn check(h: &History) -> Vec<Violation> {
    // The first acknowledgement of each conversation.
    let mut first_ack: HashMap<u64, u64> = HashMap::new();
    for send in &h.sends {
        if matches!(send.outcome, Outcome::Ok { .. }) {
            let at = first_ack.entry(send.conversation).or_insert(u64::MAX);
            *at = (*at).min(send.completed_ms);
        }
    }
    let mut out = Vec::new();
    for send in &h.sends {
        let Outcome::Rejected { code } = &send.outcome else {
            continue;
        };
        if !code.contains("NOT_FOUND") {
            continue;
        }
        if let Some(acked) = first_ack
            .get(&send.conversation)
            .filter(|a| **a <= send.invoked_ms)
        {
            out.push(Violation::new(
                NAME,
                format!(
                    "send {:?} at {} ms was answered {code}, though conversation {} acknowledged a send at {acked} ms",
                    send.client_req_id, send.invoked_ms, send.conversation
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
    use crate::history::SendOp;

    fn not_found(at: u64) -> SendOp {
        SendOp {
            outcome: Outcome::Rejected {
                code: "NOT_FOUND".into(),
            },
            ..ok_send(7, "lost", 0, at)
        }
    }

    #[test]
    fn not_found_after_an_ack_is_caught() {
        let mut h = good();
        h.sends.push(not_found(100));
        let v = check(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].detail.contains("conversation 7"), "{v:?}");
    }

    #[test]
    fn not_found_before_any_ack_is_not_a_violation() {
        let mut h = good();
        // Invoked before the first send of conversation 7 was acknowledged.
        h.sends.push(not_found(0));
        assert!(check(&h).is_empty());
    }
}
