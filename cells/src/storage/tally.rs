//! Read counts kept up to date: for a conversation asked about, a tally of
//! who is a member and how far each user has read, built once from a walk
//! of its member and read-state keys and then changed by every durable
//! batch (both commit lanes report their ops here after the write, as they
//! do to [`super::changes`]). `ReadCount` on a large group then answers
//! from memory, exact as of the last durable write, instead of walking a
//! hundred thousand members.
//!
//! A tally mirrors the two column families key by key: a member key set or
//! deleted, a read position raised (the column family merges by maximum).
//! Ops applied twice leave it as once, so a build registers the
//! conversation *before* its walk's snapshot, collects the ops noted
//! meanwhile, and replays them on the walked state: an op both in the
//! snapshot and collected is applied twice, none is missed. A range delete
//! over a conversation (its history dropped after a move) forgets the
//! tally; the next question walks again.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use cellmesh_proto::ids::{ConversationId, UserId};

use super::Op;
use super::keys::{self, cf};

/// Conversations whose tallies are kept at once (a tally of 100,000 users
/// takes a few megabytes); the one asked least recently makes room.
pub const MAX_KEPT: usize = 64;

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

    fn apply(&mut self, op: &Touch) {
        match *op {
            Touch::Member(user, member) => self.change(user, |s| s.member = member),
            Touch::Raise(user, seq) => self.change(user, |s| s.read = s.read.max(seq)),
            Touch::Set(user, seq) => self.change(user, |s| s.read = seq),
            Touch::Forget => {}
        }
    }
}

/// One op on a conversation's member or read-state keys.
#[derive(Debug, Clone, Copy)]
enum Touch {
    Member(UserId, bool),
    Raise(UserId, u64),
    Set(UserId, u64),
    /// A range delete: the tally is no longer known.
    Forget,
}

/// The conversation an op touches and how, if it is one a tally mirrors.
fn touch(op: &Op) -> Option<(ConversationId, Touch)> {
    let (name, key) = match op {
        Op::Put(name, key, _) | Op::Delete(name, key) | Op::Merge(name, key, _) => (*name, key),
        Op::DeleteRange(name, from, _) if *name == cf::MEMBERS || *name == cf::READ_STATE => {
            return Some((ConversationId(keys::first_u64(from)?), Touch::Forget));
        }
        Op::DeleteRange(..) => return None,
    };
    if name != cf::MEMBERS && name != cf::READ_STATE {
        return None;
    }
    let conversation = ConversationId(keys::first_u64(key)?);
    let user = UserId(keys::last_u64(key)?);
    let seq = |v: &[u8]| keys::decode_u64(v).unwrap_or(0);
    let touch = match (name == cf::MEMBERS, op) {
        (true, Op::Delete(..)) => Touch::Member(user, false),
        (true, _) => Touch::Member(user, true),
        (false, Op::Merge(_, _, v)) => Touch::Raise(user, seq(v)),
        (false, Op::Put(_, _, v)) => Touch::Set(user, seq(v)),
        (false, _) => Touch::Set(user, 0),
    };
    Some((conversation, touch))
}

enum Slot {
    /// A walk is under way; the ops noted since it registered.
    Building {
        noted: Vec<Touch>,
        forgotten: bool,
    },
    Kept {
        tally: Tally,
        asked: Instant,
    },
}

/// The tallies of one store.
#[derive(Default)]
pub struct ReadTallies {
    /// Whether any slot exists: the commit lanes skip their ops otherwise.
    active: AtomicBool,
    slots: Mutex<HashMap<ConversationId, Slot>>,
    /// Signalled when a build ends.
    built: Condvar,
}

/// A build under way, from [`ReadTallies::begin`]; dropped unfinished, it
/// lets the next caller build.
pub struct Building<'a> {
    tallies: &'a ReadTallies,
    conversation: ConversationId,
    done: bool,
}

