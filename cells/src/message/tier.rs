//! The tierer: moves each conversation's history beyond the hot tier
//! (older than `tiering.hot_age_secs`, or beyond the newest
//! `hot_messages_per_conversation`) into cold segments, deletes segments
//! past their tenant's retention (never under legal hold), and sweeps the
//! objects of uploads whose manifest entry never committed.
//!
//! A segment goes: upload (noted as pending first), read back and
//! checksum, then — under the conversation's admin lock, with its hot rows
//! re-read unchanged and the route still settled here — one synced batch
//! that commits the manifest entry, deletes the hot rows and forgets the
//! pending note. A crash anywhere leaves the hot rows or a verified,
//! committed segment.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use cellmesh_proto::storage::v1::{MessageRecord, SegmentEntry};

use super::{Caller, MessageService};
use crate::cold::journal::Plan;
use crate::cold::{ColdTier, segment};
use crate::error::Result;
use crate::storage::{Mutation, keys};

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TierReport {
    pub segments_written: u64,
    pub messages_tiered: u64,
    pub segments_expired: u64,
    pub orphans_swept: u64,
    /// Conversations left hot because their tenant may not keep bytes in
    /// the cold store's region.
    pub held_for_residency: u64,
}

/// Conversations read per batch while scanning for history to tier.
const SCAN_BATCH: usize = 256;
/// Segments past retention deleted per pass at most.
const EXPIRE_BATCH: usize = 10_000;

impl MessageService {
    /// The cold tier, when `[tiering]` is on.
    pub fn cold(&self) -> Option<&Arc<ColdTier>> {
        self.cold.as_ref()
    }

    /// One pass of the tierer over every conversation here.
    pub async fn tier_once(&self) -> Result<TierReport> {
        let mut report = TierReport::default();
        let Some(cold) = self.cold.clone() else {
            return Ok(report);
        };
        report.orphans_swept = self.sweep_orphans(&cold, false).await?;
        let region = crate::config::store_region(&cold.config.region, &self.config.cell_id);
        let mut after = 0;
        loop {
            let batch = self.store.conversations_after(after, SCAN_BATCH)?;
            let Some(&(last, _)) = batch.last() else {
                break;
            };
            for (id, record) in batch {
                let tenant = TenantId(record.tenant_id);
                if !self.ownership.may_store_in(tenant, region) {
                    report.held_for_residency += 1;
                    continue;
                }
                let (segments, messages) = self
                    .tier_conversation(&cold, ConversationId(id), tenant)
                    .await?;
                report.segments_written += segments;
                report.messages_tiered += messages;
            }
            after = last;
        }
        if report.held_for_residency > 0 {
            tracing::warn!(
                reason = %cellmesh_proto::reason::Reason::ResidencyViolation,
                conversations = report.held_for_residency,
                region,
                "history left hot: its tenant may not keep bytes in the cold store's region (tiering.region)"
            );
        }
        report.segments_expired = self.expire_segments(&cold).await?;
        Ok(report)
    }

    /// Tiers what `conversation` holds beyond its hot tier; (segments,
    /// messages) written.
    async fn tier_conversation(
        &self,
        cold: &ColdTier,
        conversation: ConversationId,
        tenant: TenantId,
    ) -> Result<(u64, u64)> {
        let seq = self.store.conv_seq(conversation)?;
        // Only history this cell owns and will not be handed more of: not
        // while a move copies it, nor below a failover floor that a
        // backfill may still fill in.
        if !self.ownership.settled(tenant, conversation)
            || (seq.seq_floor > 0 && !self.backfilled(conversation, seq.seq_floor)?)
        {
            return Ok((0, 0));
        }
        let config = &cold.config;
        let count_cut = match config.hot_messages_per_conversation {
            0 => 0,
            keep => seq.latest_seq.saturating_sub(keep),
        };
        let age_cut = self
            .now_ms()
            .saturating_sub(config.hot_age_secs.saturating_mul(1000));
        let (mut segments, mut messages) = (0, 0);
        loop {
            let after = self.store.cold_through(conversation)?;
            let rows = self.store.messages_after(
                conversation,
                after,
                config.segment_max_messages as usize,
                config.segment_max_bytes,
            )?;
            // The newest message always stays hot (conversation lists show
            // it); a segment holds one UTC day.
            let day = rows.first().map(|(_, m)| segment::day_of(m.server_ts_ms));
            let take = rows
                .iter()
                .take_while(|(s, m)| {
                    *s < seq.latest_seq
                        && (*s <= count_cut || m.server_ts_ms < age_cut)
                        && Some(segment::day_of(m.server_ts_ms)) == day
                })
                .count();
            if take == 0 {
                break;
            }
            let rows = &rows[..take];
            if !self
                .tier_segment(cold, conversation, tenant, after, rows)
                .await?
            {
                break;
            }
            segments += 1;
            messages += rows.len() as u64;
        }
        Ok((segments, messages))
    }

