//! The invariants of DESIGN.md §7, one function per file, each over a
//! recorded [`History`] and returning its counterexamples. Unknown send
//! outcomes count as "may have happened": present once or absent is fine,
//! twice is not.

mod cursor;
mod device_complete;
mod device_order;
mod duplicates;
mod files;
pub mod lost_acked;
mod migration;
mod not_found;
mod resends;
mod seq_order;
mod split_brain;
mod tenant_isolation;

use serde::Serialize;

/// Deliveries still owed to the devices (what the drill waits on before
/// it stops them).
pub use device_complete::check as undelivered;

use crate::history::History;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
}

impl Violation {
    fn new(invariant: &'static str, detail: String) -> Self {
        Self { invariant, detail }
    }
}

/// One invariant's outcome, with its first counterexamples.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub invariant: &'static str,
    pub holds: bool,
    pub violations: usize,
    pub counterexamples: Vec<String>,
}

/// Counterexamples kept per invariant in a verdict.
const KEEP: usize = 20;

type Check = fn(&History) -> Vec<Violation>;

/// Every invariant, in DESIGN.md order.
pub const ALL: [(&str, Check); 12] = [
    (lost_acked::NAME, lost_acked::check),
    (files::NAME, files::check),
    (not_found::NAME, not_found::check),
    (duplicates::NAME, duplicates::check),
    (resends::NAME, resends::check),
    (seq_order::NAME, seq_order::check),
    (cursor::NAME, cursor::check),
    (device_order::NAME, device_order::check),
    (device_complete::NAME, device_complete::check),
    (migration::NAME, migration::check),
    (split_brain::NAME, split_brain::check),
    (tenant_isolation::NAME, tenant_isolation::check),
];

pub fn check_all(history: &History) -> Vec<Verdict> {
    ALL.iter()
        .map(|(name, check)| {
            let violations = check(history);
            Verdict {
                invariant: name,
                holds: violations.is_empty(),
                violations: violations.len(),
                counterexamples: violations
                    .into_iter()
                    .take(KEEP)
                    .map(|v| v.detail)
                    .collect(),
            }
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! A small history in which every invariant holds; each invariant's
    //! tests break it in the one way that invariant must catch.

    use crate::history::*;

    pub fn ok_send(conversation: u64, tag: &str, seq: u64, at: u64) -> SendOp {
        SendOp {
            conversation,
            sender: 1,
            client_req_id: tag.to_string(),
            invoked_ms: at,
            completed_ms: at + 5,
            outcome: Outcome::Ok {
                msg_id: 1000 + seq,
                seq,
            },
        }
    }

    pub fn stored(tag: &str, seq: u64) -> Stored {
        Stored {
            seq,
            msg_id: 1000 + seq,
            tag: tag.to_string(),
        }
    }

    pub fn delivery(device: &str, session: u64, pts: u64, seq: u64) -> DeliveryRecord {
        DeliveryRecord {
            tenant: 1,
            user: 2,
            device: device.to_string(),
            session,
            pts,
            conversation: 7,
            seq,
            kind: 1,
            queue: 0,
            at_ms: seq * 10 + 20,
        }
    }

    pub fn good() -> History {
        let mut h = History::default();
        for (i, tag) in ["a", "b", "c"].iter().enumerate() {
            let seq = i as u64 + 1;
            h.sends.push(ok_send(7, tag, seq, seq * 10));
            h.accepted.push(AcceptedWrite {
                cell: "eu/c1".into(),
                conversation: 7,
                epoch: 1,
                seq,
                at_ms: seq * 10 + 1,
            });
            for device in ["phone", "laptop"] {
                h.deliveries.push(delivery(device, 1, seq, seq));
            }
        }
        h.conversations
            .insert(7, vec![stored("a", 1), stored("b", 2), stored("c", 3)]);
        h.tenants.insert(7, 1);
        for device in ["phone", "laptop"] {
            h.devices.push(Device {
                tenant: 1,
                user: 2,
                device: device.into(),
                conversations: vec![7],
                rebases_ms: Vec::new(),
            });
        }
        h.cursor_acks = vec![
            CursorAck {
                tenant: 1,
                user: 2,
                device: "phone".into(),
                at_ms: 50,
                cursor: 2,
                queue: 0,
            },
            CursorAck {
                tenant: 1,
                user: 2,
                device: "phone".into(),
                at_ms: 60,
                cursor: 3,
                queue: 0,
            },
        ];
        h
    }

    #[test]
    fn every_invariant_holds_on_the_good_history() {
        for verdict in super::check_all(&good()) {
            assert!(verdict.holds, "{verdict:?}");
        }
    }
}
