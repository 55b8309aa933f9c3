//! Invariant 2: per conversation, seq strictly increases in history order
//! and never goes backwards in real time (a send acknowledged after another
//! completed has a higher seq, across restarts, migrations and failovers);
//! every gap is explained by a recorded failover floor or lies inside a
//! range an owner reported skipped.

use std::collections::HashMap;

use super::Violation;
use crate::history::{History, Outcome};

pub const NAME: &str = "seq strictly increases; gaps only at failover floors";

pub fn check(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut floors: HashMap<u64, Vec<u64>> = HashMap::new();
    for f in &h.floors {
        floors.entry(f.conversation).or_default().push(f.floor);
    }
    for (conv, msgs) in &h.conversations {
        let floors = floors.get(conv).map(Vec::as_slice).unwrap_or(&[]);
        let skipped: Vec<_> = (h.skipped.iter())
            .filter(|s| s.conversation == *conv)
            .collect();
        // Every seq between the two messages was skipped on purpose.
        let jumped = |previous: u64, next: u64| {
            (skipped.iter()).any(|s| s.first <= previous + 1 && next - 1 <= s.last)
        };
        let mut previous = 0;
        for m in msgs {
            if m.seq <= previous {
                out.push(Violation::new(
                    NAME,
                    format!("conversation {conv}: seq {} follows {previous}", m.seq),
                ));
            } else if m.seq > previous + 1
                && !floors.iter().any(|f| previous <= *f && *f < m.seq)
                && !jumped(previous, m.seq)
            {
                out.push(Violation::new(
                    NAME,
                    format!(
                        "conversation {conv}: unexplained gap from {previous} to {}",
                        m.seq
                    ),
                ));
            }
            previous = previous.max(m.seq);
        }
    }
    out.extend(real_time_regressions(h));
    out
}

/// Acked sends in one conversation: one completed before another was
/// invoked must have the lower seq. A request retried with the same
/// client_req_id may have taken effect at its first attempt (the retry is
/// answered from the idempotency record), so it counts as invoked then.
fn real_time_regressions(h: &History) -> Vec<Violation> {
    let mut first_invoked: HashMap<(u64, u64, &str), u64> = HashMap::new();
    for s in &h.sends {
        let key = (s.conversation, s.sender, s.client_req_id.as_str());
        let at = first_invoked.entry(key).or_insert(s.invoked_ms);
        *at = (*at).min(s.invoked_ms);
    }
    let mut by_conv: HashMap<u64, Vec<(u64, u64, u64, &str)>> = HashMap::new();
    for s in &h.sends {
        if let Outcome::Ok { seq, .. } = s.outcome {
            let invoked = first_invoked[&(s.conversation, s.sender, s.client_req_id.as_str())];
            by_conv.entry(s.conversation).or_default().push((
                invoked,
                s.completed_ms,
                seq,
                s.client_req_id.as_str(),
            ));
        }
    }
    let mut out = Vec::new();
    for (conv, mut ops) in by_conv {
        ops.sort_by_key(|o| o.1);
        // Highest seq (and its request) among the first i completed ops.
        let mut prefix: Vec<(u64, &str)> = Vec::with_capacity(ops.len());
        for o in &ops {
            let best = prefix
                .last()
                .copied()
                .filter(|b| b.0 >= o.2)
                .unwrap_or((o.2, o.3));
            prefix.push(best);
        }
        for o in &ops {
            let before = ops.partition_point(|p| p.1 < o.0);
            if before > 0 && prefix[before - 1].0 >= o.2 {
                let (seq, tag) = prefix[before - 1];
                out.push(Violation::new(
                    NAME,
                    format!(
                        "conversation {conv}: {:?} got seq {} after {tag:?} had completed with seq {seq}",
                        o.3, o.2
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
    use crate::history::Floor;

    #[test]
    fn a_gap_is_caught_unless_a_floor_explains_it() {
        let mut h = good();
        h.conversations.get_mut(&7).unwrap()[2].seq = 10;
        h.sends[2].outcome = Outcome::Ok {
            msg_id: 1003,
            seq: 10,
        };
        assert_eq!(check(&h).len(), 1);
        h.floors.push(Floor {
            conversation: 7,
            floor: 9,
        });
        assert!(check(&h).is_empty());
    }

    #[test]
    fn a_gap_inside_a_reported_skipped_range_is_explained() {
        // An earlier failover's jump (3..=9), long replaced as the floor:
        // "c" at 10 follows "b" at 2.
        let mut h = good();
        h.conversations.get_mut(&7).unwrap()[2].seq = 10;
        h.sends[2].outcome = Outcome::Ok {
            msg_id: 1003,
            seq: 10,
        };
        let skipped = |first, last| crate::history::Skipped {
            conversation: 7,
            first,
            last,
        };
        // A range that covers only part of the gap explains nothing.
        h.skipped.push(skipped(4, 9));
        assert_eq!(check(&h).len(), 1);
        // Another conversation's range neither.
        h.skipped.push(crate::history::Skipped {
            conversation: 8,
            ..skipped(3, 9)
        });
        assert_eq!(check(&h).len(), 1);
        h.skipped.push(skipped(3, 9));
        assert!(check(&h).is_empty());
    }

    #[test]
    fn history_going_backwards_is_caught() {
        let mut h = good();
        h.conversations.get_mut(&7).unwrap().swap(1, 2);
        assert!(!check(&h).is_empty());
    }

    #[test]
    fn a_seq_regression_in_real_time_is_caught() {
        let mut h = good();
        // "c" was invoked after "b" completed yet got a lower seq (as after
        // a failover that forgot the floor).
        h.sends[2].outcome = Outcome::Ok {
            msg_id: 1003,
            seq: 2,
        };
        let v = real_time_regressions(&h);
        assert_eq!(v.len(), 1);
        assert!(v[0].detail.contains("\"c\""));
        // Concurrent sends may complete in either order.
        let mut h = good();
        h.sends[2].invoked_ms = h.sends[1].invoked_ms;
        h.sends[1].outcome = Outcome::Ok {
            msg_id: 1003,
            seq: 3,
        };
        h.sends[2].outcome = Outcome::Ok {
            msg_id: 1002,
            seq: 2,
        };
        assert!(real_time_regressions(&h).is_empty());
    }

    #[test]
    fn a_retry_answered_from_the_first_attempt_is_not_a_regression() {
        let mut h = good();
        // "b" was applied as seq 2 but its answer was lost; its retry after
        // "c" completed (seq 3) is answered with seq 2.
        h.sends[1].outcome = Outcome::Unknown;
        h.sends.push(ok_send(7, "b", 2, 100));
        assert!(check(&h).is_empty());
        // Without the first attempt on record it would be one.
        h.sends.remove(1);
        assert_eq!(real_time_regressions(&h).len(), 1);
    }
}
