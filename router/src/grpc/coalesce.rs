//! Coalescing requests that arrive while earlier ones are being served: a
//! task gathers every request waiting (at most `max_batch`) and serves them
//! together. A batch goes at once when nothing is being served; beside
//! batches already under way it goes only when it has at least `wide`
//! requests and fewer than `in_flight` are under way — a small batch waits
//! and grows instead. Batched Raft proposals and shared leadership checks
//! both work so.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Notify, mpsc};

/// How many requests a batch takes and when it goes.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Batches under way at most.
    pub in_flight: usize,
    /// Requests in one batch at most.
    pub max_batch: usize,
    /// The fewest requests a batch needs to go while another is under way.
    pub wide: usize,
}

/// Starts the coalescing task; requests sent to the answer are served by
/// `serve`, a batch at a time, in arrival order within a batch.
pub fn start<T, F, Fut>(limits: Limits, serve: F) -> mpsc::UnboundedSender<T>
where
    T: Send + 'static,
    F: Fn(Vec<T>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, mut requests) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let under_way = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(Notify::new());
        let mut batch = Vec::new();
        let mut open = true;
        loop {
            while open && batch.len() < limits.max_batch {
                match requests.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => open = false,
                }
            }
            let n = under_way.load(Ordering::Acquire);
            let goes = !batch.is_empty()
                && (n == 0 || (n < limits.in_flight && batch.len() >= limits.wide));
            if goes {
                let slot = Slot::take(&under_way, &done);
                let served = serve(std::mem::take(&mut batch));
                tokio::spawn(async move {
                    served.await;
                    drop(slot);
                });
                continue;
            }
            if !open && batch.is_empty() {
                return;
            }
            // Wait for a batch to finish or another request to arrive.
            tokio::select! {
                _ = done.notified(), if n > 0 => {}
                next = requests.recv(), if open && batch.len() < limits.max_batch => match next {
                    Some(next) => batch.push(next),
                    None => open = false,
                },
            }
        }
    });
    tx
}

/// A batch under way; given back when dropped, also if serving panics.
struct Slot {
    under_way: Arc<AtomicUsize>,
    done: Arc<Notify>,
}

impl Slot {
    fn take(under_way: &Arc<AtomicUsize>, done: &Arc<Notify>) -> Self {
        under_way.fetch_add(1, Ordering::AcqRel);
        Self {
            under_way: under_way.clone(),
            done: done.clone(),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.under_way.fetch_sub(1, Ordering::AcqRel);
        self.done.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;
    use tokio::sync::oneshot;

    type Shared<T> = Arc<Mutex<Vec<T>>>;

    /// Serves batches by recording their sizes and holding each until
    /// released; returns the sender, the sizes served and the releases.
    fn recorder(
        limits: Limits,
    ) -> (
        mpsc::UnboundedSender<u32>,
        Shared<usize>,
        Shared<oneshot::Sender<()>>,
    ) {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let holds: Shared<oneshot::Sender<()>> = Arc::default();
        let (s, h) = (sizes.clone(), holds.clone());
        let tx = start(limits, move |batch: Vec<u32>| {
            s.lock().unwrap().push(batch.len());
            let (release, held) = oneshot::channel();
            h.lock().unwrap().push(release);
            async move {
                let _ = held.await;
            }
        });
        (tx, sizes, holds)
    }

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    /// Sends `count` requests, lets the coalescer run, and checks the
    /// sizes of the batches served so far.
    async fn step(
        tx: &mpsc::UnboundedSender<u32>,
        count: u32,
        sizes: &Shared<usize>,
        served: &[usize],
        why: &str,
    ) {
        for i in 0..count {
            tx.send(i).unwrap();
        }
        settle().await;
        assert_eq!(*sizes.lock().unwrap(), served, "{why}");
    }

    #[tokio::test]
    async fn small_batches_wait_for_the_one_under_way_and_wide_ones_join_it() {
        let limits = Limits {
            in_flight: 3,
            max_batch: 100,
            wide: 10,
        };
        let (tx, sizes, holds) = recorder(limits);
        step(&tx, 1, &sizes, &[1], "nothing under way: goes at once").await;
        step(&tx, 4, &sizes, &[1], "four wait beside one under way").await;
        step(&tx, 8, &sizes, &[1, 12], "twelve are wide enough").await;
        step(&tx, 25, &sizes, &[1, 12, 25], "a third under way").await;
        let why = "three under way: the fourth batch waits";
        step(&tx, 30, &sizes, &[1, 12, 25], why).await;
        let first = holds.lock().unwrap().remove(0);
        first.send(()).unwrap();
        step(&tx, 0, &sizes, &[1, 12, 25, 30], "a place freed").await;
        step(&tx, 1, &sizes, &[1, 12, 25, 30], "small: waits").await;
        for release in holds.lock().unwrap().drain(..) {
            release.send(()).unwrap();
        }
        let why = "a small batch goes once nothing else is under way";
        step(&tx, 0, &sizes, &[1, 12, 25, 30, 1], why).await;
    }

    #[tokio::test]
    async fn a_batch_takes_at_most_max_batch_and_what_waits_is_served_after_close() {
        let limits = Limits {
            in_flight: 1,
            max_batch: 4,
            wide: 1,
        };
        let (tx, sizes, holds) = recorder(limits);
        tx.send(0).unwrap();
        settle().await;
        for i in 1..=6 {
            tx.send(i).unwrap();
        }
        drop(tx);
        for served in [vec![1], vec![1, 4], vec![1, 4, 2]] {
            settle().await;
            assert_eq!(*sizes.lock().unwrap(), served);
            let release = holds.lock().unwrap().remove(0);
            release.send(()).unwrap();
        }
    }

    #[tokio::test]
    async fn a_batch_whose_serving_panics_gives_its_place_back() {
        let served = Arc::new(Mutex::new(Vec::new()));
        let s = served.clone();
        let limits = Limits {
            in_flight: 1,
            max_batch: 10,
            wide: 1,
        };
        let tx = start(limits, move |batch: Vec<u32>| {
            let s = s.clone();
            async move {
                assert!(!batch.contains(&0), "serving failed");
                s.lock().unwrap().extend(batch);
            }
        });
        tx.send(0).unwrap();
        settle().await;
        tx.send(1).unwrap();
        settle().await;
        assert_eq!(*served.lock().unwrap(), vec![1]);
    }
}
