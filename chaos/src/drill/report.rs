//! The drill's report: faults with their recovery times, operation
//! outcomes and the checker's verdicts, as JSON and as a human summary.

use std::collections::{BTreeMap, HashMap};

use crate::history::{History, Outcome};
use crate::invariants::Verdict;
use serde_json::{Value, json};

use super::faults::Fault;

/// How a fault's conversations recovered, from the recorded acks: the
/// first ack invoked after the fault, and the longest stretch without an
/// ack in any of them until `until_ms` (the write outage it caused).
pub fn recovery(fault: &Fault, history: &History, until_ms: u64) -> Value {
    let mut first_ack: Option<u64> = None;
    let mut longest_gap = 0u64;
    for &conversation in &fault.affected {
        let mut acks: Vec<u64> = history
            .sends
            .iter()
            .filter(|op| op.conversation == conversation)
            .filter(|op| matches!(op.outcome, Outcome::Ok { .. }))
            .filter(|op| op.invoked_ms >= fault.at_ms && op.completed_ms <= until_ms)
            .map(|op| op.completed_ms)
            .collect();
        acks.sort_unstable();
        if let Some(&first) = acks.first() {
            first_ack = Some(first_ack.map_or(first, |f: u64| f.min(first)));
        }
        let mut previous = fault.at_ms;
        for ack in acks.iter().copied().chain(std::iter::once(until_ms)) {
            longest_gap = longest_gap.max(ack.saturating_sub(previous));
            previous = ack;
        }
    }
    if fault.affected.is_empty() {
        return json!({"affected": 0});
    }
    json!({
        "affected": fault.affected.len(),
        "first_ack_after_ms": first_ack.map(|a| a - fault.at_ms),
        "longest_ack_gap_ms": longest_gap,
        "component_recovered_after_ms": fault.recovered_ms.map(|r| r.saturating_sub(fault.at_ms)),
    })
}

pub struct Summary {
    pub acked: usize,
    pub rejected: usize,
    pub unknown: usize,
    pub rejected_by_code: BTreeMap<String, u64>,
    /// Pushes the drill's devices received, and the sessions they took.
    pub deliveries: usize,
    pub sessions: usize,
    /// Finished moves checked against their source's copy.
    pub moves: usize,
    /// From a send's ack to its first arrival on each device that got it:
    /// p50, p99 and max in ms (fan-out lag under the drill's faults).
    pub delivery_lag_ms: Option<[u64; 3]>,
}

pub fn summarize(history: &History) -> Summary {
    let count = |f: fn(&Outcome) -> bool| history.sends.iter().filter(|o| f(&o.outcome)).count();
    let mut rejected_by_code = BTreeMap::<String, u64>::new();
    for op in &history.sends {
        if let Outcome::Rejected { code } = &op.outcome {
            *rejected_by_code.entry(code.clone()).or_default() += 1;
        }
    }
    Summary {
        acked: count(|o| matches!(o, Outcome::Ok { .. })),
        rejected: count(|o| matches!(o, Outcome::Rejected { .. })),
        unknown: count(|o| matches!(o, Outcome::Unknown)),
        rejected_by_code,
        deliveries: history.deliveries.len(),
        sessions: (history.deliveries.iter())
            .map(|d| (d.device.as_str(), d.session))
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        moves: history.migrations.len(),
        delivery_lag_ms: delivery_lag(history),
    }
}

/// p50, p99 and max of the time from each acked send to its first arrival
/// on each device (see [`Summary::delivery_lag_ms`]).
pub fn delivery_lag(history: &History) -> Option<[u64; 3]> {
    let mut lags: Vec<u64> = first_arrivals(history)
        .into_iter()
        .map(|(acked, at)| at.saturating_sub(acked))
        .collect();
    lags.sort_unstable();
    // Nearest rank.
    let at = |q: f64| lags[((lags.len() as f64 * q).ceil() as usize).clamp(1, lags.len()) - 1];
    (!lags.is_empty()).then(|| [at(0.5), at(0.99), at(1.0)])
}

/// When the last acknowledged message first reached the last device that
/// was to get it (drill time).
pub fn caught_up_at(history: &History) -> Option<u64> {
    first_arrivals(history).into_iter().map(|(_, at)| at).max()
}