    /// Writes `rows` (the hot rows right after seq `after`) as one
    /// segment; false when the conversation changed under it (tried again
    /// next pass).
    async fn tier_segment(
        &self,
        cold: &ColdTier,
        conversation: ConversationId,
        tenant: TenantId,
        after: u64,
        rows: &[(u64, MessageRecord)],
    ) -> Result<bool> {
        let (first, last) = (rows[0].0, rows[rows.len() - 1].0);
        let encoded = segment::encode(tenant, conversation, rows);
        let key = segment::object_key(tenant, conversation, first, last, &encoded.checksum);
        let pending = keys::meta::tier_pending(conversation, first, &key);
        self.store.put_meta_u64_sync(&pending, self.now_ms())?;
        let size = encoded.bytes.len() as u64;
        cold.put(&key, encoded.bytes).await?;
        cold.verify(&key, &encoded.checksum, conversation).await?;
        self.store.failpoints().abort_at("tiering.uploaded");
        let entry = SegmentEntry {
            tenant_id: tenant.get(),
            seq_start: first,
            seq_end: last,
            first_ts_ms: rows.iter().map(|(_, m)| m.server_ts_ms).min().unwrap_or(0),
            last_ts_ms: rows.iter().map(|(_, m)| m.server_ts_ms).max().unwrap_or(0),
            key,
            checksum: encoded.checksum,
            size,
            count: rows.len() as u32,
        };
        let conv = self.conversation(&Caller::new(tenant, UserId(0)), conversation.get())?;
        {
            let _admin = conv.admin.lock().await;
            let _writing = self.writing.read().await;
            let now = self
                .store
                .messages_after(conversation, after, rows.len(), usize::MAX)?;
            if now != rows || !self.ownership.settled(tenant, conversation) {
                return Ok(false);
            }
            let mut mutation = Mutation::new();
            mutation.tier_segment(conversation, &entry, after);
            mutation.clear_pending_upload(pending);
            self.store.commit(mutation).await?;
        }
        self.store.failpoints().abort_at("tiering.committed");
        let metrics = crate::metrics::metrics();
        metrics.segments_written.inc();
        metrics.messages_tiered.inc_by(rows.len() as u64);
        Ok(true)
    }

    /// Deletes the segments of conversations owned here whose newest
    /// message is past their tenant's retention (not under legal hold):
    /// the manifest entry first, then the object.
    async fn expire_segments(&self, cold: &ColdTier) -> Result<u64> {
        if cold
            .config
            .tenants
            .values()
            .all(|r| r.legal_hold || r.retention_days == 0)
        {
            return Ok(0);
        }
        let due = self.segments_past_retention(cold)?;
        let mut expired = 0;
        for (tenant, segments) in due {
            let retention_days = cold.config.retention_of(TenantId(tenant)).retention_days;
            let mut plan = Plan {
                segments: segments.len() as u64,
                ..Plan::default()
            };
            let mut previous = None;
            for (conversation, entry) in &segments {
                plan.messages += u64::from(entry.count);
                plan.newest_ms = plan.newest_ms.max(entry.last_ts_ms);
                if previous.replace(*conversation) != Some(*conversation) {
                    plan.conversations += 1;
                }
            }
            let record = match cold
                .journal
                .open(TenantId(tenant), retention_days, plan)
                .await
            {
                Ok(record) => record,
                Err(e) => {
                    tracing::warn!(tenant, error = %e, "retention: cannot record the deletion; deleting nothing this pass");
                    continue;
                }
            };
            let (mut deleted, mut messages) = (0, 0);
            let mut outcome = Ok(());
            for (conversation, entry) in segments {
                if let Err(e) = self
                    .expire_segment(cold, ConversationId(conversation), &entry, retention_days)
                    .await
                {
                    outcome = Err(e);
                    break;
                }
                deleted += 1;
                messages += u64::from(entry.count);
            }
            cold.journal
                .close(record, deleted, messages, outcome.as_ref().map(|_| ()))
                .await;
            expired += deleted;
            outcome?;
        }
        Ok(expired)
    }

