//! Per-conversation views of stored keys kept up to date by every commit:
//! a view is built once from a walk of its conversation's keys, then both
//! commit lanes report every durable batch's ops here, after the write and
//! before the writers hear it is durable (as they do to
//! [`super::changes`]), and each op on a mirrored column family changes
//! the view of its conversation. Keys a view applies in order (member
//! keys, message rows) are written by one lane only (`ONE_LANE` in the
//! store), so their notes come in the order RocksDB wrote them. A view
//! then answers from memory, exact as of the last durable write. The views: read counts ([`super::tally`])
//! and a large group's newest messages ([`super::screen`]).
//!
//! A view applies an op twice as once (a key set or deleted, a read
//! position raised), so a build registers the conversation *before* its
//! walk's snapshot, collects the ops noted meanwhile, and replays them on
//! the walked state: an op both in the snapshot and collected is applied
//! twice, none is missed. A range delete over a conversation's keys (its
//! history dropped after a move) forgets its view; the next question walks
//! again. At most [`MAX_KEPT`] views of a kind are kept; the one asked
//! least recently makes room.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use cellmesh_proto::ids::ConversationId;

use super::Op;
use super::keys;

/// Views of one kind kept at once.
pub const MAX_KEPT: usize = 64;

/// A view of one conversation's keys.
pub(crate) trait Mirror: Sized {
    /// One op's change to the view.
    type Touch;

    /// Whether ops on column family `name` concern the view (their keys
    /// start with the conversation id).
    fn mirrors(name: &str) -> bool;

    /// How `op`, on a mirrored family and not a range delete, changes the
    /// view of its conversation; decoded only for conversations with one.
    fn touch(op: &Op) -> Option<Self::Touch>;

    fn apply(&mut self, touch: &Self::Touch);
}

enum Slot<V: Mirror> {
    /// A walk is under way; the ops noted since it registered.
    Building {
        noted: Vec<V::Touch>,
        forgotten: bool,
    },
    Kept {
        view: V,
        asked: Instant,
    },
}

/// The views of one kind in one store.
pub(crate) struct Mirrors<V: Mirror> {
    /// Whether any slot exists: the commit lanes skip their ops otherwise.
    active: AtomicBool,
    slots: Mutex<HashMap<ConversationId, Slot<V>>>,
    /// Signalled when a build ends.
    built: Condvar,
}

impl<V: Mirror> Default for Mirrors<V> {
    fn default() -> Self {
        Self {
            active: AtomicBool::new(false),
            slots: Mutex::new(HashMap::new()),
            built: Condvar::new(),
        }
    }
}

/// A build under way, from [`Mirrors::begin`]; dropped unfinished, it lets
/// the next caller build.
pub(crate) struct Building<'a, V: Mirror> {
    mirrors: &'a Mirrors<V>,
    conversation: ConversationId,
    done: bool,
}

impl<V: Mirror> Mirrors<V> {
    fn lock(&self) -> MutexGuard<'_, HashMap<ConversationId, Slot<V>>> {
        self.slots.lock().expect("kept views")
    }

    /// `f` of the kept view of `conversation`, waiting for a build under
    /// way if `wait`; `None` when there is none: [`begin`](Self::begin)
    /// one.
    pub fn read<R>(
        &self,
        conversation: ConversationId,
        wait: bool,
        f: impl FnOnce(&V) -> R,
    ) -> Option<R> {
        if !self.active.load(Ordering::Acquire) {
            return None;
        }
        let mut slots = self.lock();
        loop {
            match slots.get_mut(&conversation) {
                None => return None,
                Some(Slot::Kept { view, asked }) => {
                    *asked = Instant::now();
                    return Some(f(view));
                }
                Some(Slot::Building { .. }) if !wait => return None,
                Some(Slot::Building { .. }) => {
                    slots = self.built.wait(slots).expect("kept views");
                }
            }
        }
    }

    /// Registers a build of `conversation`'s view; its walk must start
    /// after this returns. `None`: another build or view came first.
    pub fn begin(&self, conversation: ConversationId) -> Option<Building<'_, V>> {
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
            mirrors: self,
            conversation,
            done: false,
        })
    }

    /// Called by the commit lanes with every durable batch's ops.
    pub(super) fn note<'a>(&self, ops: impl Iterator<Item = &'a Op>) {
        if !self.active.load(Ordering::Acquire) {
            return;
        }
        let mut locked: Option<MutexGuard<'_, _>> = None;
        for op in ops {
            let (name, key) = match op {
                Op::Put(name, key, _) | Op::Delete(name, key) | Op::Merge(name, key, _) => {
                    (*name, key)
                }
                Op::DeleteRange(name, from, to) => {
                    if V::mirrors(name) {
                        forget_range(locked.get_or_insert_with(|| self.lock()), from, to);
                    }
                    continue;
                }
            };
            if !V::mirrors(name) {
                continue;
            }
            let Some(conversation) = keys::first_u64(key).map(ConversationId) else {
                continue;
            };
            let slots = locked.get_or_insert_with(|| self.lock());
            match slots.get_mut(&conversation) {
                None => {}
                Some(Slot::Building { noted, .. }) => noted.extend(V::touch(op)),
                Some(Slot::Kept { view, .. }) => {
                    if let Some(touch) = V::touch(op) {
                        view.apply(&touch);
                    }
                }
            }
        }
        if let Some(slots) = locked {
            self.active.store(!slots.is_empty(), Ordering::Release);
        }
    }

    /// Views kept now.
    pub fn kept(&self) -> usize {
        let slots = self.lock();
        slots
            .values()
            .filter(|s| matches!(s, Slot::Kept { .. }))
            .count()
    }

    /// Whether a view of `conversation` is kept or being built.
    pub fn has(&self, conversation: ConversationId) -> bool {
        self.active.load(Ordering::Acquire) && self.lock().contains_key(&conversation)
    }
}

