//! Read counts kept up to date (a [`Mirror`] of a conversation's member
//! and read-state keys): for a conversation asked about, a tally of who is
//! a member and how far each user has read, walked once and then changed
//! by every durable batch. `ReadCount` on a large group then answers from
//! memory, exact as of the last durable write, instead of walking a
//! hundred thousand members. A member key set or deleted, a read position
//! raised (the column family merges by maximum): each applied twice leaves
//! the tally as once, as a build's replay needs.

use std::collections::{BTreeMap, HashMap};

use cellmesh_proto::ids::{ConversationId, UserId};

use super::Op;
use super::keys::{self, cf};
use super::mirror::{Mirror, Mirrors};

/// What the tallies know of one user in one conversation.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UserRead {
    pub member: bool,
    pub read: u64,
}

/// One conversation's members and read positions.
#[derive(Debug, Default)]
pub struct Tally {
    users: HashMap<UserId, UserRead>,
    /// Members per read position.
    positions: BTreeMap<u64, u32>,
    members: u32,
}

impl Tally {
    /// A tally of `users` (user id, what is stored for them).
    #[cfg(test)]
    fn new(users: impl IntoIterator<Item = (u64, UserRead)>) -> Self {
        let mut tally = Self::default();
        for (user, state) in users {
            tally.change(UserId(user), |s| *s = state);
        }
        tally
    }

    /// A tally of what a walk found: the member keys' users, and each
    /// read-state key's user and position.
    pub fn walked(members: &[UserId], reads: &[(UserId, u64)]) -> Self {
        let mut tally = Self::default();
        for user in members {
            tally.change(*user, |s| s.member = true);
        }
        for (user, read) in reads {
            tally.change(*user, |s| s.read = *read);
        }
        tally
    }

    pub fn members(&self) -> u32 {
        self.members
    }

    /// For each of `seqs`, how many members have read it.
    pub fn counts(&self, seqs: &[u64]) -> Vec<u32> {
        let mut order: Vec<usize> = (0..seqs.len()).collect();
        order.sort_unstable_by(|a, b| seqs[*b].cmp(&seqs[*a]));
        // One walk down the positions, highest seq first.
        let mut counts = vec![0; seqs.len()];
        let mut above = self.positions.iter().rev().peekable();
        let mut read = 0;
        for i in order {
            while let Some((_, n)) = above.next_if(|(p, _)| **p >= seqs[i]) {
                read += n;
            }
            counts[i] = read;
        }
        counts
    }

    fn change(&mut self, user: UserId, f: impl FnOnce(&mut UserRead)) {
        let state = self.users.entry(user).or_default();
        let before = *state;
        f(state);
        let after = *state;
        if after == UserRead::default() {
            self.users.remove(&user);
        }
        if before.member {
            self.members -= 1;
            if let Some(n) = self.positions.get_mut(&before.read) {
                *n -= 1;
                if *n == 0 {
                    self.positions.remove(&before.read);
                }
            }
        }
        if after.member {
            self.members += 1;
            *self.positions.entry(after.read).or_default() += 1;
        }
    }

    /// The counts for `seqs` and the member count.
    pub fn answer(&self, seqs: &[u64]) -> (Vec<u32>, u32) {
        (self.counts(seqs), self.members())
    }
}

/// One op on a conversation's member or read-state keys.
#[derive(Debug, Clone, Copy)]
pub enum Touch {
    Member(UserId, bool),
    Raise(UserId, u64),
    Set(UserId, u64),
}

impl Mirror for Tally {
    type Touch = Touch;

    fn mirrors(name: &str) -> bool {
        name == cf::MEMBERS || name == cf::READ_STATE
    }

    fn touch(op: &Op) -> Option<Touch> {
        let (name, key) = match op {
            Op::Put(name, key, _) | Op::Delete(name, key) | Op::Merge(name, key, _) => (*name, key),
            Op::DeleteRange(..) => return None,
        };
        let user = UserId(keys::last_u64(key)?);
        let seq = |v: &[u8]| keys::decode_u64(v).unwrap_or(0);
        Some(match (name == cf::MEMBERS, op) {
            (true, Op::Delete(..)) => Touch::Member(user, false),
            (true, _) => Touch::Member(user, true),
            (false, Op::Merge(_, _, v)) => Touch::Raise(user, seq(v)),
            (false, Op::Put(_, _, v)) => Touch::Set(user, seq(v)),
            (false, _) => Touch::Set(user, 0),
        })
    }

    fn apply(&mut self, op: &Touch) {
        match *op {
            Touch::Member(user, member) => self.change(user, |s| s.member = member),
            Touch::Raise(user, seq) => self.change(user, |s| s.read = s.read.max(seq)),
            Touch::Set(user, seq) => self.change(user, |s| s.read = seq),
        }
    }
}

/// The tallies of one store.
pub(crate) type ReadTallies = Mirrors<Tally>;

