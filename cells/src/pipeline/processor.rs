//! The fan-out processor: consumes the queue and turns each event into the
//! per-user effects of DESIGN.md §4. Small conversations use write diffusion
//! (one sync event per member); conversations above the large-group
//! threshold use read diffusion (nothing per member: online members get a
//! transient hint, lists compute unread on read). A batch's effects are one
//! atomic commit; queue positions are committed only afterwards, and a
//! redelivered event is recognised per (user, conversation) by its event id,
//! so applying an event twice has no second effect.
//!
//! The processor is the only writer of sync queues and pts, so it keeps the
//! latest pts of recently active users in memory.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use cellmesh_proto::storage::v1::{
    ConvListEntry, ForwardRecord, IdempotencyRecord, NotificationBatch, NotificationRecord,
    OutboxEvent, OutboxKind, SyncRecord,
};
use cellmesh_proto::v1::{
    ConversationHint, ConversationMeta, Message, PeerEvent, SyncEventKind, SyncPush, UserState,
    sync_push,
};
use prost::Message as _;
use tokio::sync::{Notify, mpsc, oneshot};

use super::PipelineError;
use super::plan::{self, Fanout};
use super::standby::RecentAnswers;
use super::traced::{self, BatchTrace};
use crate::clock::Clock;
use crate::convert::message_to_proto;
use crate::failpoints::Action;
use crate::homes::{Home, Homes};
use crate::queue::{Delivery, EventConsumer};
use crate::storage::{ForwardQueue, IdemKey, IdemKind, Mutation, Store};
use crate::sync::{Hub, LiveEvent, event_message};
use crate::user::UserKey;

/// Membership as the fan-out plan reads it: this cell's store.
struct StoredMembers<'a> {
    store: &'a Store,
    conversation: u64,
}

impl plan::Members for StoredMembers<'_> {
    type Error = PipelineError;

    fn all(&self) -> Result<Vec<u64>, PipelineError> {
        Ok(self.store.members(self.conversation, 0, usize::MAX)?.0)
    }

    fn contains(&self, user: u64) -> Result<bool, PipelineError> {
        Ok(self.store.is_member(self.conversation, user)?)
    }
}

/// What other tasks hand the processor, the only writer of sync queues.
pub enum Inbound {
    /// Events another cell (`source`; "" for this cell's own forwards whose
    /// user turned out to live here) delivered.
    Deliver {
        source: String,
        events: Vec<PeerEvent>,
        view_behind: bool,
        reply: oneshot::Sender<Result<Delivered, PipelineError>>,
    },
    /// Copied chunks of moving user homes (distinct users), stored in one
    /// commit.
    ImportUsers {
        imports: Vec<UserImport>,
        reply: oneshot::Sender<Result<(), PipelineError>>,
    },
    /// Answered once every batch taken before it is durable.
    Barrier { reply: oneshot::Sender<()> },
}

/// The outcome of a [`Inbound::Deliver`].
#[derive(Debug, Default)]
pub struct Delivered {
    pub applied: u32,
    /// Users not homed here, whose events were left out.
    pub refused_users: Vec<UserKey>,
    /// Events for a standby left out (see [`Processor::replicated_by_owner`]).
    pub refused_standby: u32,
    /// Events for a standby left for later (their places in the delivery):
    /// refused by a route view older than the sender's.
    pub deferred_standby: Vec<u32>,
}

/// A copied part of a user's home (see [`Inbound::ImportUsers`]).
pub struct UserImport {
    pub user: UserKey,
    /// The cell the home is copied from.
    pub source: String,
    /// Drop what is stored here for the user first.
    pub reset: bool,
    pub events: Vec<(u64, SyncRecord)>,
    pub state: Option<UserState>,
}

/// How long a poll waits before the processor checks for inbound events.
const POLL_WAIT: Duration = Duration::from_millis(50);

/// Answers kept for standbys that join (seconds of sends at full load,
/// minutes at a moderate one).
const RECENT_ANSWERS: usize = 100_000;

/// Users whose pts stay cached.
const PTS_CACHE: usize = 1 << 20;

pub struct Processor {
    store: Arc<Store>,
    hub: Arc<Hub>,
    clock: Arc<dyn Clock>,
    large_group_threshold: usize,
    /// Latest durable pts per user.
    pts: HashMap<UserKey, u64>,
    next_notification: u64,
    notifications: Arc<Notify>,
    homes: Arc<dyn Homes>,
    /// Events for users' home cells, and copies for this cell's standbys.
    homes_queue: ForwardLane,
    standbys_queue: ForwardLane,
    /// Answers shipped lately, for standbys that join.
    recent: RecentAnswers,
    cell_id: String,
    /// Users this processor queued events for (a superset of those whose
    /// events still wait in the forward queue).
    queued_for: HashSet<UserKey>,
}

