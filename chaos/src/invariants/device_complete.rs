//! What invariant 3 presumes: a device's sync is complete. Every message
//! acknowledged in a conversation reaches every device of its members — at
//! least once, in any session; a queue that skips loses the message for
//! that device as surely as a lost write.
//! A device told that its queue was replaced (a rebase after a failed-over
//! home) is owed only what was sent after that: the rest it reads from
//! history, as clients do.

use std::collections::HashSet;

use super::Violation;
use crate::history::{History, Outcome};

pub const NAME: &str = "every acknowledged message reaches every member device";

pub fn check(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    for device in &h.devices {
        let seen: HashSet<(u64, u64)> = (h.deliveries.iter())
            .filter(|d| {
                (d.tenant, d.user) == (device.tenant, device.user) && d.device == device.device
            })
            .map(|d| (d.conversation, d.seq))
            .collect();
        let owed_from = device.rebases_ms.iter().copied().max().unwrap_or(0);
        let followed: HashSet<u64> = device.conversations.iter().copied().collect();
        for op in &h.sends {
            let Outcome::Ok { seq, .. } = op.outcome else {
                continue;
            };
            if !followed.contains(&op.conversation) || op.invoked_ms <= owed_from && owed_from > 0 {
                continue;
            }
            if !seen.contains(&(op.conversation, seq)) {
                out.push(Violation::new(
                    NAME,
                    format!(
                        "user {} device {:?} never received conversation {} seq {} ({}, acked at {} ms)",
                        device.user, device.device, op.conversation, seq, op.client_req_id, op.completed_ms
                    ),
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn an_acked_message_a_device_never_received_is_caught() {
        let mut h = good();
        h.deliveries
            .retain(|d| !(d.device == "laptop" && d.seq == 2));
        let found = check(&h);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].detail.contains("laptop"), "{found:?}");
    }

    #[test]
    fn a_device_that_received_nothing_owes_everything() {
        let mut h = good();
        h.deliveries.retain(|d| d.device != "phone");
        assert_eq!(check(&h).len(), 3);
    }

    #[test]
    fn messages_sent_before_a_rebase_are_not_owed_but_later_ones_are() {
        let mut h = good();
        h.deliveries.retain(|d| !(d.device == "phone" && d.seq < 3));
        h.devices[0].rebases_ms = vec![25];
        assert!(
            check(&h).is_empty(),
            "seq 1 and 2 were sent before the rebase"
        );
        h.devices[0].rebases_ms = vec![15];
        assert_eq!(check(&h).len(), 1, "seq 2 was sent after it");
    }

    #[test]
    fn unacknowledged_sends_and_other_conversations_are_not_owed() {
        let mut h = good();
        h.sends[1].outcome = Outcome::Unknown;
        h.sends[2].conversation = 8;
        h.deliveries.retain(|d| d.seq == 1);
        assert!(check(&h).is_empty());
    }
}