impl Mirrors<Tally> {
    /// Counts from a kept tally (and the member count), waiting for a
    /// build under way; `None` when there is none: [`begin`](Self::begin)
    /// one.
    pub fn counts(&self, conversation: ConversationId, seqs: &[u64]) -> Option<(Vec<u32>, u32)> {
        self.read(conversation, true, |t| t.answer(seqs))
    }

    /// Counts from a kept tally, without waiting for a build.
    pub fn kept_counts(
        &self,
        conversation: ConversationId,
        seqs: &[u64],
    ) -> Option<(Vec<u32>, u32)> {
        self.read(conversation, false, |t| t.answer(seqs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::mirror::MAX_KEPT;

    const C: ConversationId = ConversationId(7);

    fn member(user: u64, add: bool) -> Op {
        let key = keys::member(C, UserId(user)).to_vec();
        if add {
            Op::Put(cf::MEMBERS, key, Vec::new())
        } else {
            Op::Delete(cf::MEMBERS, key)
        }
    }

    fn raise(user: u64, seq: u64) -> Op {
        let key = keys::member(C, UserId(user)).to_vec();
        Op::Merge(cf::READ_STATE, key, seq.to_be_bytes().to_vec())
    }

    fn user(member: bool, read: u64) -> UserRead {
        UserRead { member, read }
    }

    #[test]
    fn counts_members_at_or_above_each_seq() {
        let tally = Tally::new([
            (1, user(true, 0)),
            (2, user(true, 3)),
            (3, user(true, 3)),
            (4, user(true, 7)),
            (5, user(true, 9)),
            (6, user(false, 9)),
        ]);
        assert_eq!(tally.members(), 5);
        assert_eq!(
            tally.counts(&[0, 1, 3, 4, 9, 10, 3]),
            vec![5, 4, 4, 2, 1, 0, 4]
        );
        assert_eq!(Tally::default().counts(&[1]), vec![0]);
    }

    #[test]
    fn a_kept_tally_follows_reads_joins_and_leaves() {
        let tallies = ReadTallies::default();
        let build = tallies.begin(C).unwrap();
        assert!(tallies.begin(C).is_none(), "one build at a time");
        // Noted during the walk: 2 reads to 4 (already in the walk's
        // snapshot too), 3 joins.
        tallies.note([raise(2, 4), member(3, true)].iter());
        let walked = Tally::new([(1, user(true, 5)), (2, user(true, 4))]);
        assert_eq!(
            build.finish(walked, true, |t| t.answer(&[4, 5])),
            (vec![2, 1], 3)
        );
        assert_eq!(tallies.kept(), 1);

        // A leaver's reads stop counting; a member's reads only go up.
        tallies.note([member(1, false), raise(2, 6), raise(2, 2)].iter());
        assert_eq!(tallies.counts(C, &[1, 6]), Some((vec![1, 1], 2)));
        // Coming back, its read state counts again.
        tallies.note([member(1, true)].iter());
        assert_eq!(tallies.counts(C, &[5]), Some((vec![2], 3)));
        // Another conversation's keys change nothing here.
        let other = keys::member(ConversationId(8), UserId(3)).to_vec();
        tallies.note(
            [Op::Merge(
                cf::READ_STATE,
                other,
                9u64.to_be_bytes().to_vec(),
            )]
            .iter(),
        );
        assert_eq!(tallies.counts(C, &[9]), Some((vec![0], 3)));
    }

    #[test]
    fn a_range_delete_forgets_and_an_unkept_build_leaves_nothing() {
        let tallies = ReadTallies::default();
        let build = tallies.begin(C).unwrap();
        let (from, to) = keys::prefixed_by(C.get());
        tallies.note([Op::DeleteRange(cf::READ_STATE, from.clone(), to.clone())].iter());
        build.finish(Tally::default(), true, |_| ());
        assert_eq!(tallies.kept(), 0, "forgotten during its build");

        let build = tallies.begin(C).unwrap();
        build.finish(Tally::default(), true, |_| ());
        assert_eq!(tallies.kept(), 1);
        tallies.note([Op::DeleteRange(cf::READ_STATE, from, to)].iter());
        assert_eq!(tallies.counts(C, &[1]), None);

        tallies
            .begin(C)
            .unwrap()
            .finish(Tally::default(), false, |_| ());
        drop(tallies.begin(C).unwrap());
        assert_eq!(tallies.counts(C, &[1]), None, "nothing kept");
        assert!(!tallies.has(C));
    }

    #[test]
    fn the_least_recently_asked_makes_room() {
        let tallies = ReadTallies::default();
        for c in 0..MAX_KEPT as u64 + 1 {
            tallies
                .begin(ConversationId(c))
                .unwrap()
                .finish(Tally::default(), true, |_| ());
            // Conversation 0 stays the most recently asked.
            tallies.counts(ConversationId(0), &[1]);
        }
        assert_eq!(tallies.kept(), MAX_KEPT);
        assert!(tallies.counts(ConversationId(0), &[1]).is_some());
        let least = tallies.counts(ConversationId(1), &[1]);
        assert!(least.is_none(), "asked least recently");
    }
}
