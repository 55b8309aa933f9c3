//! A large group's `latest_seq` hints, paced and spread. The first hint
//! about a conversation goes out at once; hints about it within the next
//! `fanout.hint_interval_ms` are merged into one (the newest `latest_seq`,
//! to its members online as of the newest) that goes when the interval
//! ends, so however hot a group is, its hints cost at most one push per
//! online member per interval. A hint is a nudge to pull: merging loses
//! nothing, the newest covers every seq before it. Interval 0 sends every
//! hint as it comes. Either way a hint reaches its devices a slice at a
//! time, a millisecond apart unless more hints wait, so pushing to a
//! thousand devices does not hold every worker while the cell's other
//! conversations wait to be served. With an interval, the slices are as
//! small as lets a hint reach all its devices within three quarters of it:
//! the pushes come evenly, not in one burst per interval.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use cellmesh_proto::v1::{ConversationHint, SyncPush, sync_push};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::Hub;
use crate::user::UserKey;

pub struct HintPacer {
    interval: Duration,
    state: Mutex<Paced>,
    /// To the task that pushes, a slice of devices at a time.
    outgoing: mpsc::UnboundedSender<(Vec<UserKey>, ConversationHint)>,
}

/// Most devices one slice of a hint goes to; slices are a millisecond
/// apart, so a hint to thousands of devices does not hold every worker at
/// once.
const SLICE: usize = 64;
/// Fewest devices a slice goes to.
const MIN_SLICE: usize = 8;

/// Devices per slice for a hint to `devices`: spread over three quarters
/// of `interval`, a slice a millisecond (`SLICE` without an interval).
fn slice_for(devices: usize, interval: Duration) -> usize {
    if interval.is_zero() {
        return SLICE;
    }
    let spread_ms = (interval.as_millis() as usize * 3 / 4).max(1);
    devices.div_ceil(spread_ms).clamp(MIN_SLICE, SLICE)
}

#[derive(Default)]
struct Paced {
    /// Per conversation: until when a hint waits.
    held_until: HashMap<u64, Instant>,
    /// Per conversation: the merged hint waiting, and to whom it goes.
    waiting: HashMap<u64, (Vec<UserKey>, ConversationHint)>,
}

impl HintPacer {
    /// A pacer over `hub`; with a nonzero interval, it flushes on a task
    /// that ends when the pacer is dropped.
    pub fn start(hub: Arc<Hub>, interval: Duration) -> Arc<Self> {
        let (outgoing, queued) = mpsc::unbounded_channel();
        tokio::spawn(push_in_slices(hub, queued, interval));
        let pacer = Arc::new(Self {
            interval,
            state: Mutex::new(Paced::default()),
            outgoing,
        });
        if !interval.is_zero() {
            tokio::spawn(flush_until_dropped(Arc::downgrade(&pacer), interval));
        }
        pacer
    }

    /// Hints `to` about a conversation now, or merges it into the one
    /// waiting for the end of the conversation's interval.
    pub fn hint(&self, to: Vec<UserKey>, hint: ConversationHint) {
        if !self.interval.is_zero() {
            let now = Instant::now();
            let mut paced = self.state.lock().expect("hint pacer");
            let conversation = hint.conversation_id;
            if paced
                .held_until
                .get(&conversation)
                .is_some_and(|t| *t > now)
            {
                let newer = match paced.waiting.get(&conversation) {
                    Some((_, waiting)) => hint.latest_seq >= waiting.latest_seq,
                    None => true,
                };
                if newer {
                    paced.waiting.insert(conversation, (to, hint));
                }
                return;
            }
            paced.held_until.insert(conversation, now + self.interval);
        }
        self.push(to, hint);
    }

    fn push(&self, to: Vec<UserKey>, hint: ConversationHint) {
        let _ = self.outgoing.send((to, hint));
    }

    /// Sends the merged hints whose interval has ended; forgets
    /// conversations quiet for a whole interval.
    fn flush(&self) {
        let now = Instant::now();
        let due: Vec<_> = {
            let mut paced = self.state.lock().expect("hint pacer");
            let Paced {
                held_until,
                waiting,
            } = &mut *paced;
            held_until
                .retain(|conversation, until| *until > now || waiting.contains_key(conversation));
            let due: Vec<u64> = waiting
                .keys()
                .filter(|c| held_until.get(c).is_none_or(|t| *t <= now))
                .copied()
                .collect();
            due.into_iter()
                .filter_map(|c| {
                    held_until.insert(c, now + self.interval);
                    waiting.remove(&c)
                })
                .collect()
        };
        for (to, hint) in due {
            self.push(to, hint);
        }
    }
}

