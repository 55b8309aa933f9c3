//! Invariant 6, as a client sees it: a repeated `client_req_id` gets the
//! answer of its first send — the same seq and msg id — whatever happened
//! in between (a failover, a restart, a move). A re-send answered with
//! something else created a second message, or moved the first.

use super::Violation;
use crate::history::{History, Outcome};

pub const NAME: &str = "a re-sent request gets its first answer";

pub fn check(h: &History) -> Vec<Violation> {
    h.resends
        .iter()
        .filter_map(|r| match (&r.original, &r.answer) {
            (Outcome::Ok { .. }, Outcome::Ok { .. }) if r.original != r.answer => {
                Some(Violation::new(
                    NAME,
                    format!(
                        "conversation {} request {} re-sent at {} ms: first answered {:?}, then {:?}",
                        r.conversation, r.client_req_id, r.at_ms, r.original, r.answer
                    ),
                ))
            }
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use crate::history::Resend;

    fn resend(answer: Outcome) -> Resend {
        Resend {
            conversation: 7,
            client_req_id: "b".into(),
            original: Outcome::Ok {
                msg_id: 1002,
                seq: 2,
            },
            answer,
            at_ms: 100,
        }
    }

    #[test]
    fn a_resend_answered_with_a_new_message_is_caught() {
        let mut h = good();
        h.resends.push(resend(Outcome::Ok {
            msg_id: 1002,
            seq: 2,
        }));
        // No answer at all is no answer to judge.
        h.resends.push(resend(Outcome::Unknown));
        assert!(check(&h).is_empty());
        h.resends.push(resend(Outcome::Ok {
            msg_id: 5000,
            seq: 400,
        }));
        assert_eq!(check(&h).len(), 1);
    }
}