    /// The segments past their tenant's retention (none under legal hold,
    /// only of conversations settled here), by tenant, at most
    /// `EXPIRE_BATCH` a pass.
    fn segments_past_retention(
        &self,
        cold: &ColdTier,
    ) -> Result<BTreeMap<u64, Vec<(u64, SegmentEntry)>>> {
        let now = self.now_ms();
        let (mut after, mut due, mut count) = ((0, 0), BTreeMap::<_, Vec<_>>::new(), 0);
        while count < EXPIRE_BATCH {
            let batch = self.store.all_segments(after, SCAN_BATCH)?;
            let Some((conversation, entry)) = batch.last() else {
                break;
            };
            after = (*conversation, entry.seq_start);
            for (conversation, entry) in batch {
                let retention = cold.config.retention_of(TenantId(entry.tenant_id));
                let horizon = u64::from(retention.retention_days) * 86_400_000;
                if retention.legal_hold
                    || horizon == 0
                    || entry.last_ts_ms >= now.saturating_sub(horizon)
                    || !self
                        .ownership
                        .settled(TenantId(entry.tenant_id), ConversationId(conversation))
                {
                    continue;
                }
                due.entry(entry.tenant_id)
                    .or_default()
                    .push((conversation, entry));
                count += 1;
            }
        }
        Ok(due)
    }

    /// Deletes one segment: its manifest entry first (no read finds it
    /// after), then the object.
    async fn expire_segment(
        &self,
        cold: &ColdTier,
        conversation: ConversationId,
        entry: &SegmentEntry,
        retention_days: u32,
    ) -> Result<()> {
        let mut mutation = Mutation::new();
        mutation.drop_segment(conversation, entry);
        // The messages' files go with them (the sweep deletes the objects).
        let files: Vec<_> = (self.segment_messages(conversation, entry).await?)
            .iter()
            .flat_map(|(_, m)| m.attachments.iter().cloned())
            .collect();
        let now = self.now_ms();
        self.forget_files(
            TenantId(entry.tenant_id),
            conversation,
            files,
            now,
            &mut mutation,
        );
        mutation.emit(&cellmesh_proto::storage::v1::OutboxEvent {
            kind: cellmesh_proto::storage::v1::OutboxKind::HistoryDropped as i32,
            tenant_id: entry.tenant_id,
            conversation_id: conversation.get(),
            items: vec![entry.seq_start, entry.seq_end],
            ..Default::default()
        });
        self.store.commit(mutation).await?;
        cold.delete(&entry.key).await?;
        crate::metrics::metrics().segments_deleted.inc();
        tracing::warn!(
            tenant = entry.tenant_id,
            %conversation,
            seq_start = entry.seq_start,
            seq_end = entry.seq_end,
            object = %entry.key,
            retention_days,
            "retention: deleted a cold segment"
        );
        Ok(())
    }

    /// Deletes the objects of uploads whose manifest entry never committed
    /// (older than `orphan_grace_secs`, or all of them with `all`: at
    /// start, when no upload of this cell is in flight).
    pub async fn sweep_orphans(&self, cold: &ColdTier, all: bool) -> Result<u64> {
        let grace = cold.config.orphan_grace_secs.saturating_mul(1000);
        let now = self.now_ms();
        let mut swept = 0;
        for pending in self.store.pending_uploads()? {
            if !all && pending.at_ms.saturating_add(grace) > now {
                continue;
            }
            let committed = self
                .store
                .segments(pending.conversation)?
                .iter()
                .any(|e| e.seq_start == pending.seq_start && e.key == pending.object);
            if !committed {
                cold.delete(&pending.object).await?;
                crate::metrics::metrics().segments_deleted.inc();
                tracing::warn!(object = %pending.object, "swept an orphan segment");
                swept += 1;
            }
            let mut mutation = Mutation::new();
            mutation.clear_pending_upload(pending.meta_key);
            self.store.commit(mutation).await?;
        }
        Ok(swept)
    }
}

/// Runs the tierer every `tiering.interval_ms` until the service is gone;
/// first sweeps what a crash left behind.
pub async fn run(service: Weak<MessageService>) {
    let Some(interval) = service
        .upgrade()
        .and_then(|s| s.cold().map(|c| c.config.interval_ms))
    else {
        return;
    };
    if let Some(s) = service.upgrade()
        && let Some(cold) = s.cold().cloned()
    {
        cold.journal.close_interrupted().await;
        if let Err(e) = s.sweep_orphans(&cold, true).await {
            tracing::warn!(error = %e, "cold tier: start-up sweep failed");
        }
    }
    loop {
        tokio::time::sleep(Duration::from_millis(interval)).await;
        let Some(s) = service.upgrade() else { return };
        match s.tier_once().await {
            Ok(report) if report != TierReport::default() => {
                tracing::info!(?report, "cold tier pass")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cold tier pass failed"),
        }
    }
}
