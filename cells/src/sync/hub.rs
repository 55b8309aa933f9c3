//! Who is online, in memory, per [`UserKey`]: the live subscriptions of each user's devices
//! (woken when the user's sync queue grows) and device heartbeats. A device
//! streams once (a new stream of it supersedes the older, which ends), and
//! a user streams from at most `max_streams_per_user` devices at a time.
//! Each device stream has an [`Inbox`]: the user's hub events, transient
//! pushes (typing notices, large-group hints) and the stream's end go
//! there, and the stream, polled by its connection, takes them out: a hint
//! to a thousand devices wakes no task per device. Transient pushes are
//! not ordered with sync events, and one to a device whose inbox is full
//! is dropped (counted): a later hint covers it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use cellmesh_proto::storage::v1::SyncRecord;
use cellmesh_proto::v1::{Message, SyncPush};

use super::inbox::Inbox;
use crate::user::UserKey;
use cellmesh_proto::ids::{TenantId, UserId};

/// What a subscription is told.
#[derive(Debug, Clone)]
pub enum HubEvent {
    /// The user's sync queue now reaches this pts.
    Pts(u64),
    /// These events were appended to the user's sync queue (consecutive
    /// pts, durable): a stream whose cursor is just before the first one
    /// pushes them without reading storage.
    Appended(Arc<Vec<LiveEvent>>),
    /// The user's home no longer checks out here (the cell's sweep of
    /// streaming users found it): each stream checks it and ends.
    Recheck,
}

/// A sync event as the processor appended it, with its message read once
/// for every member's stream.
#[derive(Debug, Clone)]
pub struct LiveEvent {
    pub pts: u64,
    pub record: SyncRecord,
    pub message: Option<Arc<Message>>,
}

#[derive(Default)]
struct UserState {
    /// device → last heartbeat (Unix ms).
    heartbeats: HashMap<String, u64>,
    /// device → its stream.
    streams: HashMap<String, DeviceStream>,
}

/// One device's live stream, as the hub holds it.
struct DeviceStream {
    id: u64,
    inbox: Arc<Inbox>,
}

pub struct Hub {
    /// By user: ids, hashed fast.
    users: Mutex<rustc_hash::FxHashMap<UserKey, UserState>>,
    presence_window_ms: u64,
    max_streams_per_user: usize,
    next_stream: std::sync::atomic::AtomicU64,
    closed: std::sync::atomic::AtomicBool,
}

/// Keeps a device's subscription alive; dropping it unsubscribes.
pub struct Subscription {
    pub inbox: Arc<Inbox>,
    pub(super) _slot: Slot,
}

/// A device's place among its user's streams, given up on drop.
pub(super) struct Slot {
    hub: Weak<Hub>,
    user: UserKey,
    device: String,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(hub) = self.hub.upgrade() else {
            return;
        };
        let mut users = hub.users.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(state) = users.get_mut(&self.user)
            && state
                .streams
                .get(&self.device)
                .is_some_and(|s| s.id == self.id)
        {
            state.streams.remove(&self.device);
        }
    }
}

/// The user already streams from `max_streams_per_user` other devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyStreams(pub usize);

impl Hub {
    pub fn new(presence_window_ms: u64, max_streams_per_user: usize) -> Self {
        Self {
            users: Mutex::new(Default::default()),
            presence_window_ms,
            max_streams_per_user: max_streams_per_user.max(1),
            next_stream: std::sync::atomic::AtomicU64::new(1),
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Ends every subscription (their streams finish), and any made later:
    /// the server is shutting down.
    pub fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut users = self.users.lock().expect("hub lock");
        for state in users.values_mut() {
            for (_, stream) in state.streams.drain() {
                stream.inbox.close();
            }
        }
    }

    /// Subscribes `device` of `user`: supersedes the device's older
    /// stream; refused when the user streams from as many other devices as
    /// allowed.
    pub fn subscribe(
        self: &Arc<Self>,
        user: UserKey,
        device: &str,
    ) -> Result<Subscription, TooManyStreams> {
        let id = self
            .next_stream
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let slot = Slot {
            hub: Arc::downgrade(self),
            user,
            device: device.to_string(),
            id,
        };
        let mut users = self.users.lock().expect("hub lock");
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(Subscription {
                inbox: Arc::new(Inbox::closed()),
                _slot: slot,
            });
        }
        let state = users.entry(user).or_default();
        let others = state.streams.keys().filter(|d| *d != device).count();
        if others >= self.max_streams_per_user {
            return Err(TooManyStreams(self.max_streams_per_user));
        }
        let inbox = Arc::new(Inbox::default());
        let stream = DeviceStream {
            id,
            inbox: inbox.clone(),
        };
        if let Some(older) = state.streams.insert(device.to_string(), stream) {
            older.inbox.supersede();
        }
        Ok(Subscription { inbox, _slot: slot })
    }

    fn send(&self, user: UserKey, event: HubEvent) {
        let users = self.users.lock().expect("hub lock");
        if let Some(state) = users.get(&user) {
            for stream in state.streams.values() {
                stream.inbox.event(event.clone());
            }
        }
    }