/// The signals a processor raises after a commit.
#[derive(Clone, Default)]
pub struct Signals {
    /// New notifications are queued.
    pub notifications: Arc<Notify>,
    /// New forwards to users' home cells are queued.
    pub forwards: Arc<Notify>,
    /// New copies for the standbys are queued.
    pub standby_forwards: Arc<Notify>,
}

/// One forward queue as the processor fills it: ids are issued from
/// memory, storage learns the high mark once per batch.
struct ForwardLane {
    queue: ForwardQueue,
    next: u64,
    signal: Arc<Notify>,
}

impl ForwardLane {
    fn open(
        store: &Store,
        queue: ForwardQueue,
        signal: Arc<Notify>,
    ) -> Result<Self, PipelineError> {
        Ok(Self {
            queue,
            next: store.forward_last_id(queue)? + 1,
            signal,
        })
    }

    /// Queues one record per endpoint; whether any was queued.
    fn stage(&mut self, m: &mut Mutation, records: HashMap<String, Vec<PeerEvent>>) -> bool {
        if records.is_empty() {
            return false;
        }
        for (endpoint, events) in records {
            let record = ForwardRecord {
                endpoint,
                events: events.iter().map(|e| e.encode_to_vec()).collect(),
                attempts: 0,
            };
            m.put_forward(self.next, &record);
            self.next += 1;
        }
        m.forwards_issued_through(self.queue, self.next - 1);
        true
    }
}

/// Effects of one batch, built before the commit and announced after it.
#[derive(Default)]
struct Batch {
    mutation: Mutation,
    /// Conversation-list entries by (user, conversation).
    entries: HashMap<(UserKey, u64), ConvListEntry>,
    pts: HashMap<UserKey, u64>,
    /// The events appended per user, kept for users with a live stream
    /// (looked up once per user and batch; `None`: nobody streams).
    appended: HashMap<UserKey, Option<Vec<(u64, SyncRecord)>>>,
    hints: Vec<(Vec<UserKey>, ConversationHint)>,
    /// Notifications for members with no online device: one record.
    notifications: Vec<NotificationRecord>,
    /// Events for users homed elsewhere (by home endpoint; "" while the
    /// home is frozen for a move, or behind queued events).
    forward: HashMap<String, Vec<PeerEvent>>,
    /// Conversation meta and answers for standbys (by standby endpoint).
    standby_forward: HashMap<String, Vec<PeerEvent>>,
    /// The users with events in `forward`.
    forwarded_users: HashSet<UserKey>,
    /// Users with events in the forward queue, once looked up.
    queued: Option<HashSet<UserKey>>,
    applied: u32,
    /// This cell's standbys, looked up once per batch.
    standbys: Option<Arc<[String]>>,
    /// The spans of the batch's traced events.
    trace: BatchTrace,
}

impl Batch {
    /// The endpoints of this cell's standbys (see [`Homes::standbys`]).
    fn standbys(&mut self, homes: &dyn Homes) -> Arc<[String]> {
        self.standbys
            .get_or_insert_with(|| homes.standbys().into())
            .clone()
    }

    /// Queues `event` for each of `standbys`.
    fn queue_for_standbys(&mut self, standbys: &[String], event: PeerEvent) {
        for endpoint in standbys {
            let queued = self.standby_forward.entry(endpoint.clone()).or_default();
            queued.push(event.clone());
        }
    }
}

/// Who caused an event: for notifications and forwarded events. The
/// event's users are of the same tenant.
#[derive(Clone, Copy)]
struct Origin {
    tenant: u64,
    sender: u64,
}

impl Origin {
    /// User `user` of the event's tenant.
    fn user(&self, user: u64) -> UserKey {
        UserKey::new(self.tenant, user)
    }

    fn sender(&self) -> UserKey {
        self.user(self.sender)
    }
}

