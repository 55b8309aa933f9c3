//! Group commit. Writes go through two lanes, each owned by one thread: the
//! message lane (sends, updates, the relay, consumers, everything else) and
//! the fan-out lane (the processor's sync-queue appends). A lane takes all
//! mutations queued while its previous batch was being written, applies
//! them as one WriteBatch (its writes in key order: [`batch`]) with the WAL
//! fsynced, and only then answers their callers. Concurrent writers
//! therefore share one fsync, and within a lane the order in which
//! mutations are queued is the order in which they become durable. The two
//! lanes write concurrently, each batch inserted into the memtables on its
//! lane's thread. Nothing orders one lane after the other; the fan-out
//! lane only writes what follows from records already durable.
//! Outbox events, whose ids must become visible in order, go through the
//! message lane only. The fan-out lane writes without a sync of its own and
//! answers once a sync of the message lane's begun after its write has
//! ended, or syncs itself when the message lane is idle (see [`wal_sync`]):
//! every batch is durable before it is answered, with one fsync for both
//! lanes where there were two.
//!
//! A failed write leaves the store refusing every later write, in both
//! lanes: after an fsync error the state of the WAL is unknown, and
//! accepting writes on top of it could acknowledge something a restart
//! would not find.

use crate::failpoints::{Action, FailPoints};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

use rocksdb::{DB, IteratorMode, WriteOptions};
use tokio::sync::{Notify, mpsc, oneshot, watch};

use super::batch;
use super::changes::Changes;
use super::keys::{self, cf};
use super::mirror::Views;
use super::unsynced::Unsynced;
use super::wal_sync::{self, WalSyncs};
use super::{Mutation, Result, StorageError};
use crate::config::StorageConfig;

/// Counters of the commit path.
#[derive(Debug, Default)]
pub struct CommitStats {
    /// Mutations made durable.
    pub mutations: AtomicU64,
    /// WriteBatches written (each one WAL sync).
    pub batches: AtomicU64,
    /// Keys written (puts, deletes, merges, outbox events).
    pub keys: AtomicU64,
    /// WAL syncs the fan-out lane made itself, finding no sync of the
    /// message lane's to wait for (the rest of its batches rode on those).
    pub fan_out_syncs: AtomicU64,
    /// The last outbox event id written, and the last one the relay moved
    /// to the queue: their difference is the outbox lag.
    pub outbox_written: AtomicU64,
    pub outbox_relayed: AtomicU64,
}

impl CommitStats {
    /// Records that the relay moved the outbox up to `id`, and publishes
    /// the lag.
    pub fn relayed_through(&self, id: u64) {
        self.outbox_relayed.fetch_max(id, Ordering::Relaxed);
        self.publish_outbox_lag();
    }

    fn publish_outbox_lag(&self) {
        let written = self.outbox_written.load(Ordering::Relaxed);
        let relayed = self.outbox_relayed.load(Ordering::Relaxed);
        crate::metrics::metrics()
            .outbox_lag_events
            .set(written.saturating_sub(relayed) as i64);
    }
}

struct Job {
    mutation: Mutation,
    reply: oneshot::Sender<Result<Written>>,
}

/// The group commit a mutation was durable in.
#[derive(Debug, Clone, Copy)]
pub struct Written {
    /// Mutations in the batch.
    pub batch: usize,
    /// Seconds the batch's write and fsync took.
    pub seconds: f64,
}

/// Which thread applies a mutation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    Message,
    FanOut,
}

struct LaneQueue {
    tx: RwLock<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

pub(super) struct Committer {
    message: LaneQueue,
    fan_out: LaneQueue,
    stats: Arc<CommitStats>,
    failed: Arc<Mutex<Option<String>>>,
    outbox_signal: Arc<Notify>,
    outbox_written: Arc<watch::Sender<u64>>,
}

/// A reserved place in the commit queue.
pub struct CommitSlot(mpsc::OwnedPermit<Job>);

/// The pending outcome of a submitted mutation.
pub struct CommitTicket(oneshot::Receiver<Result<Written>>);

impl CommitSlot {
    /// Queues `mutation` without waiting; its place in the durable order is
    /// fixed by this call.
    pub fn submit(self, mutation: Mutation) -> CommitTicket {
        let (reply, rx) = oneshot::channel();
        self.0.send(Job { mutation, reply });
        CommitTicket(rx)
    }
}

impl CommitTicket {
    pub async fn wait(self) -> Result<()> {
        self.written().await.map(|_| ())
    }

