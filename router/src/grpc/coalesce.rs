//! Coalescing requests that arrive while earlier ones are being served: a
//! task takes every request waiting when a slot frees (at most `max_batch`)
//! and serves them together; at most `in_flight` batches are served at
//! once. Batched Raft proposals and shared leadership checks both work so.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc};

/// Starts the coalescing task; requests sent to the answer are served by
/// `serve`, a batch at a time, in arrival order within a batch.
pub fn start<T, F, Fut>(in_flight: usize, max_batch: usize, serve: F) -> mpsc::UnboundedSender<T>
where
    T: Send + 'static,
    F: Fn(Vec<T>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, mut requests) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let slots = Arc::new(Semaphore::new(in_flight));
        while let Some(first) = requests.recv().await {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            // Everything that arrived while the slot was awaited goes along.
            let mut batch = vec![first];
            while batch.len() < max_batch {
                match requests.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            let served = serve(batch);
            tokio::spawn(async move {
                served.await;
                drop(slot);
            });
        }
    });
    tx
}
