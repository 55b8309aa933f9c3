//! The order in which a group commit hands its writes to RocksDB. A batch
//! joins many mutations (a fan-out batch: dozens of sends, each writing a
//! sync event and a list entry per member), so its keys arrive scattered
//! over each family. Written sorted by family and key, with the commit
//! asking RocksDB to keep each memtable's last insert position through the
//! batch, every insert starts next to the one before instead of searching
//! the memtable from its top — and that holds when both lanes write at
//! once, when RocksDB inserts their batches concurrently and the per-prefix
//! insert hints of `options.rs` do not apply.
//!
//! What is written does not change: the sort is stable, so the writes to
//! any one key keep their order, and writes to different keys commute. A
//! batch that deletes a range is written as queued: a range covers keys
//! other than its own, which a sort by key could move to either side of it.

use rocksdb::{ColumnFamily, WriteBatch};

use super::Op;

/// Fills `batch` with the writes of `mutations` (each its ops and outbox
/// events, in queued order): the ops in key order unless a range is
/// deleted, the outbox events under consecutive ids from
/// `next_outbox_id`. Returns the id after the last.
pub(super) fn fill<'a>(
    batch: &mut WriteBatch,
    mutations: impl Iterator<Item = (&'a [Op], &'a [Vec<u8>])> + Clone,
    handle: impl Fn(&'static str) -> &'a ColumnFamily,
    outbox: &'a ColumnFamily,
    mut next_outbox_id: u64,
) -> u64 {
    let ops = mutations.clone().flat_map(|(ops, _)| ops);
    if ops.clone().any(|op| matches!(op, Op::DeleteRange(..))) {
        for (ops, events) in mutations {
            ops.iter().for_each(|op| write(batch, op, &handle));
            for event in events {
                batch.put_cf(outbox, next_outbox_id.to_be_bytes(), event);
                next_outbox_id += 1;
            }
        }
        return next_outbox_id;
    }
    for op in in_key_order(ops) {
        write(batch, op, &handle);
    }
    // Fresh ids, above every key written so far: no other write in the
    // batch touches them.
    for event in mutations.flat_map(|(_, events)| events) {
        batch.put_cf(outbox, next_outbox_id.to_be_bytes(), event);
        next_outbox_id += 1;
    }
    next_outbox_id
}

fn write<'a>(batch: &mut WriteBatch, op: &Op, handle: &impl Fn(&'static str) -> &'a ColumnFamily) {
    match op {
        Op::Put(name, k, v) => batch.put_cf(handle(name), k, v),
        Op::Delete(name, k) => batch.delete_cf(handle(name), k),
        Op::Merge(name, k, v) => batch.merge_cf(handle(name), k, v),
        Op::DeleteRange(name, from, to) => batch.delete_range_cf(handle(name), from, to),
    }
}

/// `ops` sorted by family and key, the writes to one key in their order.
fn in_key_order<'a>(ops: impl Iterator<Item = &'a Op>) -> Vec<&'a Op> {
    let mut ops: Vec<&Op> = ops.collect();
    ops.sort_by(|a, b| (a.family(), a.key()).cmp(&(b.family(), b.key())));
    ops
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rand::{Rng, SeedableRng};

    use super::super::keys::cf;
    use super::super::testing::store;
    use super::super::{Mutation, Store};
    use super::*;

    type Model = BTreeMap<(&'static str, Vec<u8>), Vec<u8>>;

    fn apply<'a>(model: &mut Model, ops: impl IntoIterator<Item = &'a Op>) {
        for op in ops {
            match op {
                Op::Put(name, k, v) => {
                    model.insert((name, k.clone()), v.clone());
                }
                Op::Delete(name, k) => {
                    model.remove(&(*name, k.clone()));
                }
                other => panic!("not modelled: {other:?}"),
            }
        }
    }

    #[test]
    fn sorted_writes_leave_what_the_queued_order_leaves() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for round in 0..200 {
            let ops: Vec<Op> = (0..rng.random_range(1..60))
                .map(|_| {
                    let name = [cf::META, cf::SYNC][rng.random_range(0..2)];
                    let key = vec![rng.random_range(0..6u8)];
                    match rng.random_range(0..3) {
                        0 => Op::Delete(name, key),
                        _ => Op::Put(name, key, vec![rng.random()]),
                    }
                })
                .collect();
            let sorted = in_key_order(ops.iter());
            let keys: Vec<_> = sorted.iter().map(|op| (op.family(), op.key())).collect();
            assert!(keys.is_sorted(), "round {round}: not in key order");
            let (mut queued, mut written) = (Model::new(), Model::new());
            apply(&mut queued, &ops);
            apply(&mut written, sorted);
            assert_eq!(queued, written, "round {round}");
        }
    }

    fn raw(store: &Store, key: &[u8]) -> Option<Vec<u8>> {
        store.db.get_cf(store.cf(cf::META), key).unwrap()
    }

    #[tokio::test]
    async fn one_batch_keeps_each_keys_last_write_and_a_range_its_place() {
        let (_dir, store) = store();
        let ops = |ops: Vec<Op>| {
            let mut m = Mutation::new();
            m.ops = ops;
            m
        };
        let put = |k: &[u8], v: &[u8]| Op::Put(cf::META, k.to_vec(), v.to_vec());
        // Later writes of a key win, whatever keys come between.
        store
            .commit(ops(vec![
                put(b"k", b"1"),
                put(b"j", b"x"),
                put(b"a", b"y"),
                put(b"k", b"2"),
                Op::Delete(cf::META, b"j".to_vec()),
            ]))
            .await
            .unwrap();
        assert_eq!(raw(&store, b"k").as_deref(), Some(&b"2"[..]));
        assert_eq!(raw(&store, b"j"), None);
        assert_eq!(raw(&store, b"a").as_deref(), Some(&b"y"[..]));
        // A range deletes what was written before it, not what comes after,
        // though both sort after the range's start.
        store
            .commit(ops(vec![
                put(b"m2", b"before"),
                Op::DeleteRange(cf::META, b"m1".to_vec(), b"m9".to_vec()),
                put(b"m3", b"after"),
            ]))
            .await
            .unwrap();
        assert_eq!(raw(&store, b"m2"), None);
        assert_eq!(raw(&store, b"m3").as_deref(), Some(&b"after"[..]));
    }
}
