//! The sync streams open through this edge, each with the claims of the
//! token that opened it. What a token allowed when a stream opened is not
//! allowed for ever: one sweep every [`RECHECK`] checks the token of every
//! open stream (expired, revoked, its user gone from the directory) and
//! ends those refused with the refusal. One task does it for all streams,
//! so an edge holding 10,000 idle streams wakes four times a second, not
//! 40,000 times; a stream pays one poll of its cut signal per push.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use cellmesh_proto::v1::SyncPush;
use futures::FutureExt;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::Stream;
use tonic::Status;

use crate::auth::Claims;

/// How often the open streams' tokens are checked.
pub const RECHECK: Duration = Duration::from_millis(250);

/// A sync stream as the edge answers it.
pub type PushStream = Pin<Box<dyn Stream<Item = Result<SyncPush, Status>> + Send>>;

/// The open streams of one edge.
#[derive(Default)]
pub struct OpenStreams {
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    next: u64,
    /// By registration: the claims, and where a refusal is sent.
    streams: HashMap<u64, (Claims, oneshot::Sender<Status>)>,
}

impl OpenStreams {
    fn lock(&self) -> MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `inner`, open under `claims` until it is dropped: a sweep that
    /// refuses them ends it with the refusal.
    pub fn cut_when_refused(self: &Arc<Self>, inner: PushStream, claims: Claims) -> PushStream {
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut open = self.lock();
            open.next += 1;
            let id = open.next;
            open.streams.insert(id, (claims, tx));
            id
        };
        Box::pin(Cut {
            inner: Some(inner),
            cut: Some(rx),
            _open: Registered {
                streams: Arc::downgrade(self),
                id,
            },
        })
    }

    /// Ends every open stream whose claims `check` refuses; how many.
    pub fn sweep(&self, check: impl Fn(&Claims) -> Result<(), Status>) -> usize {
        let mut open = self.lock();
        let refused: Vec<(u64, Status)> = (open.streams.iter())
            .filter_map(|(id, (claims, _))| check(claims).err().map(|status| (*id, status)))
            .collect();
        for (id, status) in &refused {
            if let Some((_, cut)) = open.streams.remove(id) {
                let _ = cut.send(status.clone());
            }
        }
        refused.len()
    }

    /// Ends every open stream with `status`: the edge is stopping.
    pub fn end_all(&self, status: Status) -> usize {
        self.sweep(|_| Err(status.clone()))
    }

    /// Streams open now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().streams.len()
    }

    /// Sweeps with `check` every [`RECHECK`] while these streams are kept.
    pub fn spawn_sweeper(
        self: &Arc<Self>,
        check: impl Fn(&Claims) -> Result<(), Status> + Send + 'static,
    ) -> JoinHandle<()> {
        let streams = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RECHECK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(streams) = streams.upgrade() else {
                    return;
                };
                streams.sweep(&check);
            }
        })
    }
}

/// Removes its stream from the open ones when the stream is dropped.
struct Registered {
    streams: Weak<OpenStreams>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(streams) = self.streams.upgrade() {
            streams.lock().streams.remove(&self.id);
        }
    }
}

/// What a device's stream ends with when its edge stops: try again (on
/// this edge once it is back, or another).
pub fn stopping() -> Status {
    cellmesh_proto::status::to_status(
        cellmesh_proto::v1::ErrorCode::RetryLater,
        cellmesh_proto::reason::Reason::Stopping,
        "the edge is stopping; subscribe again".into(),
        100,
        None,
    )
}

/// An open stream: its pushes until a sweep refuses its token, then the
/// refusal, then nothing.
struct Cut {
    inner: Option<PushStream>,
    /// `None` once the registry is gone (the edge stopping).
    cut: Option<oneshot::Receiver<Status>>,
    _open: Registered,
}

impl Stream for Cut {
    type Item = Result<SyncPush, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(cut) = this.cut.as_mut()
            && let Poll::Ready(refused) = cut.poll_unpin(cx)
        {
            this.cut = None;
            if let Ok(status) = refused {
                this.inner = None;
                return Poll::Ready(Some(Err(status)));
            }
        }
        match this.inner.as_mut() {
            Some(inner) => inner.as_mut().poll_next(cx),
            None => Poll::Ready(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellmesh_proto::ids::{TenantId, UserId};
    use tokio_stream::StreamExt;

    fn claims(user: u64) -> Claims {
        Claims {
            tenant: TenantId(1),
            user: UserId(user),
            device: "d".into(),
            exp: u64::MAX,
            iat: 0,
            jti: format!("t{user}"),
            kid: String::new(),
        }
    }

    /// A stream that yields `n` pushes, then stays open.
    fn pushes(n: u64) -> PushStream {
        let items = (0..n).map(|_| Ok(SyncPush::default()));
        Box::pin(tokio_stream::iter(items).chain(futures::stream::pending()))
    }

    #[tokio::test]
    async fn a_refused_stream_ends_with_the_refusal_and_the_others_go_on() {
        let streams = Arc::new(OpenStreams::default());
        let mut kept = streams.cut_when_refused(pushes(2), claims(1));
        let mut refused = streams.cut_when_refused(pushes(2), claims(2));
        assert!(refused.next().await.unwrap().is_ok());
        let cut = streams.sweep(|c| match c.user {
            UserId(2) => Err(Status::unauthenticated("revoked")),
            _ => Ok(()),
        });
        assert_eq!((cut, streams.len()), (1, 1));
        let status = refused.next().await.unwrap().unwrap_err();
        assert_eq!(status.message(), "revoked");
        assert!(refused.next().await.is_none(), "nothing after the refusal");
        assert!(kept.next().await.unwrap().is_ok());
        assert!(kept.next().await.unwrap().is_ok());
        assert_eq!(streams.sweep(|_| Ok(())), 0);
    }

    #[tokio::test]
    async fn a_dropped_stream_is_no_longer_open_and_a_gone_registry_cuts_nothing() {
        let streams = Arc::new(OpenStreams::default());
        let first = streams.cut_when_refused(pushes(0), claims(1));
        let mut second = streams.cut_when_refused(pushes(1), claims(2));
        assert_eq!(streams.len(), 2);
        drop(first);
        assert_eq!(streams.len(), 1);
        drop(streams);
        assert!(second.next().await.unwrap().is_ok());
        let still_open = tokio::time::timeout(Duration::from_millis(50), second.next()).await;
        assert!(still_open.is_err(), "the stream stays open");
    }

    #[tokio::test]
    async fn the_sweeper_checks_every_recheck_until_the_streams_are_dropped() {
        let streams = Arc::new(OpenStreams::default());
        let mut stream = streams.cut_when_refused(pushes(0), claims(1));
        let refuse = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let refusing = refuse.clone();
        let sweeper = streams.spawn_sweeper(move |_| {
            match refusing.load(std::sync::atomic::Ordering::SeqCst) {
                true => Err(Status::unauthenticated("expired")),
                false => Ok(()),
            }
        });
        tokio::time::sleep(RECHECK * 3).await;
        assert_eq!(streams.len(), 1);
        refuse.store(true, std::sync::atomic::Ordering::SeqCst);
        let ended = tokio::time::timeout(RECHECK * 2, stream.next()).await;
        assert_eq!(ended.unwrap().unwrap().unwrap_err().message(), "expired");
        drop(stream);
        drop(streams);
        tokio::time::timeout(RECHECK * 2, sweeper)
            .await
            .expect("the sweeper ends with its streams")
            .unwrap();
    }
}