    pub fn notify_pts(&self, user: UserKey, pts: u64) {
        self.send(user, HubEvent::Pts(pts));
    }

    /// Whether any device of `user` streams from this cell right now.
    pub fn is_subscribed(&self, user: UserKey) -> bool {
        let users = self.users.lock().expect("hub lock");
        users.get(&user).is_some_and(|s| !s.streams.is_empty())
    }

    /// The users with a device streaming from this cell now.
    pub fn streaming_users(&self) -> Vec<UserKey> {
        let users = self.users.lock().expect("hub lock");
        (users.iter())
            .filter(|(_, state)| !state.streams.is_empty())
            .map(|(user, _)| *user)
            .collect()
    }

    /// Tells `user`'s streams to check the user's home again.
    pub fn recheck(&self, user: UserKey) {
        self.send(user, HubEvent::Recheck);
    }

    pub fn appended(&self, user: UserKey, events: Vec<LiveEvent>) {
        self.send(user, HubEvent::Appended(Arc::new(events)));
    }

    /// Hands `push` to every device of each of `users` streaming now, under
    /// one lock; a device whose stream is full misses it.
    pub fn push(&self, users: &[UserKey], push: &SyncPush) {
        let users_now = self.users.lock().expect("hub lock");
        for user in users {
            let Some(state) = users_now.get(user) else {
                continue;
            };
            for stream in state.streams.values() {
                if !stream.inbox.push(push) {
                    crate::metrics::metrics().pushes_dropped.inc();
                }
            }
        }
    }

    pub fn heartbeat(&self, user: UserKey, device: &str, now_ms: u64) {
        let mut users = self.users.lock().expect("hub lock");
        users
            .entry(user)
            .or_default()
            .heartbeats
            .insert(device.to_string(), now_ms);
    }

    /// Online: a device subscribed right now, or one that heartbeat within
    /// the presence window. Also returns the last heartbeat.
    pub fn presence(&self, user: UserKey, now_ms: u64) -> (bool, u64) {
        let users = self.users.lock().expect("hub lock");
        let Some(state) = users.get(&user) else {
            return (false, 0);
        };
        self.presence_of(state, now_ms)
    }

    fn presence_of(&self, state: &UserState, now_ms: u64) -> (bool, u64) {
        let last_seen = state.heartbeats.values().copied().max().unwrap_or(0);
        let subscribed = !state.streams.is_empty();
        let recent = now_ms.saturating_sub(last_seen) <= self.presence_window_ms && last_seen > 0;
        (subscribed || recent, last_seen)
    }

    pub fn is_online(&self, user: UserKey, now_ms: u64) -> bool {
        self.presence(user, now_ms).0
    }

    /// The users of `tenant` online now, in one pass under one lock: what
    /// a hint to a large group starts from (far fewer than its members).
    pub fn online(&self, tenant: TenantId, now_ms: u64) -> Vec<UserId> {
        let users = self.users.lock().expect("hub lock");
        users
            .iter()
            .filter(|(key, state)| key.tenant == tenant && self.presence_of(state, now_ms).0)
            .map(|(key, _)| key.user)
            .collect()
    }

