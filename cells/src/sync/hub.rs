//! Who is online, in memory, per [`UserKey`]: the live subscriptions of each user's devices
//! (woken when the user's sync queue grows) and device heartbeats. A device
//! streams once (a new stream of it supersedes the older, which ends), and
//! a user streams from at most `max_streams_per_user` devices at a time.
//! Transient pushes (typing notices, large-group hints) go straight into
//! each device's outgoing stream, not through the task that streams its
//! queue: a hint to a thousand devices wakes no task per device. They are
//! not ordered with sync events, and one to a device whose stream is full
//! is dropped (counted): a later hint covers it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use cellmesh_proto::storage::v1::SyncRecord;
use cellmesh_proto::v1::{Message, SyncPush};
use tokio::sync::{broadcast, mpsc, oneshot};

use super::stream::PushResult;
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

/// Pending hub events per subscription before it counts as lagging (a
/// lagging subscription rereads its queue from storage).
const CHANNEL_DEPTH: usize = 256;

#[derive(Default)]
struct UserState {
    tx: Option<broadcast::Sender<HubEvent>>,
    /// device → last heartbeat (Unix ms).
    heartbeats: HashMap<String, u64>,
    /// device → its stream.
    streams: HashMap<String, DeviceStream>,
}

/// One device's live stream, as the hub holds it.
struct DeviceStream {
    id: u64,
    /// Fired when a newer stream of the device supersedes this one.
    superseded: oneshot::Sender<()>,
    /// Where transient pushes go, once the stream has queued what must
    /// come first ([`Subscription::take_pushes`]).
    pushes: Option<mpsc::Sender<PushResult>>,
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
    pub rx: broadcast::Receiver<HubEvent>,
    /// Fires when a newer stream of the same device supersedes this one.
    pub superseded: oneshot::Receiver<()>,
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

impl Subscription {
    /// From now on, transient pushes to this device go into `pushes`
    /// (unless a newer stream superseded it, or the hub closed).
    pub fn take_pushes(&self, pushes: mpsc::Sender<PushResult>) {
        let slot = &self._slot;
        let Some(hub) = slot.hub.upgrade() else {
            return;
        };
        let mut users = hub.users.lock().expect("hub lock");
        if let Some(stream) = users
            .get_mut(&slot.user)
            .and_then(|s| s.streams.get_mut(&slot.device))
            .filter(|s| s.id == slot.id && !hub.closed.load(std::sync::atomic::Ordering::SeqCst))
        {
            stream.pushes = Some(pushes);
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
            state.tx = None;
            for stream in state.streams.values_mut() {
                stream.pushes = None;
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
        let (signal, superseded) = oneshot::channel();
        let slot = Slot {
            hub: Arc::downgrade(self),
            user,
            device: device.to_string(),
            id,
        };
        let mut users = self.users.lock().expect("hub lock");
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(Subscription {
                rx: broadcast::channel(1).1,
                superseded,
                _slot: slot,
            });
        }
        let state = users.entry(user).or_default();
        let others = state.streams.keys().filter(|d| *d != device).count();
        if others >= self.max_streams_per_user {
            return Err(TooManyStreams(self.max_streams_per_user));
        }
        let stream = DeviceStream {
            id,
            superseded: signal,
            pushes: None,
        };
        if let Some(older) = state.streams.insert(device.to_string(), stream) {
            let _ = older.superseded.send(());
        }
        let tx = state
            .tx
            .get_or_insert_with(|| broadcast::channel(CHANNEL_DEPTH).0);
        Ok(Subscription {
            rx: tx.subscribe(),
            superseded,
            _slot: slot,
        })
    }

    fn send(&self, user: UserKey, event: HubEvent) {
        let users = self.users.lock().expect("hub lock");
        if let Some(tx) = users.get(&user).and_then(|s| s.tx.as_ref()) {
            let _ = tx.send(event);
        }
    }

    pub fn notify_pts(&self, user: UserKey, pts: u64) {
        self.send(user, HubEvent::Pts(pts));
    }

    /// Whether any device of `user` streams from this cell right now.
    pub fn is_subscribed(&self, user: UserKey) -> bool {
        let users = self.users.lock().expect("hub lock");
        users
            .get(&user)
            .and_then(|s| s.tx.as_ref())
            .is_some_and(|tx| tx.receiver_count() > 0)
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
            for pushes in state.streams.values().filter_map(|s| s.pushes.as_ref()) {
                if let Err(mpsc::error::TrySendError::Full(_)) = pushes.try_send(Ok(push.clone())) {
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
        let subscribed = state.tx.as_ref().is_some_and(|tx| tx.receiver_count() > 0);
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
            if s.tx.as_ref().is_some_and(|tx| tx.receiver_count() == 0) {
                s.tx = None;
            }
            s.tx.is_some() || !s.heartbeats.is_empty() || !s.streams.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

    #[tokio::test]
    async fn closing_ends_every_subscription() {
        let hub = Arc::new(Hub::new(1_000, 4));
        let mut a = hub.subscribe(U1, "phone").unwrap();
        hub.close();
        assert!(matches!(
            a.rx.recv().await,
            Err(broadcast::error::RecvError::Closed)
        ));
        let mut late = hub.subscribe(U2, "phone").unwrap();
        assert!(matches!(
            late.rx.recv().await,
            Err(broadcast::error::RecvError::Closed)
        ));
    }

    #[tokio::test]
    async fn only_subscribers_of_a_user_are_woken() {
        let hub = Arc::new(Hub::new(1_000, 4));
        let mut a = hub.subscribe(U1, "phone").unwrap();
        let mut b = hub.subscribe(U2, "phone").unwrap();
        hub.notify_pts(U1, 5);
        assert!(matches!(a.rx.recv().await.unwrap(), HubEvent::Pts(5)));
        assert!(b.rx.try_recv().is_err());
    }

    #[tokio::test]
    async fn a_device_streams_once_and_a_user_from_so_many_devices() {
        let hub = Arc::new(Hub::new(1_000, 2));
        let mut first = hub.subscribe(U1, "phone").unwrap();
        let laptop = hub.subscribe(U1, "laptop").unwrap();
        assert_eq!(hub.subscribe(U1, "tablet").err(), Some(TooManyStreams(2)));
        assert!(hub.subscribe(U2, "tablet").is_ok(), "another user");
        // The same device again supersedes its older stream.
        let second = hub.subscribe(U1, "phone").unwrap();
        first.superseded.try_recv().expect("superseded");
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

    /// The typing notices waiting in `rx`: who typed.
    fn typed(rx: &mut mpsc::Receiver<PushResult>) -> Vec<u64> {
        let mut who = Vec::new();
        while let Ok(Ok(push)) = rx.try_recv() {
            if let Some(cellmesh_proto::v1::sync_push::Push::Typing(t)) = push.push {
                who.push(t.user_id);
            }
        }
        who
    }

    #[tokio::test]
    async fn pushes_go_to_the_current_stream_of_each_device_and_a_full_one_misses_them() {
        let hub = Arc::new(Hub::new(1_000, 4));
        let (old, new, laptop) = (mpsc::channel(4), mpsc::channel(4), mpsc::channel(1));
        let (phone_tx, mut phone_rx) = old;
        let phone = hub.subscribe(U1, "phone").unwrap();
        phone.take_pushes(phone_tx);
        let laptop_sub = hub.subscribe(U1, "laptop").unwrap();
        let (laptop_tx, mut laptop_rx) = laptop;
        laptop_sub.take_pushes(laptop_tx);
        hub.push(&[U1, U2], &typing(2));
        assert_eq!(typed(&mut phone_rx), vec![2]);
        // The laptop does not read: its stream of one is full.
        let dropped = crate::metrics::metrics().pushes_dropped.get();
        hub.push(&[U1], &typing(3));
        assert_eq!(typed(&mut phone_rx), vec![3]);
        assert!(crate::metrics::metrics().pushes_dropped.get() > dropped);
        assert_eq!(typed(&mut laptop_rx), vec![2]);
        // A newer stream of the phone supersedes the older: only it is pushed,
        // and the older's stream ends once its task lets go.
        let (new_tx, mut new_rx) = new;
        let phone_again = hub.subscribe(U1, "phone").unwrap();
        phone_again.take_pushes(new_tx);
        phone.take_pushes(mpsc::channel(4).0);
        hub.push(&[U1], &typing(4));
        assert_eq!(typed(&mut new_rx), vec![4]);
        assert_eq!(typed(&mut laptop_rx), vec![4], "read again, pushed again");
        drop(phone);
        assert!(
            phone_rx.recv().await.is_none(),
            "the hub let the old stream go"
        );
        // Closing lets every stream go.
        hub.close();
        drop((phone_again, laptop_sub));
        assert!(new_rx.recv().await.is_none());
        assert!(laptop_rx.recv().await.is_none());
    }

    #[tokio::test]
    async fn the_same_user_id_in_two_tenants_is_two_users() {
        let hub = Arc::new(Hub::new(1_000, 4));
        let (a, b) = (
            UserKey::new(TenantId(1), UserId(2)),
            UserKey::new(TenantId(2), UserId(2)),
        );
        let mut sub_a = hub.subscribe(a, "phone").unwrap();
        let mut sub_b = hub.subscribe(b, "phone").unwrap();
        hub.notify_pts(a, 3);
        assert!(matches!(sub_a.rx.recv().await.unwrap(), HubEvent::Pts(3)));
        assert!(sub_b.rx.try_recv().is_err());
        drop(sub_b);
        hub.heartbeat(a, "phone", 10_000);
        assert!(hub.is_online(a, 10_000));
        assert!(!hub.is_online(b, 10_000));
        assert_eq!(hub.presence(b, 10_000), (false, 0));
    }
}
