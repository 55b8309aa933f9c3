//! Read receipts as counts: a conversation's members and read positions,
//! found by walking its member keys and its read-state keys side by side
//! (both are conversation | user, in the same order) in one snapshot, and
//! kept up afterwards for a large group (see [`super::tally`]).

use cellmesh_proto::ids::{ConversationId, UserId};
use rocksdb::{Direction, IteratorMode, ReadOptions};

use super::tally::Tally;
use super::{Result, Store, cf, corrupt, keys};

impl Store {
    /// For each of `seqs`, how many current members of `conversation` have
    /// read it, and how many members it has. From the kept tally when
    /// there is one; otherwise walked, and kept if the conversation has at
    /// least `keep_from` members. Blocks (a walk of 100,000 members takes
    /// tens of milliseconds, and a caller may wait for another's walk).
    pub fn read_counts(
        &self,
        conversation: ConversationId,
        seqs: &[u64],
        keep_from: u32,
    ) -> Result<(Vec<u32>, u32)> {
        let tallies = self.read_tallies();
        loop {
            if let Some(counted) = tallies.counts(conversation, seqs) {
                return Ok(counted);
            }
            // Registered before the walk's snapshot is taken.
            if let Some(build) = tallies.begin(conversation) {
                let walked = self.walk_read_state(conversation)?;
                let keep = walked.members() >= keep_from;
                return Ok(build.finish(walked, keep, |t| t.answer(seqs)));
            }
        }
    }

    /// Every user with a member key or a read position in `conversation`.
    fn walk_read_state(&self, conversation: ConversationId) -> Result<Tally> {
        let lower = keys::member(conversation, UserId(0));
        let upper = keys::member(conversation, UserId(u64::MAX));
        let snapshot = self.db.snapshot();
        let walk = |name: &'static str| {
            let mut opts = ReadOptions::default();
            opts.set_iterate_upper_bound(upper.to_vec());
            opts.set_snapshot(&snapshot);
            self.db
                .iterator_cf_opt(
                    self.cf(name),
                    opts,
                    IteratorMode::From(&lower, Direction::Forward),
                )
                .map(move |item| -> Result<(UserId, Box<[u8]>)> {
                    let (key, value) = item?;
                    let user = keys::last_u64(&key).ok_or_else(|| corrupt(name, "short key"))?;
                    Ok((UserId(user), value))
                })
        };
        let members = walk(cf::MEMBERS)
            .map(|item| item.map(|(user, _)| user))
            .collect::<Result<Vec<UserId>>>()?;
        let reads = walk(cf::READ_STATE)
            .map(|item| {
                let (user, value) = item?;
                let read = keys::decode_u64(&value)
                    .ok_or_else(|| corrupt(cf::READ_STATE, "bad length"))?;
                Ok((user, read))
            })
            .collect::<Result<Vec<(UserId, u64)>>>()?;
        Ok(Tally::walked(&members, &reads))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use cellmesh_proto::storage::v1::MemberRecord;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    use super::super::Mutation;
    use super::super::testing::{commit_racing, store};
    use super::*;

    const C: ConversationId = ConversationId(42);
    const SEQS: [u64; 6] = [0, 1, 10, 25, 40, 50];

    /// A random join, leave or read by one of 200 users, through either
    /// commit lane.
    async fn random_change(store: &Store, rng: &mut StdRng) {
        let user = UserId(rng.random_range(1..=200));
        let mut m = Mutation::new();
        match rng.random_range(0..4) {
            0 => m.put_member(C, user, &MemberRecord::default()),
            1 => m.delete_member(C, user),
            _ => m.raise_read_seq(C, user, rng.random_range(0..=50)),
        }
        if rng.random_bool(0.5) {
            store.commit(m).await.unwrap();
        } else {
            store.commit_fan_out(m).await.unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kept_counts_equal_a_fresh_walk_through_concurrent_changes() {
        let (_dir, store) = store();
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..2_000 {
            random_change(&store, &mut rng).await;
        }
        // Writers on both lanes while the tally is built and afterwards.
        let writers: Vec<_> = (0..4)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    let mut rng = StdRng::seed_from_u64(100 + i);
                    for _ in 0..1_500 {
                        random_change(&store, &mut rng).await;
                    }
                })
            })
            .collect();
        let mut kept_during = 0;
        for _ in 0..20 {
            let asked = store.clone();
            let (_, members) =
                tokio::task::spawn_blocking(move || asked.read_counts(C, &SEQS, 1).unwrap())
                    .await
                    .unwrap();
            kept_during += usize::from(members > 0 && store.read_tallies().kept() == 1);
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        for writer in writers {
            writer.await.unwrap();
        }
        assert!(kept_during > 0, "the tally was kept while writers ran");
        let fresh = store.walk_read_state(C).unwrap();
        let kept = store.read_tallies().kept_counts(C, &SEQS);
        assert_eq!(kept, Some((fresh.counts(&SEQS), fresh.members())));
        assert!(fresh.members() > 0 && fresh.counts(&[25])[0] > 0);
    }

    /// One lane joins a user while the other removes them, over and over:
    /// whichever RocksDB wrote last, the kept tally agrees with storage.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_join_and_a_leave_racing_in_both_lanes_leave_the_tally_as_stored() {
        let (_dir, store) = store();
        let user = UserId(3);
        let asked = store.clone();
        tokio::task::spawn_blocking(move || asked.read_counts(C, &SEQS, 0).unwrap())
            .await
            .unwrap();
        for round in 0..300 {
            let (mut join, mut leave) = (Mutation::new(), Mutation::new());
            join.put_member(C, user, &MemberRecord::default());
            leave.delete_member(C, user);
            commit_racing(&store, join, leave, round).await;
            let stored = store.is_member(C, user).unwrap();
            let kept = store.read_tallies().kept_counts(C, &[0]);
            assert_eq!(
                kept,
                Some((vec![u32::from(stored)], u32::from(stored))),
                "round {round}"
            );
        }
    }

    #[tokio::test]
    async fn a_small_conversation_is_walked_each_time() {
        let (_dir, store) = store();
        let mut m = Mutation::new();
        for user in 1..=3 {
            m.put_member(C, UserId(user), &MemberRecord::default());
            m.raise_read_seq(C, UserId(user), user);
        }
        // A read position left by a former member does not count.
        m.raise_read_seq(C, UserId(9), 3);
        store.commit(m).await.unwrap();
        let store = Arc::clone(&store);
        assert_eq!(
            store.read_counts(C, &[1, 3, 4], 4).unwrap(),
            (vec![3, 1, 0], 3)
        );
        assert_eq!(store.read_tallies().kept(), 0);
        assert_eq!(store.read_counts(C, &[2], 3).unwrap(), (vec![2], 3));
        assert_eq!(
            store.read_tallies().kept(),
            1,
            "three members, kept from three"
        );
    }
}
