//! One device stream's inbox: what the hub tells the stream (its user's
//! queue grew, these events were appended, check the home again), the
//! transient pushes for it (typing notices, large-group hints), and the
//! two ends (a newer stream of the device superseded it; the hub closed),
//! behind one lock and one waker. A sender wakes the stream only when it
//! waits, so a burst of events for a device costs one wake-up, and a
//! stream polls one place instead of three channels.
//!
//! Both queues are bounded. Hub events past [`EVENT_DEPTH`] are dropped
//! and the stream is told it lagged (it rereads its queue from storage, so
//! nothing is lost); transient pushes past [`PUSH_DEPTH`] are dropped and
//! counted (a later hint covers them).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use cellmesh_proto::v1::SyncPush;

use super::HubEvent;

/// Hub events waiting for a stream before it counts as lagging.
pub const EVENT_DEPTH: usize = 256;
/// Transient pushes waiting for a stream; more are dropped.
pub const PUSH_DEPTH: usize = 256;

/// What a stream takes from its inbox next, most urgent first.
#[derive(Debug)]
pub enum Next {
    /// A newer stream of the same device took over: this one ends.
    Superseded,
    /// A transient push, to go out as it is.
    Push(SyncPush),
    /// Hub events were dropped: the stream reads its queue from storage.
    Lagged,
    Event(HubEvent),
    /// The hub closed (the cell is stopping) and nothing is left.
    Closed,
}

#[derive(Default)]
pub struct Inbox {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    events: VecDeque<HubEvent>,
    pushes: VecDeque<SyncPush>,
    lagged: bool,
    superseded: bool,
    closed: bool,
    /// The stream's waker while it waits for something.
    waker: Option<Waker>,
}

impl Inbox {
    /// An inbox that is already closed (subscribed after the hub closed).
    pub fn closed() -> Self {
        let inbox = Self::default();
        inbox.close();
        inbox
    }

    fn change(&self, f: impl FnOnce(&mut State)) {
        let waker = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut state);
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    pub fn event(&self, event: HubEvent) {
        self.change(|state| {
            if state.lagged {
                return;
            }
            if state.events.len() >= EVENT_DEPTH {
                state.events.clear();
                state.lagged = true;
            } else {
                state.events.push_back(event);
            }
        });
    }

    /// Queues a transient push; false when the inbox is full (or ended) and
    /// the push was dropped.
    pub fn push(&self, push: &SyncPush) -> bool {
        let mut queued = false;
        self.change(|state| {
            if state.pushes.len() < PUSH_DEPTH && !state.superseded && !state.closed {
                state.pushes.push_back(push.clone());
                queued = true;
            }
        });
        queued
    }

    pub fn supersede(&self) {
        self.change(|state| state.superseded = true);
    }

    pub fn close(&self) {
        self.change(|state| state.closed = true);
    }

    /// What is next, if anything is.
    pub fn try_next(&self) -> Option<Next> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        Self::take(&mut state)
    }

    /// What is next, or `Pending` with the stream's waker kept.
    pub fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Next> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(next) = Self::take(&mut state) {
            return Poll::Ready(next);
        }
        match &mut state.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            waker => *waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    fn take(state: &mut State) -> Option<Next> {
        if state.superseded {
            return Some(Next::Superseded);
        }
        if let Some(push) = state.pushes.pop_front() {
            return Some(Next::Push(push));
        }
        if std::mem::take(&mut state.lagged) {
            return Some(Next::Lagged);
        }
        if let Some(event) = state.events.pop_front() {
            return Some(Next::Event(event));
        }
        state.closed.then_some(Next::Closed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn typing() -> SyncPush {
        SyncPush {
            push: Some(cellmesh_proto::v1::sync_push::Push::Typing(
                cellmesh_proto::v1::TypingNotice {
                    conversation_id: 7,
                    user_id: 2,
                },
            )),
        }
    }

    #[test]
    fn a_waiting_stream_is_woken_once_for_a_burst_and_takes_all_of_it_in_order() {
        let inbox = Inbox::default();
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(inbox.poll_next(&mut cx).is_pending());
        for pts in 1..=3 {
            inbox.event(HubEvent::Pts(pts));
        }
        assert_eq!(woken.0.load(Ordering::SeqCst), 1, "one wake-up");
        inbox.push(&typing());
        let mut got = Vec::new();
        while let Poll::Ready(next) = inbox.poll_next(&mut cx) {
            got.push(match next {
                Next::Push(_) => 0,
                Next::Event(HubEvent::Pts(pts)) => pts,
                other => panic!("{other:?}"),
            });
        }
        assert_eq!(got, vec![0, 1, 2, 3], "transient pushes first");
        inbox.event(HubEvent::Pts(4));
        assert_eq!(woken.0.load(Ordering::SeqCst), 2, "waiting again");
    }

    #[test]
    fn an_overflow_is_a_lag_and_full_pushes_are_refused() {
        let inbox = Inbox::default();
        for pts in 0..=EVENT_DEPTH as u64 {
            inbox.event(HubEvent::Pts(pts));
        }
        inbox.event(HubEvent::Pts(1_000));
        assert!(matches!(inbox.try_next(), Some(Next::Lagged)));
        assert!(inbox.try_next().is_none(), "the lag replaced every event");
        assert!((0..PUSH_DEPTH).all(|_| inbox.push(&typing())));
        assert!(!inbox.push(&typing()));
    }

    #[test]
    fn superseded_comes_first_and_closed_last() {
        let inbox = Inbox::default();
        inbox.event(HubEvent::Pts(1));
        inbox.close();
        assert!(matches!(inbox.try_next(), Some(Next::Event(_))));
        assert!(matches!(inbox.try_next(), Some(Next::Closed)));
        assert!(!inbox.push(&typing()), "closed");
        inbox.supersede();
        assert!(matches!(inbox.try_next(), Some(Next::Superseded)));
        assert!(matches!(Inbox::closed().try_next(), Some(Next::Closed)));
    }
}