    /// Waits, and says which group commit made the mutation durable.
    pub async fn written(self) -> Result<Written> {
        self.0.await.unwrap_or(Err(StorageError::Closed))
    }
}

impl Committer {
    pub(super) fn start(
        db: Arc<DB>,
        config: &StorageConfig,
        failpoints: Arc<FailPoints>,
        changes: Arc<Changes>,
        views: Arc<Views>,
        unsynced: Arc<Unsynced>,
    ) -> Result<Self> {
        let stats = Arc::new(CommitStats::default());
        let failed = Arc::new(Mutex::new(None));
        let next_outbox_id = last_outbox_id(&db)? + 1;
        // Until the relay's first round says otherwise.
        stats
            .outbox_written
            .store(next_outbox_id - 1, Ordering::Relaxed);
        stats
            .outbox_relayed
            .store(next_outbox_id - 1, Ordering::Relaxed);
        let outbox_signal = Arc::new(Notify::new());
        let outbox_written = Arc::new(watch::Sender::new(next_outbox_id - 1));
        let syncs = Arc::new(WalSyncs::default());
        let lane = |kind: Lane, name: &str, label: &'static str, nice: i32| -> Result<LaneQueue> {
            let (tx, rx) = mpsc::channel(config.commit_queue_depth);
            let mut writer = Writer {
                outbox_signal: outbox_signal.clone(),
                outbox_written: outbox_written.clone(),
                db: db.clone(),
                sync: config.sync_wal,
                max_batch: config.group_commit_max_batch,
                next_outbox_id,
                stats: stats.clone(),
                failed: failed.clone(),
                failpoints: failpoints.clone(),
                changes: changes.clone(),
                views: views.clone(),
                lane: crate::metrics::LaneLabel { lane: label },
                kind,
                syncs: syncs.clone(),
                unsynced: unsynced.clone(),
            };
            let thread_name = name.to_string();
            let thread = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    crate::priority::set_this_thread(nice, &thread_name);
                    writer.run(rx)
                })
                .map_err(|e| StorageError::Failed(format!("cannot start commit thread: {e}")))?;
            Ok(LaneQueue {
                tx: RwLock::new(Some(tx)),
                thread: Mutex::new(Some(thread)),
            })
        };
        Ok(Self {
            // The message lane keeps the process's priority: sends measured
            // slower with it raised (see `priority`).
            message: lane(Lane::Message, "cellmesh-commit", "message", 0)?,
            fan_out: lane(
                Lane::FanOut,
                "cellmesh-fanout",
                "fanout",
                config.fanout_nice,
            )?,
            stats,
            failed,
            outbox_signal,
            outbox_written,
        })
    }

    pub(super) async fn reserve(&self, lane: Lane) -> Result<CommitSlot> {
        let queue = match lane {
            Lane::Message => &self.message,
            Lane::FanOut => &self.fan_out,
        };
        let tx = queue
            .tx
            .read()
            .expect("commit sender lock")
            .clone()
            .ok_or(StorageError::Closed)?;
        let permit = tx.reserve_owned().await.map_err(|_| StorageError::Closed)?;
        Ok(CommitSlot(permit))
    }

    pub(super) fn stats(&self) -> &CommitStats {
        &self.stats
    }

    pub(super) fn outbox_signal(&self) -> Arc<Notify> {
        self.outbox_signal.clone()
    }

    pub(super) fn outbox_written(&self) -> watch::Receiver<u64> {
        self.outbox_written.subscribe()
    }

    /// The last outbox id published: its commit is durable and the caches
    /// it changed are updated (see [`Writer::write`]).
    pub(super) fn outbox_published(&self) -> u64 {
        *self.outbox_written.borrow()
    }

    pub(super) fn failed(&self) -> Option<String> {
        self.failed.lock().expect("failed lock").clone()
    }

    /// Closes the queues and waits until every queued mutation is answered.
    pub(super) fn stop(&self) {
        for queue in [&self.message, &self.fan_out] {
            queue.tx.write().expect("commit sender lock").take();
            if let Some(thread) = queue.thread.lock().expect("thread lock").take() {
                let _ = thread.join();
            }
        }
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The highest outbox id ever issued: the last event still in the outbox,
/// or, once the relay has moved and dropped them all, its cursor. Ids are
/// never issued twice: the processor takes an event whose id it has seen
/// for a redelivery.
fn last_outbox_id(db: &DB) -> Result<u64> {
    let corrupt = |cf: &'static str, detail: &str| StorageError::Corrupt {
        cf,
        detail: detail.into(),
    };
    let handle = db.cf_handle(cf::OUTBOX).expect("outbox column family");
    let last = match db.iterator_cf(handle, IteratorMode::End).next() {
        None => 0,
        Some(item) => {
            let (key, _) = item?;
            keys::decode_u64(&key).ok_or_else(|| corrupt(cf::OUTBOX, "bad key"))?
        }
    };
    let meta = db.cf_handle(cf::META).expect("meta column family");
    let relayed = match db.get_pinned_cf(meta, keys::meta::RELAY_CURSOR)? {
        None => 0,
        Some(v) => keys::decode_u64(&v).ok_or_else(|| corrupt(cf::META, "bad relay cursor"))?,
    };
    Ok(last.max(relayed))
}

