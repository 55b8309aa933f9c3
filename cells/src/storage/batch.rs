//! How a commit lane turns the mutations it took into one WriteBatch: their
//! operations sorted by column family and key, then their outbox events in
//! id order.
//!
//! Key order is what a busy cell's memtables do fastest: a fan-out batch
//! writes two keys per recipient of each message (a sync event, a list
//! entry), and in key order each insert's skiplist search starts next to
//! the last one's, among nodes still in the cache (`bench storage
//! --conversations 2000 --members 50`: 4,040–4,280 sends/s in queue order,
//! 4,660–4,920 in key order). What a batch leaves behind does not change: the sort is
//! stable, so the writes to one key keep their order, and a family with a
//! range delete in the batch keeps all its writes in queue order (the
//! range covers keys other than its own).

use rocksdb::{ColumnFamily, DB, WriteBatch};

use super::keys::cf;
use super::{Mutation, Op};

/// `mutations` as one WriteBatch, their outbox events numbered from
/// `outbox_id`; returns it with the id after the last event's.
pub(super) fn write_batch(db: &DB, mutations: &[&Mutation], outbox_id: u64) -> (WriteBatch, u64) {
    let mut batch = WriteBatch::default();
    let mut family: Option<(&str, &ColumnFamily)> = None;
    for op in in_key_order(mutations) {
        let handle = match family {
            Some((name, handle)) if name == op.family() => handle,
            _ => {
                let handle = handle(db, op.family());
                family = Some((op.family(), handle));
                handle
            }
        };
        match op {
            Op::Put(_, k, v) => batch.put_cf(handle, k, v),
            Op::Delete(_, k) => batch.delete_cf(handle, k),
            Op::Merge(_, k, v) => batch.merge_cf(handle, k, v),
            Op::DeleteRange(_, from, to) => batch.delete_range_cf(handle, from, to),
        }
    }
    let outbox = handle(db, cf::OUTBOX);
    let mut id = outbox_id;
    for event in mutations.iter().flat_map(|m| &m.outbox) {
        batch.put_cf(outbox, id.to_be_bytes(), event);
        id += 1;
    }
    (batch, id)
}

fn handle<'a>(db: &'a DB, name: &str) -> &'a ColumnFamily {
    db.cf_handle(name).expect("column family exists")
}

/// The operations of `mutations` in the order they are written.
fn in_key_order<'a>(mutations: &[&'a Mutation]) -> Vec<&'a Op> {
    let mut ops: Vec<&Op> = mutations.iter().flat_map(|m| &m.ops).collect();
    let mut ranged: Vec<&str> = (ops.iter())
        .filter(|op| matches!(op, Op::DeleteRange(..)))
        .map(|op| op.family())
        .collect();
    ranged.sort_unstable();
    ranged.dedup();
    ops.sort_by(|a, b| {
        (a.family().cmp(b.family())).then_with(|| {
            if ranged.contains(&a.family()) {
                std::cmp::Ordering::Equal
            } else {
                a.key().cmp(b.key())
            }
        })
    });
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(family: &'static str, key: &[u8], value: &[u8]) -> Op {
        Op::Put(family, key.to_vec(), value.to_vec())
    }

    fn mutation(ops: Vec<Op>) -> Mutation {
        Mutation {
            ops,
            outbox: Vec::new(),
        }
    }

    /// Keys come out in order per family, and the writes to one key in
    /// the order they were queued, across mutations.
    #[test]
    fn keys_are_sorted_and_one_keys_writes_keep_their_order() {
        let first = mutation(vec![
            put(cf::SYNC, b"b", b"1"),
            put(cf::CONV_LIST, b"a", b"1"),
            Op::Delete(cf::SYNC, b"a".to_vec()),
        ]);
        let second = mutation(vec![
            put(cf::SYNC, b"a", b"2"),
            Op::Merge(cf::READ_STATE, b"z".to_vec(), b"1".to_vec()),
            put(cf::SYNC, b"b", b"2"),
            Op::Merge(cf::READ_STATE, b"z".to_vec(), b"2".to_vec()),
        ]);
        let order: Vec<String> = in_key_order(&[&first, &second])
            .into_iter()
            .map(|op| match op {
                Op::Put(f, k, v) => format!("{f} put {} {}", k[0] as char, v[0] as char),
                Op::Delete(f, k) => format!("{f} delete {}", k[0] as char),
                Op::Merge(f, k, v) => format!("{f} merge {} {}", k[0] as char, v[0] as char),
                Op::DeleteRange(..) => unreachable!(),
            })
            .collect();
        let expected = vec![
            format!("{} put a 1", cf::CONV_LIST),
            format!("{} merge z 1", cf::READ_STATE),
            format!("{} merge z 2", cf::READ_STATE),
            format!("{} delete a", cf::SYNC),
            format!("{} put a 2", cf::SYNC),
            format!("{} put b 1", cf::SYNC),
            format!("{} put b 2", cf::SYNC),
        ];
        assert_eq!(order, expected);
    }

    /// A family with a range delete keeps its writes in queue order: a put
    /// queued after the range delete must survive it.
    #[test]
    fn a_family_with_a_range_delete_keeps_queue_order() {
        let m = mutation(vec![
            put(cf::QUEUE, b"q9", b"old"),
            Op::DeleteRange(cf::QUEUE, b"q0".to_vec(), b"q9".to_vec()),
            put(cf::QUEUE, b"q1", b"new"),
            put(cf::SYNC, b"b", b"1"),
            put(cf::SYNC, b"a", b"1"),
        ]);
        let keys: Vec<(&str, &[u8])> = in_key_order(&[&m])
            .into_iter()
            .map(|op| (op.family(), op.key()))
            .collect();
        let queue: Vec<&[u8]> = (keys.iter())
            .filter(|(f, _)| *f == cf::QUEUE)
            .map(|(_, k)| *k)
            .collect();
        assert_eq!(queue, [&b"q9"[..], b"q0", b"q1"]);
        let sync: Vec<&[u8]> = (keys.iter())
            .filter(|(f, _)| *f == cf::SYNC)
            .map(|(_, k)| *k)
            .collect();
        assert_eq!(sync, [&b"a"[..], b"b"]);
    }
}
