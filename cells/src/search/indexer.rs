//! The indexer: its own consumer group on the cell's event queue, after the
//! ack like the fan-out processor and independent of it. Each event names a
//! message that changed (sent, edited, recalled, imported by a move or a
//! backfill) or history that left (retention, a move's cleanup); the
//! indexer reads a changed message's current state back from the history
//! and replaces its document, and removes what left. It commits the touched
//! tenants' indexes first and its queue position after, so a crash between
//! the two redelivers events whose documents are already there — and
//! replacing a document by its key adds nothing twice. A message sent
//! after the indexer started, and never handed to it before, cannot be in
//! the index: it is added without the replace, whose delete every segment
//! would otherwise look up.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellmesh_proto::storage::v1::{MessageRecord, OutboxEvent, OutboxKind};
use cellmesh_proto::v1::{MessageState, MessageType};

use super::{IndexedMessage, Search, TenantIndex};
use crate::failpoints::Action;
use crate::message::MessageService;
use crate::pipeline::PipelineError;
use crate::queue::{Delivery, EventQueue, QueueError};
use crate::storage::keys;

/// Events taken from the queue per poll.
const POLL: usize = 2_000;

/// The consumer group of the indexer (beside the processor's).
pub fn group(processor_group: &str) -> String {
    format!("{processor_group}.search")
}

/// The text of `record` the index holds: a text message's body and the
/// names of its files. `None`: nothing to find (recalled, or no text).
pub fn text_of(record: &MessageRecord) -> Option<String> {
    if record.state == MessageState::Recalled as i32 {
        return None;
    }
    let mut text = String::new();
    if record.r#type == MessageType::Text as i32 {
        text.push_str(&String::from_utf8_lossy(&record.body));
    }
    for a in &record.attachments {
        text.push('\n');
        text.push_str(&a.name);
    }
    (!text.trim().is_empty()).then_some(text)
}

/// The indexer under the pipeline's supervisor (restarted after an error).
pub fn supervised(
    search: Arc<Search>,
    service: Arc<MessageService>,
    queue: Arc<dyn EventQueue>,
    group: String,
) -> tokio::task::JoinHandle<()> {
    crate::pipeline::supervise("search indexer", move || {
        run(
            search.clone(),
            service.clone(),
            queue.clone(),
            group.clone(),
        )
    })
}

pub async fn run(
    search: Arc<Search>,
    messages: Arc<MessageService>,
    queue: Arc<dyn EventQueue>,
    group: String,
) -> Result<(), PipelineError> {
    let mut consumer = queue.consumer(&group).await?;
    build(&search, &messages).await?;
    // Outbox ids above this were never handed to the index: every event an
    // earlier run, or the build, may have indexed was written by now; and
    // within this run an id at or below the highest seen is a redelivery.
    let mut handed = messages.store().outbox_settled().await?;
    let interval = Duration::from_millis(search.config.commit_interval_ms);
    let mut pending: Vec<Delivery> = Vec::new();
    let mut touched = HashSet::new();
    let mut since: Option<Instant> = None;
    // The oldest acknowledgement (ms) of a message in the uncommitted batch.
    let mut oldest_ack: Option<u64> = None;
    loop {
        let wait = since.map_or(Duration::from_secs(1), |t| {
            interval.saturating_sub(t.elapsed())
        });
        let batch = consumer.poll(POLL, wait).await?;
        for d in &batch {
            let new = d.event.id > handed;
            handed = handed.max(d.event.id);
            if let Some(event) = &d.event.event
                && apply(&search, &messages, event, new).await?
            {
                touched.insert(event.tenant_id);
                if event.kind == OutboxKind::Message as i32 && event.server_ts_ms > 0 {
                    let t = oldest_ack.get_or_insert(event.server_ts_ms);
                    *t = (*t).min(event.server_ts_ms);
                }
            }
        }
        if !batch.is_empty() {
            since.get_or_insert_with(Instant::now);
            pending.extend(batch);
        }
        if since.is_some_and(|t| t.elapsed() >= interval) {
            search.commit(touched.drain())?;
            if messages.store().failpoints().hit("search.indexed") == Some(Action::Error) {
                return Err(PipelineError::Queue(QueueError::Unavailable(
                    "position not committed (fail point search.indexed)".into(),
                )));
            }
            consumer.commit(&pending).await?;
            let metrics = crate::metrics::metrics();
            metrics.search_indexed.inc_by(pending.len() as u64);
            if let Some(acked) = oldest_ack.take() {
                let lag = messages.now_ms().saturating_sub(acked) as f64 / 1000.0;
                metrics.search_lag_seconds.set(lag);
            }
            pending.clear();
            since = None;
        }
    }
}

