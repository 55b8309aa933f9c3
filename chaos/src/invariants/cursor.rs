//! Invariant 3 (first half): a device's cursor never moves backwards (in
//! one queue: a home failed over starts a new queue, and the device a new
//! cursor in it).

use std::collections::HashMap;

use super::Violation;
use crate::history::History;

pub const NAME: &str = "device cursors never move backwards";

pub fn check(h: &History) -> Vec<Violation> {
    let mut acks: Vec<_> = h.cursor_acks.iter().collect();
    acks.sort_by_key(|a| a.at_ms);
    let mut last: HashMap<(u64, u64, &str, u64), u64> = HashMap::new();
    let mut out = Vec::new();
    for a in acks {
        let key = (a.tenant, a.user, a.device.as_str(), a.queue);
        if let Some(before) = last.get(&key)
            && a.cursor < *before
        {
            out.push(Violation::new(
                NAME,
                format!(
                    "tenant {} user {} device {:?}: cursor went from {before} back to {} at {} ms",
                    a.tenant, a.user, a.device, a.cursor, a.at_ms
                ),
            ));
        }
        let entry = last.entry(key).or_insert(a.cursor);
        *entry = (*entry).max(a.cursor);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn a_cursor_moving_back_is_caught() {
        let mut h = good();
        let mut back = h.cursor_acks[1].clone();
        back.at_ms = 70;
        back.cursor = 1;
        h.cursor_acks.push(back);
        assert_eq!(check(&h).len(), 1);
        // Another queue (after a failover) starts over.
        h.cursor_acks.last_mut().unwrap().queue = 9;
        assert!(check(&h).is_empty());
        // Another device is independent.
        h.cursor_acks.last_mut().unwrap().queue = 0;
        h.cursor_acks.last_mut().unwrap().device = "watch".into();
        assert!(check(&h).is_empty());
        // So is the same user id and device in another tenant.
        h.cursor_acks.last_mut().unwrap().device = "phone".into();
        h.cursor_acks.last_mut().unwrap().tenant = 2;
        assert!(check(&h).is_empty());
    }
}
