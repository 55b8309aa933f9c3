//! Invariant 4: after a migration the target's history begins with exactly
//! the source's history (same seqs, same messages), and the source accepts
//! no write after the switch. A source that took the conversation over in a
//! failover and had not yet backfilled what the failed cell acknowledged
//! holds its history from its floor on: the target is compared from the
//! source's first seq (what lies below is the backfill's, and every
//! acknowledged message being stored somewhere is invariant 1's).

use super::Violation;
use crate::history::History;

pub const NAME: &str = "migration keeps the history prefix; the source stops writing";

pub fn check(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    for m in &h.migrations {
        let n = m.source_history.len();
        let first = m.source_history.first().map_or(0, |s| s.seq);
        let target = &m.target_history[m.target_history.partition_point(|t| t.seq < first)..];
        if target.len() < n || target[..n] != m.source_history[..] {
            let differs = m
                .source_history
                .iter()
                .zip(target)
                .position(|(a, b)| a != b)
                .unwrap_or(target.len().min(n));
            out.push(Violation::new(
                NAME,
                format!(
                    "conversation {} moved {} → {}: target differs from the source at position {differs} ({} source messages from seq {first}, {} on the target)",
                    m.conversation,
                    m.source,
                    m.target,
                    n,
                    m.target_history.len()
                ),
            ));
        }
        for w in &h.accepted {
            if w.conversation == m.conversation && w.cell == m.source && w.at_ms > m.switch_ms {
                out.push(Violation::new(
                    NAME,
                    format!(
                        "conversation {}: source {} accepted seq {} at {} ms, after the switch at {} ms",
                        m.conversation, m.source, w.seq, w.at_ms, m.switch_ms
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
    use crate::history::Migration;

    fn moved(h: &History) -> Migration {
        let source = h.conversations[&7].clone();
        let mut target = source.clone();
        target.push(stored("d", 4));
        Migration {
            conversation: 7,
            source: "eu/c1".into(),
            target: "eu/c2".into(),
            switch_ms: 100,
            source_history: source,
            target_history: target,
        }
    }

    #[test]
    fn a_faithful_migration_holds() {
        let mut h = good();
        h.migrations.push(moved(&h));
        assert!(check(&h).is_empty());
    }

    #[test]
    fn a_target_missing_or_altering_a_message_is_caught() {
        let mut h = good();
        let mut m = moved(&h);
        m.target_history.remove(1);
        h.migrations.push(m);
        let v = check(&h);
        assert_eq!(v.len(), 1);
        assert!(v[0].detail.contains("position 1"));
    }

    #[test]
    fn a_source_copy_from_its_failover_floor_is_compared_from_there() {
        let mut h = good();
        let mut m = moved(&h);
        // The source holds the history from its second message on.
        m.source_history.remove(0);
        h.migrations.push(m.clone());
        assert!(check(&h).is_empty(), "{:?}", check(&h));
        // What it does hold must still match.
        m.target_history.remove(1);
        h.migrations = vec![m];
        assert!(
            check(&h)[0].detail.contains("position 0"),
            "{:?}",
            check(&h)
        );
    }

    #[test]
    fn a_source_write_after_the_switch_is_caught() {
        let mut h = good();
        h.migrations.push(moved(&h));
        let mut late = h.accepted[0].clone();
        late.at_ms = 150;
        h.accepted.push(late);
        assert_eq!(check(&h).len(), 1);
    }
}