/// A range delete's conversations lose their views: those from the first
/// key's conversation through the last key's (every view, if a key is too
/// short to say).
fn forget_range<V: Mirror>(slots: &mut HashMap<ConversationId, Slot<V>>, from: &[u8], to: &[u8]) {
    let (first, last) = match (keys::first_u64(from), keys::first_u64(to)) {
        (Some(first), Some(last)) => (first, last),
        _ => (0, u64::MAX),
    };
    let hit = |c: &ConversationId| (first..=last).contains(&c.get());
    slots.retain(|c, slot| match slot {
        Slot::Building { forgotten, .. } => {
            *forgotten |= hit(c);
            true
        }
        Slot::Kept { .. } => !hit(c),
    });
}

impl<V: Mirror> Building<'_, V> {
    /// Replays the ops noted during the walk on `walked` and, if `keep`
    /// (and no range delete came meanwhile), keeps it for later questions.
    /// Returns `f` of the view.
    pub fn finish<R>(mut self, mut walked: V, keep: bool, f: impl FnOnce(&V) -> R) -> R {
        let mirrors = self.mirrors;
        let mut slots = mirrors.lock();
        let Some(Slot::Building { noted, forgotten }) = slots.remove(&self.conversation) else {
            unreachable!("a build's slot is its own until it ends");
        };
        for touch in &noted {
            walked.apply(touch);
        }
        let answer = f(&walked);
        if keep && !forgotten {
            if slots.len() >= MAX_KEPT {
                evict_least_asked(&mut slots);
            }
            let kept = Slot::Kept {
                view: walked,
                asked: Instant::now(),
            };
            slots.insert(self.conversation, kept);
        }
        mirrors.active.store(!slots.is_empty(), Ordering::Release);
        self.done = true;
        drop(slots);
        mirrors.built.notify_all();
        answer
    }
}

impl<V: Mirror> Drop for Building<'_, V> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut slots = self.mirrors.lock();
        slots.remove(&self.conversation);
        (self.mirrors.active).store(!slots.is_empty(), Ordering::Release);
        drop(slots);
        self.mirrors.built.notify_all();
    }
}

fn evict_least_asked<V: Mirror>(slots: &mut HashMap<ConversationId, Slot<V>>) {
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

/// The views the commit lanes keep up.
#[derive(Default)]
pub(crate) struct Views {
    pub tallies: super::tally::ReadTallies,
    pub screens: super::screen::Screens,
    pub queue_ids: super::queue_ids::QueueIds,
    pub member_lists: super::member_lists::MemberLists,
    pub recent: super::recent::RecentMessages,
}

impl Views {
    /// Called by the commit lanes with every durable batch's ops, before
    /// anyone hears of the batch (its writers, the relay of its outbox).
    pub(super) fn note<'a>(&self, ops: impl Iterator<Item = &'a Op> + Clone) {
        self.tallies.note(ops.clone());
        self.queue_ids.note(ops.clone());
        self.member_lists.note(ops.clone());
        self.recent.note(ops.clone());
        self.screens.note(ops);
    }
}