    /// Forgets users with no subscription and no recent heartbeat.
    pub fn prune(&self, now_ms: u64) {
        let window = self.presence_window_ms;
        let mut users = self.users.lock().expect("hub lock");
        users.retain(|_, s| {
            s.heartbeats
                .retain(|_, seen| now_ms.saturating_sub(*seen) <= window);
            !s.heartbeats.is_empty() || !s.streams.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::inbox::{Next, PUSH_DEPTH};
    use cellmesh_proto::ids::{TenantId, UserId};

    const U1: UserKey = UserKey::new(TenantId(1), UserId(1));
    const U2: UserKey = UserKey::new(TenantId(1), UserId(2));

    #[test]
    fn presence_follows_subscriptions_and_heartbeats() {
        let hub = Arc::new(Hub::new(1_000, 4));
        assert!(!hub.is_online(U1, 10_000));
        let sub = hub.subscribe(U1, "phone").unwrap();
        assert!(hub.is_online(U1, 10_000));
        drop(sub);
        assert!(!hub.is_online(U1, 10_000));
        hub.heartbeat(U1, "phone", 10_000);
        assert!(hub.is_online(U1, 10_500));
        assert!(!hub.is_online(U1, 11_500));
        hub.prune(11_500);
        assert_eq!(hub.presence(U1, 11_500), (false, 0));
    }

    #[test]
    fn closing_ends_every_subscription() {
        let hub = Arc::new(Hub::new(1_000, 4));
        let a = hub.subscribe(U1, "phone").unwrap();
        hub.close();
        assert!(matches!(a.inbox.try_next(), Some(Next::Closed)));
        assert!(!hub.is_subscribed(U1));
        let late = hub.subscribe(U2, "phone").unwrap();
        assert!(matches!(late.inbox.try_next(), Some(Next::Closed)));
    }

    #[test]
    fn only_subscribers_of_a_user_are_woken() {
        let hub = Arc::new(Hub::new(1_000, 4));
        let a = hub.subscribe(U1, "phone").unwrap();
        let b = hub.subscribe(U2, "phone").unwrap();
        hub.notify_pts(U1, 5);
        assert!(matches!(
            a.inbox.try_next(),
            Some(Next::Event(HubEvent::Pts(5)))
        ));
        assert!(b.inbox.try_next().is_none());
    }

    #[test]
    fn a_device_streams_once_and_a_user_from_so_many_devices() {
        let hub = Arc::new(Hub::new(1_000, 2));
        let first = hub.subscribe(U1, "phone").unwrap();
        let laptop = hub.subscribe(U1, "laptop").unwrap();
        assert_eq!(hub.subscribe(U1, "tablet").err(), Some(TooManyStreams(2)));
        assert!(hub.subscribe(U2, "tablet").is_ok(), "another user");
        // The same device again supersedes its older stream.
        let second = hub.subscribe(U1, "phone").unwrap();
        assert!(matches!(first.inbox.try_next(), Some(Next::Superseded)));
        hub.notify_pts(U1, 1);
        assert!(matches!(first.inbox.try_next(), Some(Next::Superseded)));
        assert!(matches!(second.inbox.try_next(), Some(Next::Event(_))));
        drop(first);
        assert_eq!(hub.subscribe(U1, "tablet").err(), Some(TooManyStreams(2)));
        drop(laptop);
        let _tablet = hub.subscribe(U1, "tablet").unwrap();
        drop(second);
        assert!(hub.is_online(U1, 0), "the tablet streams");
    }

    /// A transient push: a typing notice by `user`.
    fn typing(user: u64) -> SyncPush {
        SyncPush {
            push: Some(cellmesh_proto::v1::sync_push::Push::Typing(
                cellmesh_proto::v1::TypingNotice {
                    conversation_id: 7,
                    user_id: user,
                },
            )),
        }
    }

    /// The typing notices waiting for `sub`: who typed.
    fn typed(sub: &Subscription) -> Vec<u64> {
        let mut who = Vec::new();
        while let Some(Next::Push(push)) = sub.inbox.try_next() {
            if let Some(cellmesh_proto::v1::sync_push::Push::Typing(t)) = push.push {
                who.push(t.user_id);
            }
        }
        who
    }

    #[test]
    fn pushes_go_to_the_current_stream_of_each_device_and_a_full_one_misses_them() {
        let hub = Arc::new(Hub::new(1_000, 4));
        let phone = hub.subscribe(U1, "phone").unwrap();
        let laptop = hub.subscribe(U1, "laptop").unwrap();
        hub.push(&[U1, U2], &typing(2));
        assert_eq!(typed(&phone), vec![2]);
        // The laptop does not read: its inbox fills up.
        for _ in 1..PUSH_DEPTH {
            hub.push(&[U1], &typing(2));
        }
        assert_eq!(typed(&phone).len(), PUSH_DEPTH - 1);
        let dropped = crate::metrics::metrics().pushes_dropped.get();
        hub.push(&[U1], &typing(3));
        assert_eq!(typed(&phone), vec![3]);
        assert!(crate::metrics::metrics().pushes_dropped.get() > dropped);
        let laptops = typed(&laptop);
        assert_eq!(laptops.len(), PUSH_DEPTH);
        assert!(laptops.iter().all(|u| *u == 2), "the last one missed");
        // A newer stream of the phone supersedes the older: only it is pushed.
        let phone_again = hub.subscribe(U1, "phone").unwrap();
        hub.push(&[U1], &typing(4));
        assert_eq!(typed(&phone_again), vec![4]);
        assert!(matches!(phone.inbox.try_next(), Some(Next::Superseded)));
        assert_eq!(typed(&laptop), vec![4], "read again, pushed again");
        // Closing ends every stream.
        hub.close();
        hub.push(&[U1], &typing(5));
        assert!(matches!(phone_again.inbox.try_next(), Some(Next::Closed)));
        assert!(matches!(laptop.inbox.try_next(), Some(Next::Closed)));
    }

    #[test]
    fn the_same_user_id_in_two_tenants_is_two_users() {
        let hub = Arc::new(Hub::new(1_000, 4));
        let (a, b) = (
            UserKey::new(TenantId(1), UserId(2)),
            UserKey::new(TenantId(2), UserId(2)),
        );
        let sub_a = hub.subscribe(a, "phone").unwrap();
        let sub_b = hub.subscribe(b, "phone").unwrap();
        hub.notify_pts(a, 3);
        assert!(matches!(
            sub_a.inbox.try_next(),
            Some(Next::Event(HubEvent::Pts(3)))
        ));
        assert!(sub_b.inbox.try_next().is_none());
        drop(sub_b);
        hub.heartbeat(a, "phone", 10_000);
        assert!(hub.is_online(a, 10_000));
        assert!(!hub.is_online(b, 10_000));
        assert_eq!(hub.presence(b, 10_000), (false, 0));
    }
}