struct Writer {
    db: Arc<DB>,
    sync: bool,
    max_batch: usize,
    next_outbox_id: u64,
    stats: Arc<CommitStats>,
    failed: Arc<Mutex<Option<String>>>,
    outbox_signal: Arc<Notify>,
    outbox_written: Arc<watch::Sender<u64>>,
    failpoints: Arc<FailPoints>,
    changes: Arc<Changes>,
    views: Arc<Views>,
    lane: crate::metrics::LaneLabel,
    kind: Lane,
    syncs: Arc<WalSyncs>,
    unsynced: Arc<Unsynced>,
}

impl Writer {
    fn run(&mut self, mut rx: mpsc::Receiver<Job>) {
        let mut jobs = Vec::with_capacity(self.max_batch);
        while let Some(first) = self.next_job(&mut rx) {
            jobs.push(first);
            while jobs.len() < self.max_batch {
                match rx.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
            let outcome = self.write(&jobs);
            for job in jobs.drain(..) {
                let _ = job.reply.send(outcome.clone());
            }
        }
    }

    /// The next job, saying while it waits for one when this is the
    /// message lane (the fan-out lane then stops waiting for its syncs).
    fn next_job(&self, rx: &mut mpsc::Receiver<Job>) -> Option<Job> {
        if self.kind != Lane::Message {
            return rx.blocking_recv();
        }
        match rx.try_recv() {
            Ok(job) => Some(job),
            Err(mpsc::error::TryRecvError::Disconnected) => None,
            Err(mpsc::error::TryRecvError::Empty) => {
                self.syncs.set_idle(true);
                // Closed: idle for good.
                let job = rx.blocking_recv()?;
                self.syncs.set_idle(false);
                Some(job)
            }
        }
    }

    /// Whether this lane's writes wait for another lane's sync instead of
    /// their own.
    fn rides_on_syncs(&self) -> bool {
        self.sync && self.kind == Lane::FanOut
    }

    /// After a write without sync: returns once it is durable, through a
    /// later sync of the message lane's or one of its own.
    fn await_sync(&self) -> Result<(), String> {
        if let Some(Action::Delay(d)) = self.failpoints.hit("storage.fan_out_unsynced") {
            std::thread::sleep(d);
        }
        let mark = self.syncs.mark();
        if !self.syncs.covered(mark, wal_sync::COVER_WAIT) {
            self.refuse_if_failed()?;
            self.stats.fan_out_syncs.fetch_add(1, Ordering::Relaxed);
            let sync = self.syncs.begin();
            let synced = self.db.flush_wal(true).map_err(|e| e.to_string());
            self.syncs.end(sync, synced.is_ok());
            synced?;
        }
        // A sync that failed meanwhile leaves the log's state unknown.
        self.refuse_if_failed()
    }

    fn refuse_if_failed(&self) -> Result<(), String> {
        match self.failed.lock().expect("failed lock").clone() {
            Some(reason) => Err(reason),
            None => Ok(()),
        }
    }

    fn write(&mut self, jobs: &[Job]) -> Result<Written, StorageError> {
        self.refuse_if_failed().map_err(StorageError::Failed)?;
        let mutations: Vec<&Mutation> = jobs.iter().map(|j| &j.mutation).collect();
        let written = mutations.iter().map(|m| m.len() as u64).sum();
        let (batch, outbox_id) = batch::write_batch(&self.db, &mutations, self.next_outbox_id);
        let mut opts = WriteOptions::default();
        let rides = self.rides_on_syncs();
        opts.set_sync(self.sync && !rides);
        if let Some(Action::Delay(d)) = self.failpoints.hit("storage.slow_write") {
            std::thread::sleep(d);
        }
        let started = std::time::Instant::now();
        let written_batch = match self.failpoints.hit("storage.fsync_error") {
            Some(Action::Error) => {
                Err("IO error: fsync failed (fail point storage.fsync_error)".to_string())
            }
            _ if rides => {
                // Readers see the batch's sync events once it is durable.
                self.unsynced.hold(jobs.iter().map(|j| &j.mutation));
                let durable = (self.db.write_opt(batch, &opts).map_err(|e| e.to_string()))
                    .and_then(|()| self.await_sync());
                if durable.is_ok() {
                    self.unsynced.release();
                }
                durable
            }
            _ => {
                let sync = self.sync.then(|| self.syncs.begin());
                let written = self.db.write_opt(batch, &opts).map_err(|e| e.to_string());
                if let Some(sync) = sync {
                    self.syncs.end(sync, written.is_ok());
                }
                written
            }
        };
        match written_batch {
            Ok(()) => {
                let seconds = started.elapsed().as_secs_f64();
                (self.views).note(jobs.iter().flat_map(|j| &j.mutation.ops));
                let metrics = crate::metrics::metrics();
                metrics
                    .commit_write_seconds
                    .get_or_create(&self.lane)
                    .observe(seconds);
                metrics
                    .commit_batch_mutations
                    .get_or_create(&self.lane)
                    .observe(jobs.len() as f64);
                if outbox_id != self.next_outbox_id {
                    self.stats
                        .outbox_written
                        .store(outbox_id - 1, Ordering::Relaxed);
                    self.stats.publish_outbox_lag();
                    self.outbox_signal.notify_one();
                    self.outbox_written.send_replace(outbox_id - 1);
                }
                self.next_outbox_id = outbox_id;
                // Before the writers hear it is durable: a seal that waits
                // for them finds their keys noted.
                (self.changes).note(jobs.iter().flat_map(|j| &j.mutation.ops));
                self.stats.keys.fetch_add(written, Ordering::Relaxed);
                self.stats.batches.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .mutations
                    .fetch_add(jobs.len() as u64, Ordering::Relaxed);
                Ok(Written {
                    batch: jobs.len(),
                    seconds,
                })
            }
            Err(e) => {
                // Counted once: a fan-out batch waiting on the message
                // lane's failed sync fails with that lane's reason.
                let mut failed = self.failed.lock().expect("failed lock");
                if failed.is_none() {
                    crate::metrics::metrics().commit_failed.inc();
                    tracing::error!(error = %e, "write batch failed; storage now refuses writes");
                    *failed = Some(e.clone());
                }
                Err(StorageError::Failed(e))
            }
        }
    }
}

impl Clone for StorageError {
    fn clone(&self) -> Self {
        match self {
            StorageError::Corrupt { cf, detail } => StorageError::Corrupt {
                cf,
                detail: detail.clone(),
            },
            StorageError::Closed => StorageError::Closed,
            other => StorageError::Failed(other.to_string()),
        }
    }
}