/// Pushes each hint a slice of devices at a time ([`slice_for`]), until
/// the pacer is dropped.
async fn push_in_slices(
    hub: Arc<Hub>,
    mut queued: mpsc::UnboundedReceiver<(Vec<UserKey>, ConversationHint)>,
    interval: Duration,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while let Some((to, hint)) = queued.recv().await {
        let push = SyncPush {
            push: Some(sync_push::Push::Hint(hint)),
        };
        for slice in to.chunks(slice_for(to.len(), interval)) {
            // Behind (hints waiting): no pause.
            if queued.is_empty() {
                tick.tick().await;
            }
            hub.push(slice, &push);
        }
    }
}

/// Flushes a quarter interval apart while the pacer lives.
async fn flush_until_dropped(pacer: Weak<HintPacer>, interval: Duration) {
    let mut tick = tokio::time::interval((interval / 4).max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(pacer) = pacer.upgrade() else {
            return;
        };
        pacer.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::Subscription;
    use crate::sync::inbox::Next;
    use cellmesh_proto::ids::{TenantId, UserId};

    const U1: UserKey = UserKey::new(TenantId(1), UserId(1));

    fn hint(conversation: u64, seq: u64) -> ConversationHint {
        ConversationHint {
            conversation_id: conversation,
            latest_seq: seq,
            msg_id: seq,
        }
    }

    /// A device of `user` streaming: its subscription, where it is pushed.
    fn device(hub: &Arc<Hub>, user: UserKey) -> Subscription {
        hub.subscribe(user, "phone").unwrap()
    }

    /// The `latest_seq`s of the hints received so far.
    fn received(rx: &mut Subscription) -> Vec<u64> {
        let mut seqs = Vec::new();
        while let Some(next) = rx.inbox.try_next() {
            if let Next::Push(SyncPush {
                push: Some(sync_push::Push::Hint(h)),
            }) = next
            {
                seqs.push(h.latest_seq);
            }
        }
        seqs
    }

    /// Waits up to two seconds for a hint: its `latest_seq`s.
    async fn next_hints(rx: &mut Subscription) -> Vec<u64> {
        for _ in 0..200 {
            let got = received(rx);
            if !got.is_empty() {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Vec::new()
    }

    #[tokio::test]
    async fn a_hot_conversations_hints_merge_to_one_per_interval() {
        let hub = Arc::new(Hub::new(60_000, 4));
        let mut rx = device(&hub, U1);
        let interval = Duration::from_millis(300);
        let pacer = HintPacer::start(hub.clone(), interval);
        let first = Instant::now();
        pacer.hint(vec![U1], hint(7, 1));
        assert_eq!(next_hints(&mut rx).await, vec![1]);
        assert!(first.elapsed() < interval, "the first goes at once");
        for seq in [3, 2, 4] {
            pacer.hint(vec![U1], hint(7, seq));
        }
        // Another conversation is paced on its own.
        pacer.hint(vec![U1], hint(8, 1));
        assert_eq!(next_hints(&mut rx).await, vec![1]);
        assert!(first.elapsed() < interval, "the rest of 7 wait");
        assert_eq!(next_hints(&mut rx).await, vec![4], "merged: the newest");
        assert!(
            first.elapsed() >= interval * 9 / 10,
            "{:?}",
            first.elapsed()
        );
        tokio::time::sleep(interval * 2).await;
        assert!(received(&mut rx).is_empty(), "nothing more");
        // Quiet for an interval: the next goes at once again.
        let quiet = Instant::now();
        pacer.hint(vec![U1], hint(7, 5));
        assert_eq!(next_hints(&mut rx).await, vec![5]);
        assert!(quiet.elapsed() < interval);
    }

    #[tokio::test]
    async fn interval_zero_sends_every_hint_to_every_device_in_slices() {
        let hub = Arc::new(Hub::new(60_000, 4));
        let users: Vec<UserKey> = (1..=3 * SLICE as u64)
            .map(|u| UserKey::new(TenantId(1), UserId(u)))
            .collect();
        let mut devices: Vec<_> = users.iter().map(|u| device(&hub, *u)).collect();
        let pacer = HintPacer::start(hub.clone(), Duration::ZERO);
        for seq in 1..=3 {
            pacer.hint(users.clone(), hint(7, seq));
        }
        for rx in &mut devices {
            let mut got = next_hints(rx).await;
            while got.len() < 3 {
                let more = next_hints(rx).await;
                assert!(!more.is_empty(), "{got:?}");
                got.extend(more);
            }
            assert_eq!(got, vec![1, 2, 3]);
        }
    }
}