impl ReadTallies {
    fn lock(&self) -> MutexGuard<'_, HashMap<ConversationId, Slot>> {
        self.slots.lock().expect("read tallies")
    }

    /// Counts from a kept tally (and the member count), waiting for a
    /// build under way; `None` when there is none: [`begin`](Self::begin)
    /// one.
    pub fn counts(&self, conversation: ConversationId, seqs: &[u64]) -> Option<(Vec<u32>, u32)> {
        self.counted(conversation, seqs, true)
    }

    /// Counts from a kept tally, without waiting for a build.
    pub fn kept_counts(
        &self,
        conversation: ConversationId,
        seqs: &[u64],
    ) -> Option<(Vec<u32>, u32)> {
        self.counted(conversation, seqs, false)
    }

    fn counted(
        &self,
        conversation: ConversationId,
        seqs: &[u64],
        wait: bool,
    ) -> Option<(Vec<u32>, u32)> {
        let mut slots = self.lock();
        loop {
            match slots.get_mut(&conversation) {
                None => return None,
                Some(Slot::Kept { tally, asked }) => {
                    *asked = Instant::now();
                    return Some((tally.counts(seqs), tally.members()));
                }
                Some(Slot::Building { .. }) if !wait => return None,
                Some(Slot::Building { .. }) => {
                    slots = self.built.wait(slots).expect("read tallies");
                }
            }
        }
    }

    /// Registers a build of `conversation`'s tally; its walk must start
    /// after this returns. `None`: another build or tally came first.
    pub fn begin(&self, conversation: ConversationId) -> Option<Building<'_>> {
        let mut slots = self.lock();
        if slots.contains_key(&conversation) {
            return None;
        }
        slots.insert(
            conversation,
            Slot::Building {
                noted: Vec::new(),
                forgotten: false,
            },
        );
        self.active.store(true, Ordering::Release);
        Some(Building {
            tallies: self,
            conversation,
            done: false,
        })
    }

    /// Called by the commit lanes with every durable batch's ops.
    pub(super) fn note<'a>(&self, ops: impl Iterator<Item = &'a Op>) {
        if !self.active.load(Ordering::Acquire) {
            return;
        }
        let mut slots: Option<MutexGuard<'_, _>> = None;
        for (conversation, touch) in ops.filter_map(touch) {
            let slots = slots.get_or_insert_with(|| self.lock());
            match (slots.get_mut(&conversation), touch) {
                (None, _) => {}
                (Some(Slot::Building { forgotten, .. }), Touch::Forget) => *forgotten = true,
                (Some(Slot::Building { noted, .. }), touch) => noted.push(touch),
                (Some(Slot::Kept { .. }), Touch::Forget) => {
                    slots.remove(&conversation);
                }
                (Some(Slot::Kept { tally, .. }), touch) => tally.apply(&touch),
            }
        }
        if let Some(slots) = slots {
            self.active.store(!slots.is_empty(), Ordering::Release);
        }
    }

    /// Tallies kept now.
    pub fn kept(&self) -> usize {
        let slots = self.lock();
        slots
            .values()
            .filter(|s| matches!(s, Slot::Kept { .. }))
            .count()
    }
}

impl Building<'_> {
    /// Replays the ops noted during the walk on `walked` and, if `keep`
    /// (and no range delete came meanwhile), keeps it for later questions.
    /// Returns the counts for `seqs` and the member count.
    pub fn finish(mut self, mut walked: Tally, keep: bool, seqs: &[u64]) -> (Vec<u32>, u32) {
        let tallies = self.tallies;
        let mut slots = tallies.lock();
        let Some(Slot::Building { noted, forgotten }) = slots.remove(&self.conversation) else {
            unreachable!("a build's slot is its own until it ends");
        };
        for touch in &noted {
            walked.apply(touch);
        }
        let answer = (walked.counts(seqs), walked.members());
        if keep && !forgotten {
            if slots.len() >= MAX_KEPT {
                evict_least_asked(&mut slots);
            }
            let kept = Slot::Kept {
                tally: walked,
                asked: Instant::now(),
            };
            slots.insert(self.conversation, kept);
        }
        tallies.active.store(!slots.is_empty(), Ordering::Release);
        self.done = true;
        drop(slots);
        tallies.built.notify_all();
        answer
    }
}

impl Drop for Building<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut slots = self.tallies.lock();
        slots.remove(&self.conversation);
        self.tallies
            .active
            .store(!slots.is_empty(), Ordering::Release);
        drop(slots);
        self.tallies.built.notify_all();
    }
}

fn evict_least_asked(slots: &mut HashMap<ConversationId, Slot>) {
    let oldest = slots
        .iter()
        .filter_map(|(c, s)| match s {
            Slot::Kept { asked, .. } => Some((*asked, *c)),
            Slot::Building { .. } => None,
        })
        .min();
    if let Some((_, conversation)) = oldest {
        slots.remove(&conversation);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(build.finish(walked, true, &[4, 5]), (vec![2, 1], 3));
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
        build.finish(Tally::default(), true, &[1]);
        assert_eq!(tallies.kept(), 0, "forgotten during its build");

        let build = tallies.begin(C).unwrap();
        build.finish(Tally::default(), true, &[1]);
        assert_eq!(tallies.kept(), 1);
        tallies.note([Op::DeleteRange(cf::READ_STATE, from, to)].iter());
        assert_eq!(tallies.counts(C, &[1]), None);

        tallies
            .begin(C)
            .unwrap()
            .finish(Tally::default(), false, &[1]);
        drop(tallies.begin(C).unwrap());
        assert_eq!(tallies.counts(C, &[1]), None, "nothing kept");
        assert!(!tallies.active.load(Ordering::Acquire));
    }

    #[test]
    fn the_least_recently_asked_makes_room() {
        let tallies = ReadTallies::default();
        for c in 0..MAX_KEPT as u64 + 1 {
            tallies
                .begin(ConversationId(c))
                .unwrap()
                .finish(Tally::default(), true, &[1]);
            // Conversation 0 stays the most recently asked.
            tallies.counts(ConversationId(0), &[1]);
        }
        assert_eq!(tallies.kept(), MAX_KEPT);
        assert!(tallies.counts(ConversationId(0), &[1]).is_some());
        let least = tallies.counts(ConversationId(1), &[1]);
        assert!(least.is_none(), "asked least recently");
    }
}
