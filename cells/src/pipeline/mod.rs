//! The asynchronous half of the cell: after a write is acknowledged, the
//! outbox [`relay`] moves its event onto the queue and the [`processor`]
//! fans it out to users' sync queues; [`notify`] delivers notifications for
//! users with no online device. Each loop runs under a supervisor that
//! restarts it after an error.

pub mod notify;
pub mod processor;
pub mod relay;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::clock::Clock;
use crate::config::CellConfig;
use crate::queue::{EventQueue, QueueError};
use crate::storage::{StorageError, Store};
use crate::sync::Hub;
use processor::Processor;

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

/// Starts the relay, the processor and the notifier.
pub fn spawn(
    config: &CellConfig,
    store: Arc<Store>,
    queue: Arc<dyn EventQueue>,
    hub: Arc<Hub>,
    clock: Arc<dyn Clock>,
) -> Vec<JoinHandle<()>> {
    let notifications = Arc::new(Notify::new());
    let relay = {
        let (store, queue) = (store.clone(), queue.clone());
        supervise("relay", move || relay::run(store.clone(), queue.clone()))
    };
    let threshold = config.fanout.large_group_threshold as usize;
    let batch = config.fanout.batch;
    let group = config.processor_group();
    let processor = {
        let (store, queue, hub, clock, notifications) = (
            store.clone(),
            queue.clone(),
            hub.clone(),
            clock.clone(),
            notifications.clone(),
        );
        supervise("processor", move || {
            let (store, queue, hub, clock, notifications, group) = (
                store.clone(),
                queue.clone(),
                hub.clone(),
                clock.clone(),
                notifications.clone(),
                group.clone(),
            );
            async move {
                let consumer = queue.consumer(&group).await?;
                Processor::new(store, hub, clock, threshold, notifications)?
                    .run(consumer, batch)
                    .await
            }
        })
    };
    let notifier = {
        let sink = notify::sink(&config.notifications);
        supervise("notifier", move || {
            notify::run(store.clone(), sink.clone(), notifications.clone())
        })
    };
    vec![relay, processor, notifier]
}

/// Runs `make()` again whenever it fails, with capped backoff.
fn supervise<F, Fut>(name: &'static str, make: F) -> JoinHandle<()>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), PipelineError>> + Send,
{
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(50);
        loop {
            match make().await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(worker = name, error = %e, "pipeline worker failed; restarting");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    })
}