/// Brings the index in line with one event; `true` when it changed.
/// `new`: the event was never handed to the index before.
async fn apply(
    search: &Search,
    messages: &MessageService,
    event: &OutboxEvent,
    new: bool,
) -> Result<bool, PipelineError> {
    if !search.config.searchable(TenantId(event.tenant_id)) {
        return Ok(false);
    }
    let kind = OutboxKind::try_from(event.kind).unwrap_or(OutboxKind::Unspecified);
    let index = search.tenant(TenantId(event.tenant_id))?;
    let conversation = ConversationId(event.conversation_id);
    let (first, last) = match kind {
        OutboxKind::Message | OutboxKind::Edit => (event.seq, event.seq),
        OutboxKind::Recall => {
            index.remove(conversation, event.seq);
            return Ok(true);
        }
        OutboxKind::HistoryDropped => {
            let seqs = match event.items[..] {
                [first, last] => Some((first, last)),
                _ => None,
            };
            index.remove_history(conversation, seqs)?;
            return Ok(true);
        }
        OutboxKind::HistoryImported => match event.items[..] {
            [first, last] if first <= last => (first, last),
            _ => return Ok(false),
        },
        _ => return Ok(false),
    };
    let new = new && kind == OutboxKind::Message;
    let after = index_range(&index, messages, conversation, (first, last), new).await?;
    // A single message no longer in the history (dropped since): out.
    if first == last && after < first && !new {
        index.remove(conversation, first);
    }
    Ok(true)
}

/// Re-indexes `first..=last` of `conversation` from the history; returns
/// the last seq it found. `new`: a single message the index cannot hold
/// yet (see [`TenantIndex::add_new`]).
async fn index_range(
    index: &TenantIndex,
    messages: &MessageService,
    conversation: ConversationId,
    (first, last): (u64, u64),
    new: bool,
) -> Result<u64, PipelineError> {
    // A new message is in the hot history: one point read, not a page.
    if first == last
        && let Some(record) = messages.store().message(conversation, first)?
    {
        index_one(index, conversation, first, &record, new)?;
        return Ok(first);
    }
    let mut after = first.saturating_sub(1);
    while after < last {
        let page = messages
            .history_for_index(conversation, after, last)
            .await
            .map_err(|e| PipelineError::History(Box::new(e)))?;
        let Some(&(end, _)) = page.last() else {
            break;
        };
        for (seq, record) in page {
            index_one(index, conversation, seq, &record, false)?;
        }
        after = end;
    }
    Ok(after)
}

/// Indexes the message at `seq` (or drops it from the index when it has
/// no text any more); a `new` one is added without the replace.
fn index_one(
    index: &TenantIndex,
    conversation: ConversationId,
    seq: u64,
    record: &MessageRecord,
    new: bool,
) -> Result<(), PipelineError> {
    match indexed(conversation, seq, record) {
        Some(indexed) if new => index.add_new(&indexed)?,
        Some(indexed) => index.upsert(&indexed)?,
        None if new => {}
        None => index.remove(conversation, seq),
    }
    Ok(())
}

/// The document of the message at `seq`; `None`: nothing to find in it.
fn indexed(
    conversation: ConversationId,
    seq: u64,
    record: &MessageRecord,
) -> Option<IndexedMessage> {
    Some(IndexedMessage {
        conversation,
        seq,
        msg_id: record.msg_id,
        sender: UserId(record.sender_id),
        ts_ms: record.server_ts_ms,
        text: text_of(record)?,
    })
}

/// Indexes every conversation stored here once, when search is first
/// enabled on a cell that holds history: resumable, it notes the last
/// conversation done after each page of them.
async fn build(search: &Search, messages: &MessageService) -> Result<(), PipelineError> {
    let store = messages.store();
    let mut after = match store.meta_u64(keys::meta::SEARCH_BUILT_THROUGH)? {
        Some(u64::MAX) => return Ok(()),
        Some(done) => done,
        None => 0,
    };
    loop {
        let page = store.conversations_after(after, 100)?;
        let Some(&(last, _)) = page.last() else {
            break;
        };
        let mut touched = HashSet::new();
        for (id, record) in page {
            if !search.config.searchable(TenantId(record.tenant_id)) {
                continue;
            }
            let latest = store.conv_seq(ConversationId(id))?.latest_seq;
            let index = search.tenant(TenantId(record.tenant_id))?;
            index_range(&index, messages, ConversationId(id), (1, latest), false).await?;
            touched.insert(record.tenant_id);
        }
        search.commit(touched)?;
        store.put_meta_u64_sync(keys::meta::SEARCH_BUILT_THROUGH, last)?;
        after = last;
    }
    store.put_meta_u64_sync(keys::meta::SEARCH_BUILT_THROUGH, u64::MAX)?;
    Ok(())
}
