//! Which conversations and user homes changed, for the rounds of a tenant
//! move. While a move watches a tenant, both commit lanes note, after each
//! durable batch, every conversation it touched (of any tenant: their keys
//! do not name it) and every user home of a watched tenant, with the
//! generation current then. A round asks what changed since the token of
//! its previous answer instead of listing and reading the whole tenant, so
//! a seal under the freeze costs what changed since the last round, not
//! what the tenant holds.
//!
//! Kept in memory only: a restarted cell, or a watch nobody asked about for
//! [`WATCH_TTL`], does not know an older token, and the caller lists
//! everything again.

use cellmesh_proto::ids::{TenantId, UserId};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::Op;
use super::keys::{self, cf};
use crate::user::UserKey;

/// A watch ends when no round asked about its tenant for this long.
pub const WATCH_TTL: Duration = Duration::from_secs(600);

/// What changed since a token, and the token to ask with next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cut {
    pub token: u64,
    /// `None`: the token is not one this cell can answer: list everything.
    pub changed: Option<Changed>,
}

/// Items touched since a token, in id order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changed {
    /// Conversations of every tenant (the caller keeps its tenant's).
    pub conversations: Vec<u64>,
    /// User ids of the asked tenant.
    pub users: Vec<u64>,
}

struct Watch {
    /// Changes are known from this generation on.
    armed_at: u32,
    /// The oldest generation the watcher may still ask from.
    asked_from: u32,
    asked: Instant,
}

struct Inner {
    incarnation: u32,
    generation: u32,
    watches: HashMap<u64, Watch>,
    conversations: HashMap<u64, u32>,
    users: HashMap<UserKey, u32>,
}

/// The change log of one store.
pub struct Changes {
    /// Whether any tenant is watched (the lanes skip noting otherwise).
    watching: AtomicBool,
    inner: Mutex<Inner>,
}

impl Default for Changes {
    fn default() -> Self {
        Self::new()
    }
}

fn token(incarnation: u32, generation: u32) -> u64 {
    (u64::from(incarnation) << 32) | u64::from(generation)
}

impl Changes {
    pub fn new() -> Self {
        Self {
            watching: AtomicBool::new(false),
            inner: Mutex::new(Inner {
                incarnation: rand::random::<u32>().max(1),
                generation: 0,
                watches: HashMap::new(),
                conversations: HashMap::new(),
                users: HashMap::new(),
            }),
        }
    }

    /// Notes what a durable batch of `ops` touched (called by the lanes
    /// before they answer the batch's writers).
    pub(super) fn note<'a>(&self, ops: impl IntoIterator<Item = &'a Op>) {
        if !self.watching.load(Ordering::Acquire) {
            return;
        }
        let mut inner = self.inner.lock().expect("changes lock");
        let generation = inner.generation;
        for op in ops {
            let (name, key) = match op {
                Op::Put(name, key, _)
                | Op::Delete(name, key)
                | Op::Merge(name, key, _)
                | Op::DeleteRange(name, key, _) => (*name, key.as_slice()),
            };
            match touched(name, key) {
                Some(Touched::Conversation(id)) => {
                    inner.conversations.insert(id, generation);
                }
                Some(Touched::User(user)) if inner.watches.contains_key(&user.tenant.get()) => {
                    inner.users.insert(user, generation);
                }
                _ => {}
            }
        }
    }

    /// Watches `tenant` (from now, if it was not) and answers what changed
    /// since `since` (0: nothing known, list everything). The answer's
    /// token covers every batch noted after this call; changes older than
    /// `since` are forgotten.
    pub fn cut(&self, tenant: TenantId, since: u64) -> Cut {
        let mut inner = self.inner.lock().expect("changes lock");
        let now = Instant::now();
        inner
            .watches
            .retain(|_, w| now.duration_since(w.asked) < WATCH_TTL);
        let incarnation = inner.incarnation;
        inner.generation += 1;
        let generation = inner.generation;
        let from = (since >> 32 == u64::from(incarnation)).then_some(since as u32);
        let watch = inner.watches.entry(tenant.get()).or_insert(Watch {
            armed_at: generation,
            asked_from: generation,
            asked: now,
        });
        watch.asked = now;
        let known = from.filter(|&g| g >= watch.armed_at && g >= watch.asked_from);
        if let Some(g) = known {
            watch.asked_from = g;
        }
        let changed = known.map(|from| {
            let mut conversations: Vec<u64> = (inner.conversations.iter())
                .filter(|&(_, &g)| g >= from)
                .map(|(&id, _)| id)
                .collect();
            let mut users: Vec<u64> = (inner.users.iter())
                .filter(|&(u, &g)| u.tenant.get() == tenant.get() && g >= from)
                .map(|(u, _)| u.user.get())
                .collect();
            conversations.sort_unstable();
            users.sort_unstable();
            Changed {
                conversations,
                users,
            }
        });
        // What no watcher can ask about any more.
        let oldest = inner.watches.values().map(|w| w.asked_from).min();
        match oldest {
            Some(oldest) => {
                let watched: std::collections::HashSet<u64> =
                    inner.watches.keys().copied().collect();
                inner.conversations.retain(|_, g| *g >= oldest);
                inner
                    .users
                    .retain(|u, g| *g >= oldest && watched.contains(&u.tenant.get()));
            }
            None => {
                inner.conversations.clear();
                inner.users.clear();
            }
        }
        self.watching.store(true, Ordering::Release);
        Cut {
            token: token(incarnation, generation),
            changed,
        }
    }
}

