//! How the pipeline's long-running workers run: each is rebuilt after an
//! error with a growing pause ([`supervise`]), on the cell's runtime or, for
//! the serial stage every push waits for, on a thread and runtime of its
//! own ([`supervise_alone`]).

use std::future::Future;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::PipelineError;

/// A worker that ran this long before failing starts its backoff afresh.
const HEALTHY_RUN: Duration = Duration::from_secs(30);

/// Runs `make()` again whenever it fails, with capped backoff; a failure
/// after a long healthy run waits the shortest backoff again.
pub(crate) fn supervise<F, Fut>(name: &'static str, make: F) -> JoinHandle<()>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), PipelineError>> + Send + 'static,
{
    tokio::spawn(restarting(name, make))
}

/// [`supervise`] on a thread of its own, with a runtime of its own: a
/// serial stage every push waits for (the fan-out processor) is scheduled
/// by the OS beside the cell's runtime instead of queueing behind the
/// thousands of stream tasks on it. Aborting the handle stops the worker
/// and ends the thread; so does the shutdown of the runtime this is called
/// on (as a task on it would be dropped), which waits for the thread: a
/// process that returns from `main` leaves no worker using the store while
/// it exits. The thread runs at `nice` (see [`crate::priority`]).
pub(crate) fn supervise_alone<F, Fut>(name: &'static str, nice: i32, make: F) -> JoinHandle<()>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), PipelineError>> + Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::warn!(worker = name, error = %e, "no runtime of its own; on the cell's");
            return supervise(name, make);
        }
    };
    let (ended, end) = oneshot::channel::<()>();
    let (gone, thread_gone) = oneshot::channel::<()>();
    let handle = runtime.handle().clone();
    let thread = std::thread::Builder::new()
        .name(format!("cellmesh-{name}"))
        .spawn(move || {
            crate::priority::set_this_thread(nice, name);
            runtime.block_on(async move { _ = end.await });
            drop(runtime);
            let _ = gone.send(());
        });
    let thread = match thread {
        Ok(thread) => thread,
        Err(e) => {
            tracing::warn!(worker = name, error = %e, "no thread of its own; on the cell's runtime");
            return supervise(name, make);
        }
    };
    let task = handle.spawn(async move {
        // Dropped when the worker ends or is aborted: the thread then ends.
        let _ended = ended;
        restarting(name, make).await
    });
    let mut stop = StopOnDrop {
        worker: task.abort_handle(),
        thread: Some(thread),
    };
    // Lives as long as the thread: dropped by the caller's runtime shutting
    // down, it stops the worker and waits for the thread.
    tokio::spawn(async move {
        let _ = thread_gone.await;
        stop.thread.take();
    });
    task
}

/// Stops a worker running alone and waits for its thread to end.
struct StopOnDrop {
    worker: tokio::task::AbortHandle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.worker.abort();
        if thread.join().is_err() {
            tracing::error!("a pipeline worker's thread panicked");
        }
    }
}

/// Runs the worker `make` builds until it returns, building it afresh
/// after each error with a growing pause.
async fn restarting<F, Fut>(name: &'static str, make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), PipelineError>>,
{
    let mut backoff = Duration::from_millis(50);
    loop {
        let started = tokio::time::Instant::now();
        match make().await {
            Ok(()) => return,
            Err(e) => {
                if started.elapsed() >= HEALTHY_RUN {
                    backoff = Duration::from_millis(50);
                }
                tracing::warn!(worker = name, error = %e, "pipeline worker failed; restarting");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Names of this process's threads that start with `prefix` (the
    /// kernel keeps the first 15 bytes of a name).
    fn threads_named(prefix: &str) -> Vec<String> {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return Vec::new();
        };
        tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .map(|name| name.trim().to_string())
            .filter(|name| name.starts_with(prefix))
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_worker_alone_runs_on_its_own_thread_and_is_rebuilt_after_an_error() {
        let runs = Arc::new(AtomicUsize::new(0));
        let (tx, mut threads) = tokio::sync::mpsc::unbounded_channel();
        let handle = supervise_alone("sv-rebuilt", 0, {
            let runs = runs.clone();
            move || {
                let (runs, tx) = (runs.clone(), tx.clone());
                async move {
                    let name = std::thread::current().name().map(str::to_string);
                    let _ = tx.send(name);
                    match runs.fetch_add(1, Ordering::SeqCst) {
                        0 => Err(PipelineError::Stopped),
                        _ => Ok(()),
                    }
                }
            }
        });
        handle.await.expect("the worker ends once it returns Ok");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "rebuilt once after its error"
        );
        for _ in 0..2 {
            let name = threads.recv().await.expect("each run reports its thread");
            assert_eq!(name.as_deref(), Some("cellmesh-sv-rebuilt"));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn aborting_a_worker_alone_drops_it_and_ends_its_thread() {
        struct Dropped(Option<oneshot::Sender<()>>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                if let Some(tx) = self.0.take() {
                    let _ = tx.send(());
                }
            }
        }
        let (dropped_tx, dropped) = oneshot::channel();
        let guard = std::sync::Mutex::new(Some(dropped_tx));
        let made = Arc::new(AtomicUsize::new(0));
        let handle = supervise_alone("sv-aborted", 0, {
            let made = made.clone();
            move || {
                let guard = Dropped(guard.lock().unwrap().take());
                made.fetch_add(1, Ordering::SeqCst);
                async move {
                    let _guard = guard;
                    std::future::pending::<Result<(), PipelineError>>().await
                }
            }
        });
        let started = std::time::Instant::now();
        // Aborted only once the worker exists (its thread may be up before
        // its runtime first polls the task that builds it).
        while threads_named("cellmesh-sv-abo").is_empty() || made.load(Ordering::SeqCst) == 0 {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "its thread starts and builds the worker"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        handle.abort();
        assert!(handle.await.unwrap_err().is_cancelled());
        dropped.await.expect("the worker's future was dropped");
        while !threads_named("cellmesh-sv-abo").is_empty() {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "its thread ends"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