impl Processor {
    pub fn new(
        store: Arc<Store>,
        hub: Arc<Hub>,
        clock: Arc<dyn Clock>,
        large_group_threshold: usize,
        homes: Arc<dyn Homes>,
        signals: Signals,
        cell_id: String,
    ) -> Result<Self, PipelineError> {
        let next_notification = store.notify_last_id()? + 1;
        let homes_queue = ForwardLane::open(&store, ForwardQueue::Homes, signals.forwards)?;
        let standbys_queue =
            ForwardLane::open(&store, ForwardQueue::Standbys, signals.standby_forwards)?;
        let queued_for = queued_users(&store)?;
        Ok(Self {
            store,
            hub,
            clock,
            large_group_threshold,
            pts: HashMap::new(),
            queued_for,
            next_notification,
            notifications: signals.notifications,
            homes,
            homes_queue,
            standbys_queue,
            recent: RecentAnswers::new(RECENT_ANSWERS),
            cell_id,
        })
    }

    /// Consumes until an error; the caller restarts with a fresh consumer,
    /// which redelivers whatever was not committed.
    pub async fn run(
        mut self,
        mut consumer: Box<dyn EventConsumer>,
        batch: usize,
        inbound: &mut mpsc::Receiver<Inbound>,
        wake: &Notify,
    ) -> Result<(), PipelineError> {
        loop {
            // Between polls (a poll is not safe to cancel midway).
            while let Ok(job) = inbound.try_recv() {
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
            // A job handed in meanwhile ends the wait (see `PeerInbound`).
            let deliveries = consumer.poll_or_woken(batch, POLL_WAIT, wake).await?;
            if deliveries.is_empty() {
                continue;
            }
            self.apply_and_commit(&deliveries, consumer.as_mut())
                .await?;
        }
    }

    /// Applies events another cell delivered for users homed here; says
    /// how many were new and which users do not live here.
    pub async fn apply_remote(
        &mut self,
        source: &str,
        events: &[PeerEvent],
        view_behind: bool,
    ) -> Result<Delivered, PipelineError> {
        let mut batch = Batch::default();
        let mut refused = Vec::new();
        let (mut refused_standby, mut deferred_standby) = (0, Vec::new());
        for (at, e) in events.iter().enumerate() {
            if super::for_standby(e)
                && let Err(why) = self.replicated_by_owner(source, e)
            {
                let what = if e.meta.is_some() { "meta" } else { "answer" };
                // A view older than the sender's may not know the move or
                // failover that makes the sender a holder: judge it later.
                if view_behind {
                    tracing::debug!(
                        source,
                        conversation = e.conversation_id,
                        "deferred a replicated {what}: {why}"
                    );
                    deferred_standby.push(at as u32);
                    continue;
                }
                tracing::warn!(
                    source,
                    tenant = e.tenant_id,
                    conversation = e.conversation_id,
                    "refused a replicated {what}: {why}"
                );
                refused_standby += 1;
                continue;
            }
            if let Some(meta) = &e.meta {
                self.apply_meta(&mut batch, e.conversation_id, meta)?;
                continue;
            }
            if let Some(answer) = &e.idempotency {
                self.keep_answer(&mut batch, e, answer)?;
                continue;
            }
            let user = UserKey::new(e.tenant_id, e.user_id);
            if refused.contains(&user) {
                continue;
            }
            if self.homes.home(user) != Home::Here {
                refused.push(user);
                continue;
            }
            batch.trace.event(traced::deliver(
                &e.traceparent,
                e.conversation_id,
                e.seq,
                e.user_id,
            ));
            let record = SyncRecord {
                kind: e.kind,
                conversation_id: e.conversation_id,
                seq: e.seq,
                msg_id: e.msg_id,
                items: e.items.clone(),
                server_ts_ms: e.server_ts_ms,
                remote_message: e
                    .message
                    .as_ref()
                    .map(|m| m.encode_to_vec())
                    .unwrap_or_default(),
            };
            if self.append(&mut batch, user, e.event_id, source, &record)?
                && e.kind == SyncEventKind::Message as i32
                && e.user_id != e.sender_id
            {
                let origin = Origin {
                    tenant: e.tenant_id,
                    sender: e.sender_id,
                };
                self.maybe_notify(&mut batch, user, &record, origin)?;
            }
        }
        let applied = batch.applied;
        self.finish(batch).await?;
        Ok(Delivered {
            applied,
            refused_users: refused,
            refused_standby,
            deferred_standby,
        })
    }

    /// Whether `source` may replicate `e` (a conversation's meta or a
    /// send's answer) to this cell (see [`super::standby`]).
    fn replicated_by_owner(&self, source: &str, e: &PeerEvent) -> Result<(), String> {
        if source.is_empty() {
            return Ok(());
        }
        let held = self.store.conversation(e.conversation_id).ok().flatten();
        let replicated = super::standby::Replicated {
            source,
            tenant: e.tenant_id,
            claimed_tenant: (e.meta.as_ref())
                .and_then(|m| m.record.as_ref())
                .map(|r| r.tenant_id),
            held_tenant: held.map(|h| h.tenant_id),
        };
        let owner = (self.homes).conversation_owner(e.tenant_id, e.conversation_id);
        super::standby::verdict(&self.cell_id, &replicated, owner.as_ref())
    }

    /// Stores copied parts of moving users' homes (distinct users), all in
    /// one commit. Dedupe positions that counted the source's own events
    /// now count them as the source's, and this cell's events forwarded
    /// there count as local again.
    async fn import_users(&mut self, imports: Vec<UserImport>) -> Result<(), PipelineError> {
        let mut batch = Batch::default();
        for import in &imports {
            self.stage_import(&mut batch, import)?;
        }
        let result = self.store.commit_fan_out(batch.mutation).await;
        for import in &imports {
            self.pts.remove(&import.user);
        }
        result?;
        for import in &imports {
            let pts = self.store.user_pts(import.user)?;
            self.hub.notify_pts(import.user, pts);
        }
        Ok(())
    }

    /// Adds one copied part of a home to `batch`.
    fn stage_import(
        &mut self,
        batch: &mut Batch,
        import: &UserImport,
    ) -> Result<(), PipelineError> {
        let user = import.user;
        if import.reset {
            self.store.clear_user(&mut batch.mutation, user)?;
        }
        for (pts, record) in &import.events {
            batch.mutation.put_sync(user, *pts, record);
        }
        for item in import.state.iter().flat_map(|s| &s.conversations) {
            let conversation = item.conversation_id;
            let mut entry = item.entry.clone().unwrap_or_default();
            if entry.last_event_source.is_empty() {
                entry.last_event_source = import.source.clone();
            } else if entry.last_event_source == self.cell_id {
                entry.last_event_source.clear();
            }
            batch.mutation.put_conv_list(user, conversation, &entry);
            batch.mutation.set_muted(user, conversation, item.muted);
            // A conversation this cell holds itself keeps its own record.
            if let Some(meta) = &item.meta
                && self.store.conversation(conversation)?.is_none()
            {
                self.apply_meta(batch, conversation, meta)?;
            }
        }
        for cursor in import.state.iter().flat_map(|s| &s.cursors) {
            batch
                .mutation
                .raise_device_cursor(user, &cursor.device, cursor.pts);
        }
        if let Some(state) = import.state.as_ref().filter(|s| s.queue_id != 0) {
            batch.mutation.set_queue_id(user, state.queue_id);
        }
        Ok(())
    }

    /// Keeps a send's answer replicated from the conversation's owner (this
    /// cell is its standby), unless this cell has an answer of its own.
    fn keep_answer(
        &mut self,
        batch: &mut Batch,
        e: &PeerEvent,
        answer: &IdempotencyRecord,
    ) -> Result<(), PipelineError> {
        let key = IdemKey {
            kind: IdemKind::Send,
            tenant: e.tenant_id,
            user: e.sender_id,
            client_req_id: e.client_req_id.clone(),
        };
        if !key.client_req_id.is_empty() && self.store.idempotency(&key)?.is_none() {
            batch.mutation.put_idempotency(&key, answer);
            batch.applied += 1;
        }
        Ok(())
    }

    /// Stores a replicated conversation meta: the record and exactly the
    /// members listed.
    fn apply_meta(
        &mut self,
        batch: &mut Batch,
        conversation: u64,
        meta: &ConversationMeta,
    ) -> Result<(), PipelineError> {
        let Some(record) = &meta.record else {
            return Ok(());
        };
        (self.store).stage_meta(&mut batch.mutation, conversation, record, &meta.members)?;
        batch.applied += 1;
        Ok(())
    }

    /// Makes the effects of `deliveries` durable and announces them to
    /// online devices. Does not commit queue positions.
    pub async fn apply(&mut self, deliveries: &[Delivery]) -> Result<(), PipelineError> {
        self.apply_staging(deliveries, None).await.map(|_| ())
    }

    /// [`Self::apply`], then records `deliveries` processed: in the same
    /// commit as their effects when the queue keeps its positions in this
    /// cell's store (one fsync instead of two), after it otherwise.
    pub async fn apply_and_commit(
        &mut self,
        deliveries: &[Delivery],
        consumer: &mut dyn EventConsumer,
    ) -> Result<(), PipelineError> {
        if !self.apply_staging(deliveries, Some(consumer)).await? {
            consumer.commit(deliveries).await?;
        }
        Ok(())
    }

    /// Applies `deliveries`; with `consumer`, stages their positions into
    /// the same commit if it can, and says whether it did.
    async fn apply_staging(
        &mut self,
        deliveries: &[Delivery],
        consumer: Option<&mut dyn EventConsumer>,
    ) -> Result<bool, PipelineError> {
        let metrics = crate::metrics::metrics();
        let now_ms = self.clock.now_ms();
        let age = |event: &OutboxEvent| now_ms.saturating_sub(event.server_ts_ms) as f64 / 1000.0;
        if let Some(newest) = deliveries.iter().rev().find_map(|d| d.event.event.as_ref()) {
            metrics.queue_lag_seconds.set(age(newest));
        }
        let mut batch = Batch::default();
        for delivery in deliveries {
            let Some(event) = &delivery.event.event else {
                continue;
            };
            self.apply_event(&mut batch, delivery.event.id, event)?;
        }
        metrics
            .fanout_batch_entries
            .observe(batch.entries.len() as f64);
        let staged = match consumer {
            Some(consumer) => consumer.stage_commit(deliveries, &mut batch.mutation)?,
            None => false,
        };
        self.finish(batch).await?;
        let now_ms = self.clock.now_ms();
        for event in deliveries.iter().filter_map(|d| d.event.event.as_ref()) {
            if event.kind == OutboxKind::Message as i32 && event.server_ts_ms > 0 {
                let lag = now_ms.saturating_sub(event.server_ts_ms);
                metrics.fanout_lag_seconds.observe(lag as f64 / 1000.0);
            }
        }
        Ok(staged)
    }

    /// Commits a batch's effects, then announces them.
    async fn finish(&mut self, mut batch: Batch) -> Result<(), PipelineError> {
        let to_homes =
            (self.homes_queue).stage(&mut batch.mutation, std::mem::take(&mut batch.forward));
        let to_standbys = (self.standbys_queue).stage(
            &mut batch.mutation,
            std::mem::take(&mut batch.standby_forward),
        );
        for ((user, conversation), entry) in &batch.entries {
            batch.mutation.put_conv_list(*user, *conversation, entry);
        }
        // Ids are issued from memory; storage learns the high mark once.
        let notified = !batch.notifications.is_empty();
        if notified {
            let id = self.next_notification;
            self.next_notification += 1;
            let notifications = NotificationBatch {
                notifications: std::mem::take(&mut batch.notifications),
            };
            batch.mutation.put_notifications(id, &notifications);
            batch.mutation.notifications_issued_through(id);
        }
        if !batch.mutation.is_empty() {
            let mutation = std::mem::take(&mut batch.mutation);
            if let Err(e) = self.store.commit_fan_out(mutation).await {
                // The cached pts may now be ahead of storage.
                self.pts.clear();
                return Err(e.into());
            }
        }
        if self.pts.len() > PTS_CACHE {
            self.pts.clear();
        }
        let mut messages = HashMap::new();
        for (user, pts) in batch.pts {
            let _push = batch.trace.push(user);
            self.pts.insert(user, pts);
            match batch.appended.remove(&user).flatten() {
                Some(events) => match self.live(events, &mut messages) {
                    Ok(live) => self.hub.appended(user, live),
                    Err(_) => self.hub.notify_pts(user, pts),
                },
                None => self.hub.notify_pts(user, pts),
            }
        }
        for (members, hint) in batch.hints {
            let push = SyncPush {
                push: Some(sync_push::Push::Hint(hint)),
            };
            for user in members {
                self.hub.push(user, push.clone());
            }
        }
        if notified {
            self.notifications.notify_one();
        }
        if to_homes {
            self.homes_queue.signal.notify_one();
        }
        if to_standbys {
            self.standbys_queue.signal.notify_one();
        }
        Ok(())
    }

    fn apply_event(
        &mut self,
        batch: &mut Batch,
        id: u64,
        event: &OutboxEvent,
    ) -> Result<(), PipelineError> {
        let members = StoredMembers {
            store: &self.store,
            conversation: event.conversation_id,
        };
        let plan = plan::plan(event, &members, self.large_group_threshold)?;
        let (count, large) = match &plan.fanout {
            Fanout::None => (0, false),
            Fanout::Records(records) => (records.len(), false),
            Fanout::Hint { members, .. } => (members.len(), true),
        };
        batch.trace.event(traced::fanout(
            &event.traceparent,
            event.conversation_id,
            event.seq,
            count,
            large,
        ));
        if plan.replicate_meta {
            self.replicate_meta(batch, id, event)?;
        }
        if plan.replicate_answer {
            self.replicate_answer(batch, id, event);
        }
        if plan.replicate_copied_answers {
            self.replicate_copied_answers(batch, id, event)?;
        }
        let origin = Origin {
            tenant: event.tenant_id,
            sender: event.user_id,
        };
        match plan.fanout {
            Fanout::None => {}
            Fanout::Records(records) => {
                for (user, record) in records {
                    self.deliver(batch, origin.user(user), id, &record, origin)?;
                }
            }
            Fanout::Hint { members, hint } => {
                let now = self.clock.now_ms();
                let online = members
                    .into_iter()
                    .map(|u| origin.user(u))
                    .filter(|u| self.hub.is_online(*u, now))
                    .collect();
                batch.hints.push((online, hint));
            }
        }
        Ok(())
    }

    /// This cell's standbys for `batch` (looked up once per batch); a
    /// standby that was none at the last lookup gets the answers shipped
    /// lately first (see [`RecentAnswers`]).
    fn standbys(&mut self, batch: &mut Batch) -> Arc<[String]> {
        if let Some(standbys) = &batch.standbys {
            return standbys.clone();
        }
        let standbys = batch.standbys(self.homes.as_ref());
        let (joined, replay) = self.recent.joined(&standbys);
        if !replay.is_empty() {
            tracing::info!(standbys = ?joined, answers = replay.len(), "new standbys get the answers shipped lately");
            for endpoint in &joined {
                let queued = batch.standby_forward.entry(endpoint.clone()).or_default();
                queued.extend(replay.iter().cloned());
            }
        }
        standbys
    }

    /// Queues the answer to an acknowledged send for this cell's standbys,
    /// so that a failover target answers a re-send of it as this cell did
    /// (within the replication lag: what the forward queue still holds).
    fn replicate_answer(&mut self, batch: &mut Batch, id: u64, event: &OutboxEvent) {
        if event.client_req_id.is_empty()
            || self.store.failpoints().hit("standby.answers") == Some(Action::Error)
        {
            return;
        }
        let standbys = self.standbys(batch);
        let answer = PeerEvent {
            event_id: id,
            tenant_id: event.tenant_id,
            conversation_id: event.conversation_id,
            seq: event.seq,
            msg_id: event.msg_id,
            sender_id: event.user_id,
            server_ts_ms: event.server_ts_ms,
            idempotency: Some(IdempotencyRecord {
                conversation_id: event.conversation_id,
                msg_id: event.msg_id,
                seq: event.seq,
                server_ts_ms: event.server_ts_ms,
                expires_at_ms: event.idempotency_expires_at_ms,
            }),
            client_req_id: event.client_req_id.clone(),
            ..Default::default()
        };
        self.recent.shipped(&answer);
        batch.queue_for_standbys(&standbys, answer);
    }

    /// Queues for this cell's standbys the answers a move copied here with
    /// the messages at `event.items` (hot ones: older messages' requests
    /// are past their idempotency window), so that a failover target
    /// answers a re-send of them as this cell would.
    fn replicate_copied_answers(
        &mut self,
        batch: &mut Batch,
        id: u64,
        event: &OutboxEvent,
    ) -> Result<(), PipelineError> {
        if self.store.failpoints().hit("standby.answers") == Some(Action::Error) {
            return Ok(());
        }
        // With none up, still noted for the standby that joins next.
        let standbys = self.standbys(batch);
        let conversation = event.conversation_id;
        for &seq in &event.items {
            let Some(r) = self.store.message(conversation, seq)? else {
                continue;
            };
            let key = IdemKey {
                kind: IdemKind::Send,
                tenant: event.tenant_id,
                user: r.sender_id,
                client_req_id: r.client_req_id,
            };
            let Some(answer) = self.store.idempotency(&key)? else {
                continue;
            };
            if (answer.conversation_id, answer.seq) != (conversation, seq) {
                continue;
            }
            let copy = PeerEvent {
                event_id: id,
                tenant_id: event.tenant_id,
                conversation_id: conversation,
                seq,
                msg_id: r.msg_id,
                sender_id: r.sender_id,
                server_ts_ms: r.server_ts_ms,
                idempotency: Some(answer),
                client_req_id: key.client_req_id,
                ..Default::default()
            };
            self.recent.shipped(&copy);
            batch.queue_for_standbys(&standbys, copy);
        }
        Ok(())
    }

    /// Queues the conversation's meta and members for this cell's standby,
    /// so a failover finds the conversation there.
    fn replicate_meta(
        &mut self,
        batch: &mut Batch,
        id: u64,
        event: &OutboxEvent,
    ) -> Result<(), PipelineError> {
        let standbys = self.standbys(batch);
        if standbys.is_empty() {
            return Ok(());
        }
        let Some(record) = self.store.conversation(event.conversation_id)? else {
            return Ok(());
        };
        let (members, _) = self.store.members(event.conversation_id, 0, usize::MAX)?;
        let meta = PeerEvent {
            event_id: id,
            tenant_id: event.tenant_id,
            conversation_id: event.conversation_id,
            meta: Some(ConversationMeta {
                record: Some(record),
                members,
            }),
            ..Default::default()
        };
        batch.queue_for_standbys(&standbys, meta);
        Ok(())
    }

    /// Delivers one event to `user`: appended here, or queued for the
    /// user's home cell (with the message, which lives here), or held while
    /// that home is frozen for a move.
    fn deliver(
        &mut self,
        batch: &mut Batch,
        user: UserKey,
        id: u64,
        record: &SyncRecord,
        origin: Origin,
    ) -> Result<(), PipelineError> {
        let endpoint = match self.homes.home(user) {
            // Events queued for the user before their home came here go
            // first: this one follows them through the queue.
            Home::Here if self.still_queued(batch, user)? => Some(String::new()),
            Home::Here => None,
            Home::Remote(endpoint) => Some(endpoint),
            Home::Moving => Some(String::new()),
        };
        if let Some(endpoint) = endpoint {
            self.queued_for.insert(user);
            batch.forwarded_users.insert(user);
            let message = match SyncEventKind::try_from(record.kind) {
                Ok(SyncEventKind::Message | SyncEventKind::Recall | SyncEventKind::Edit) => self
                    .store
                    .message(record.conversation_id, record.seq)?
                    .map(|m| message_to_proto(record.conversation_id, record.seq, m)),
                _ => None,
            };
            batch.forward.entry(endpoint).or_default().push(PeerEvent {
                user_id: user.user,
                event_id: id,
                kind: record.kind,
                tenant_id: user.tenant,
                conversation_id: record.conversation_id,
                seq: record.seq,
                msg_id: record.msg_id,
                sender_id: origin.sender,
                items: record.items.clone(),
                server_ts_ms: record.server_ts_ms,
                message,
                traceparent: batch.trace.current_parent.clone(),
                ..Default::default()
            });
            return Ok(());
        }
        if self.append(batch, user, id, "", record)?
            && record.kind == SyncEventKind::Message as i32
            && user != origin.sender()
        {
            self.maybe_notify(batch, user, record, origin)?;
        }
        Ok(())
    }

    /// Whether events for `user` wait in the forward queue (this batch's
    /// included). The queue is scanned at most once per batch, and only for
    /// a user who had events queued and now lives here.
    fn still_queued(&mut self, batch: &mut Batch, user: UserKey) -> Result<bool, PipelineError> {
        if batch.forwarded_users.contains(&user) {
            return Ok(true);
        }
        if !self.queued_for.contains(&user) {
            return Ok(false);
        }
        if batch.queued.is_none() {
            let queued = queued_users(&self.store)?;
            self.queued_for
                .retain(|u| queued.contains(u) || batch.forwarded_users.contains(u));
            batch.queued = Some(queued);
        }
        Ok(batch.queued.as_ref().is_some_and(|q| q.contains(&user)))
    }

    /// Appends one event to `user`'s sync queue unless it was applied
    /// before; returns whether it appended.
    fn append(
        &mut self,
        batch: &mut Batch,
        user: UserKey,
        id: u64,
        source: &str,
        record: &SyncRecord,
    ) -> Result<bool, PipelineError> {
        let key = (user, record.conversation_id);
        let mut entry = match batch.entries.remove(&key) {
            Some(entry) => entry,
            None => self
                .store
                .conv_list_entry(user, record.conversation_id)?
                .unwrap_or_default(),
        };
        if source == entry.last_event_source && id <= entry.last_event_id {
            batch.entries.insert(key, entry);
            return Ok(false);
        }
        let pts = self.latest_pts(batch, user)? + 1;
        batch.pts.insert(user, pts);
        batch.trace.appended(user);
        batch.mutation.put_sync(user, pts, record);
        let live = (batch.appended.entry(user))
            .or_insert_with(|| self.hub.is_subscribed(user).then(Vec::new));
        if let Some(events) = live {
            events.push((pts, record.clone()));
        }
        batch.applied += 1;
        entry.last_event_id = id;
        entry.last_event_source = source.to_string();
        match SyncEventKind::try_from(record.kind) {
            Ok(SyncEventKind::Message) => {
                entry.last_seq = entry.last_seq.max(record.seq);
                entry.last_msg_id = record.msg_id;
                entry.updated_at_ms = record.server_ts_ms;
                entry.last_message_pts = pts;
            }
            // A recall or edit of the last message carries its new state.
            Ok(SyncEventKind::Recall | SyncEventKind::Edit)
                if record.msg_id == entry.last_msg_id =>
            {
                entry.last_message_pts = pts;
            }
            Ok(SyncEventKind::Joined) => {
                entry.left = false;
                entry.updated_at_ms = entry.updated_at_ms.max(record.server_ts_ms);
            }
            Ok(SyncEventKind::Left) => entry.left = true,
            _ => {}
        }
        batch.entries.insert(key, entry);
        Ok(true)
    }

    /// Appended events as live streams push them, each message read once
    /// per batch however many members' streams carry it.
    fn live(
        &self,
        events: Vec<(u64, SyncRecord)>,
        messages: &mut HashMap<(u64, u64), Option<Arc<Message>>>,
    ) -> crate::error::Result<Vec<LiveEvent>> {
        events
            .into_iter()
            .map(|(pts, record)| {
                let message = match messages.get(&(record.conversation_id, record.seq)) {
                    Some(message) if record.remote_message.is_empty() => message.clone(),
                    _ => {
                        let message = event_message(&self.store, &record)?.map(Arc::new);
                        if record.remote_message.is_empty() {
                            let key = (record.conversation_id, record.seq);
                            messages.insert(key, message.clone());
                        }
                        message
                    }
                };
                Ok(LiveEvent {
                    pts,
                    record,
                    message,
                })
            })
            .collect()
    }

    fn latest_pts(&mut self, batch: &mut Batch, user: UserKey) -> Result<u64, PipelineError> {
        if let Some(pts) = batch.pts.get(&user) {
            return Ok(*pts);
        }
        if let Some(pts) = self.pts.get(&user) {
            return Ok(*pts);
        }
        // A queue gets its identity with its first event here.
        if self.store.queue_id(user)? == 0 {
            batch.mutation.set_queue_id(user, new_queue_id());
        }
        let pts = self.store.user_pts(user)?;
        self.pts.insert(user, pts);
        Ok(pts)
    }

    /// Queues a notification for a member with no online device.
    fn maybe_notify(
        &mut self,
        batch: &mut Batch,
        user: UserKey,
        record: &SyncRecord,
        origin: Origin,
    ) -> Result<(), PipelineError> {
        let now = self.clock.now_ms();
        if self.hub.is_online(user, now) || self.store.muted(user, record.conversation_id)? {
            return Ok(());
        }
        batch.notifications.push(NotificationRecord {
            user_id: user.user,
            tenant_id: user.tenant,
            conversation_id: record.conversation_id,
            seq: record.seq,
            msg_id: record.msg_id,
            sender_id: origin.sender,
            created_at_ms: now,
            attempts: 0,
        });
        Ok(())
    }
}

/// A fresh, non-zero queue identity.
fn new_queue_id() -> u64 {
    rand::random::<u64>().max(1)
}

/// The users whose events wait in the forward queue.
fn queued_users(store: &Store) -> Result<HashSet<UserKey>, PipelineError> {
    let mut users = HashSet::new();
    let mut after = 0;
    loop {
        let page = store.forwards(ForwardQueue::Homes, after, 1_024)?;
        let Some(&(last, _)) = page.last() else {
            return Ok(users);
        };
        after = last;
        for (_, record) in page {
            users.extend(
                record
                    .events
                    .iter()
                    .filter_map(|e| PeerEvent::decode(e.as_slice()).ok())
                    .filter(|e| !super::for_standby(e))
                    .map(|e| UserKey::new(e.tenant_id, e.user_id)),
            );
        }
    }
}