enum Touched {
    Conversation(u64),
    User(UserKey),
}

/// The conversation or user home a key of column family `name` belongs to.
fn touched(name: &str, key: &[u8]) -> Option<Touched> {
    match name {
        cf::CONVERSATIONS
        | cf::CONV_SEQ
        | cf::MEMBERS
        | cf::MESSAGES
        | cf::READ_STATE
        | cf::HIDDEN
        | cf::MANIFEST => keys::first_u64(key).map(Touched::Conversation),
        cf::META => (key.strip_prefix(keys::meta::REWRITES))
            .or_else(|| key.strip_prefix(keys::meta::OPEN_UPLOADS))
            .and_then(keys::first_u64)
            .map(Touched::Conversation),
        cf::SYNC | cf::CONV_LIST | cf::MUTED | cf::DEVICE_CURSOR | cf::QUEUE_ID => {
            let tenant = keys::first_u64(key)?;
            let user = keys::first_u64(key.get(8..)?)?;
            Some(Touched::User(UserKey::new(TenantId(tenant), UserId(user))))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellmesh_proto::ids::{ConversationId, Seq};

    fn put(name: &'static str, key: &[u8]) -> Op {
        Op::Put(name, key.to_vec(), Vec::new())
    }

    #[test]
    fn answers_only_what_changed_after_the_token() {
        let changes = Changes::new();
        // Nothing is noted before a watch.
        changes.note(&[put(cf::MESSAGES, &keys::message(ConversationId(9), Seq(1)))]);
        let first = changes.cut(TenantId(1), 0);
        assert_eq!(first.changed, None, "no token: list everything");
        changes.note(&[
            put(cf::MESSAGES, &keys::message(ConversationId(5), Seq(1))),
            put(
                cf::SYNC,
                &keys::user_item(UserKey::new(TenantId(1), UserId(7)), 3),
            ),
            put(
                cf::SYNC,
                &keys::user_item(UserKey::new(TenantId(2), UserId(7)), 3),
            ),
            put(cf::META, &keys::meta::rewrites(ConversationId(6))),
            put(cf::META, &keys::meta::open_upload(ConversationId(8), 3)),
            put(cf::OUTBOX, &1u64.to_be_bytes()),
        ]);
        let second = changes.cut(TenantId(1), first.token);
        let changed = second.changed.expect("a known token");
        assert_eq!(changed.conversations, vec![5, 6, 8]);
        assert_eq!(changed.users, vec![7], "only the watched tenant's homes");
        // Nothing since: nothing changed.
        let third = changes.cut(TenantId(1), second.token);
        assert_eq!(third.changed, Some(Changed::default()));
        // Asking again from the older token still answers (a lost answer).
        let again = changes.cut(TenantId(1), second.token).changed.unwrap();
        assert!(again.conversations.is_empty());
    }

    #[test]
    fn a_token_of_another_life_or_before_the_watch_lists_everything() {
        let (a, b) = (Changes::new(), Changes::new());
        let token = a.cut(TenantId(1), 0).token;
        b.cut(TenantId(1), 0);
        assert_eq!(
            b.cut(TenantId(1), token).changed,
            None,
            "another life's token"
        );
        // A token from before tenant 2 was watched does not cover it.
        let early = a.cut(TenantId(1), token).token;
        a.cut(TenantId(2), 0);
        assert_eq!(a.cut(TenantId(2), early).changed, None);
    }
}
