//! The processor's loop, with one batch's commit overlapping the planning
//! of the next. A batch is planned, submitted to its commit lane, and
//! while RocksDB writes and fsyncs it the processor takes the events that
//! came meanwhile and plans them against its caches, which already hold
//! the submitted batch's pts and entries. Only then does it wait for the
//! commit, announce the durable batch (pushes, hints, queue positions) and
//! submit the next one. So at most one commit is in flight, commits stay in
//! queue order, nothing is pushed before it is durable, and a failed commit
//! drops the planned batch with the caches: the restarted processor reads
//! storage after every submitted commit has finished.

use super::*;

/// A submitted batch: announced once its commit is durable.
pub(super) struct Pending {
    ticket: Option<CommitTicket>,
    batch: Batch,
    deliveries: Vec<Delivery>,
    /// The consumer commits the positions after the batch is durable
    /// (they are not in the batch's own commit).
    commit_positions: bool,
}

impl Pending {
    /// Waits for the commit without announcing it (the processor is
    /// stopping on an error).
    pub(super) async fn abandon(self) {
        if let Some(ticket) = self.ticket {
            let _ = ticket.wait().await;
        }
    }
}

impl Processor {
    pub(super) async fn run_overlapped(
        &mut self,
        consumer: &mut dyn EventConsumer,
        batch: usize,
        inbound: &mut mpsc::Receiver<Inbound>,
        wake: &Notify,
        pending: &mut Option<Pending>,
    ) -> Result<(), PipelineError> {
        loop {
            // Between polls (a poll is not safe to cancel midway), with
            // nothing in flight: these jobs commit on their own.
            while let Ok(job) = inbound.try_recv() {
                self.settle_pending(pending, consumer).await?;
                self.handle(job).await;
            }
            // With a commit in flight, only what has already arrived.
            let wait = match pending {
                Some(_) => Duration::ZERO,
                None => POLL_WAIT,
            };
            // A job handed in meanwhile ends the wait (see `PeerInbound`).
            let deliveries = consumer.poll_or_woken(batch, wait, wake).await?;
            if deliveries.is_empty() {
                self.settle_pending(pending, consumer).await?;
                continue;
            }
            // A handover seen before planning is dealt with first.
            if self.store.handovers() != self.handovers_seen {
                self.settle_pending(pending, consumer).await?;
            }
            let (planned, commit_positions) = self.plan_staging(&deliveries, consumer)?;
            self.settle_pending(pending, consumer).await?;
            *pending = Some(self.submit(planned, deliveries, commit_positions).await?);
        }
    }

    async fn handle(&mut self, job: Inbound) {
        match job {
            Inbound::Deliver {
                source,
                events,
                view_behind,
                reply,
            } => {
                let applied = self.apply_remote(&source, &events, view_behind).await;
                let _ = reply.send(applied);
            }
            Inbound::ImportUsers { imports, reply } => {
                let _ = reply.send(self.import_users(imports).await);
            }
            Inbound::Barrier { reply } => {
                let _ = reply.send(());
            }
        }
    }

    /// Submits a planned batch (see [`Processor::submit_batch`]).
    pub(super) async fn submit(
        &mut self,
        mut batch: Batch,
        deliveries: Vec<Delivery>,
        commit_positions: bool,
    ) -> Result<Pending, PipelineError> {
        let ticket = self.submit_batch(&mut batch).await?;
        Ok(Pending {
            ticket,
            batch,
            deliveries,
            commit_positions,
        })
    }

    async fn settle_pending(
        &mut self,
        pending: &mut Option<Pending>,
        consumer: &mut dyn EventConsumer,
    ) -> Result<(), PipelineError> {
        match pending.take() {
            Some(p) => self.settle(p, Some(consumer)).await,
            None => Ok(()),
        }
    }

    /// Waits until `pending` is durable, announces it, commits its queue
    /// positions if they were not in it, and publishes how far processing
    /// got.
    pub(super) async fn settle(
        &mut self,
        pending: Pending,
        consumer: Option<&mut dyn EventConsumer>,
    ) -> Result<(), PipelineError> {
        let Pending {
            ticket,
            batch,
            deliveries,
            commit_positions,
        } = pending;
        self.durable(ticket, batch).await?;
        if let (true, Some(consumer)) = (commit_positions, consumer) {
            consumer.commit(&deliveries).await?;
        }
        let metrics = crate::metrics::metrics();
        let now_ms = self.clock.now_ms();
        for event in deliveries.iter().filter_map(|d| d.event.event.as_ref()) {
            if event.kind == OutboxKind::Message as i32 && event.server_ts_ms > 0 {
                let lag = now_ms.saturating_sub(event.server_ts_ms);
                metrics.fanout_lag_seconds.observe(lag as f64 / 1000.0);
            }
        }
        if let Some(last) = deliveries.iter().map(|d| d.event.id).max() {
            self.processed.send_if_modified(|p| {
                let higher = last > *p;
                *p = (*p).max(last);
                higher
            });
        }
        Ok(())
    }
}
