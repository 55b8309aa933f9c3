//! Invariant 5: no two cells accept writes for the same conversation at
//! the same route epoch.

use std::collections::{BTreeSet, HashMap};

use super::Violation;
use crate::history::History;

pub const NAME: &str = "one writer per conversation and epoch";

pub fn check(h: &History) -> Vec<Violation> {
    let mut cells: HashMap<(u64, u64), BTreeSet<&str>> = HashMap::new();
    for w in &h.accepted {
        cells
            .entry((w.conversation, w.epoch))
            .or_default()
            .insert(w.cell.as_str());
    }
    let mut out: Vec<Violation> = cells
        .into_iter()
        .filter(|(_, cells)| cells.len() > 1)
        .map(|((conv, epoch), cells)| {
            Violation::new(
                NAME,
                format!("conversation {conv} epoch {epoch}: writes accepted by {cells:?}"),
            )
        })
        .collect();
    out.sort_by(|a, b| a.detail.cmp(&b.detail));
    out
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn two_cells_writing_at_one_epoch_is_caught() {
        let mut h = good();
        let mut other = h.accepted[0].clone();
        other.cell = "eu/c2".into();
        h.accepted.push(other.clone());
        assert_eq!(check(&h).len(), 1);
        // At a new epoch (after a failover) the other cell may write.
        let mut h = good();
        other.epoch = 2;
        h.accepted.push(other);
        assert!(check(&h).is_empty());
    }
}