/// For each acknowledged send and each device that received it: when it
/// was acknowledged and when it first arrived there.
fn first_arrivals(history: &History) -> Vec<(u64, u64)> {
    let mut first: HashMap<(&str, u64, u64, u64), u64> = HashMap::new();
    for d in &history.deliveries {
        let at = first
            .entry((d.device.as_str(), d.user, d.conversation, d.seq))
            .or_insert(d.at_ms);
        *at = (*at).min(d.at_ms);
    }
    let mut out = Vec::new();
    for device in &history.devices {
        for op in &history.sends {
            let Outcome::Ok { seq, .. } = op.outcome else {
                continue;
            };
            let key = (device.device.as_str(), device.user, op.conversation, seq);
            if let Some(at) = first.get(&key) {
                out.push((op.completed_ms, *at));
            }
        }
    }
    out
}

pub fn print(summary: &Summary, verdicts: &[Verdict]) {
    println!(
        "operations: {} acked, {} rejected {:?}, {} unknown",
        summary.acked, summary.rejected, summary.rejected_by_code, summary.unknown
    );
    println!(
        "devices: {} events received over {} subscriptions",
        summary.deliveries, summary.sessions
    );
    if let Some([p50, p99, max]) = summary.delivery_lag_ms {
        println!("  from ack to device: p50 {p50} ms, p99 {p99} ms, max {max} ms");
    }
    if summary.moves > 0 {
        println!(
            "moves: {} checked against their source's copy",
            summary.moves
        );
    }
    for v in verdicts {
        println!(
            "  {:<28} {}",
            v.invariant,
            if v.holds {
                "holds".to_string()
            } else {
                format!(
                    "VIOLATED ({}): {:?}",
                    v.violations,
                    v.counterexamples.first()
                )
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{DeliveryRecord, Device, SendOp};

    fn op(conversation: u64, invoked_ms: u64, completed_ms: u64, ok: bool) -> SendOp {
        SendOp {
            conversation,
            sender: 1,
            client_req_id: format!("{conversation}-{invoked_ms}"),
            invoked_ms,
            completed_ms,
            outcome: if ok {
                Outcome::Ok { msg_id: 1, seq: 1 }
            } else {
                Outcome::Unknown
            },
        }
    }

    #[test]
    fn recovery_is_the_first_ack_and_the_longest_outage_of_the_hit_conversations() {
        let fault = Fault {
            at_ms: 1_000,
            kind: "kill".into(),
            target: "eu-west/c1".into(),
            detail: String::new(),
            affected: vec![7],
            recovered_ms: Some(1_500),
        };
        let history = History {
            sends: vec![
                op(7, 900, 950, true),
                op(7, 1_010, 3_000, false),
                op(8, 1_020, 1_030, true), // not hit by the fault
                op(7, 3_000, 3_200, true),
                op(7, 3_300, 3_310, true),
            ],
            ..History::default()
        };
        let r = recovery(&fault, &history, 4_000);
        assert_eq!(r["first_ack_after_ms"], 2_200);
        assert_eq!(r["longest_ack_gap_ms"], 2_200);
        assert_eq!(r["component_recovered_after_ms"], 500);
        let untouched = Fault {
            affected: vec![],
            ..fault
        };
        assert_eq!(recovery(&untouched, &history, 4_000)["affected"], 0);
    }

    #[test]
    fn delivery_lag_counts_each_devices_first_arrival_of_acked_sends() {
        let mut history = History {
            sends: vec![op(7, 0, 100, true), op(7, 0, 100, false)],
            ..History::default()
        };
        for (device, at) in [("phone", 130), ("laptop", 400), ("laptop", 150)] {
            history.deliveries.push(DeliveryRecord {
                tenant: 1,
                user: 2,
                device: device.into(),
                session: 1,
                pts: 1,
                conversation: 7,
                seq: 1,
                kind: 1,
                queue: 0,
                at_ms: at,
            });
            if !history.devices.iter().any(|d| d.device == device) {
                history.devices.push(Device {
                    tenant: 1,
                    user: 2,
                    device: device.into(),
                    conversations: vec![7],
                    rebases_ms: Vec::new(),
                });
            }
        }
        assert_eq!(delivery_lag(&history), Some([30, 50, 50]));
        assert_eq!(delivery_lag(&History::default()), None);
        // Caught up when the laptop first had it; its later copy is a repeat.
        assert_eq!(caught_up_at(&history), Some(150));
        assert_eq!(caught_up_at(&History::default()), None);
    }
}
