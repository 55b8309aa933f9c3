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
//!
//! One state, handlers by concern: this file consumes the queue, plans each
//! event and commits a batch; [`sync_queue`] writes events into users' sync
//! queues (or queues them for their home cells); [`replicate`] ships copies
//! to this cell's standbys; [`remote`] applies what other cells hand in.

// Keys here are ids, not attacker-chosen strings: a fast hash suffices.
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::storage::v1::{
    ConvListEntry, ForwardRecord, IdempotencyRecord, NotificationBatch, NotificationRecord,
    OutboxEvent, OutboxKind, SyncRecord,
};
use cellmesh_proto::v1::{
    ConversationHint, ConversationMeta, Message, PeerEvent, PeerEventRole, SyncEventKind, UserState,
};
use prost::Message as _;
use tokio::sync::{Notify, mpsc, oneshot};

mod remote;
mod replicate;
mod sync_queue;

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
use crate::sync::{HintPacer, Hub, LiveEvent, event_message};
use crate::user::UserKey;

/// Membership as the fan-out plan reads it: this cell's store.
struct StoredMembers<'a> {
    store: &'a Store,
    conversation: u64,
}

impl plan::Members for StoredMembers<'_> {
    type Error = PipelineError;

    fn all(&self) -> Result<Vec<u64>, PipelineError> {
        let list = self.store.member_list(ConversationId(self.conversation))?;
        Ok(list.to_vec())
    }

    fn contains(&self, user: UserId) -> Result<bool, PipelineError> {
        Ok(self
            .store
            .is_member(ConversationId(self.conversation), user)?)
    }

    fn count(&self) -> Result<usize, PipelineError> {
        Ok(self
            .store
            .conversation(ConversationId(self.conversation))?
            .map_or(0, |c| c.member_count as usize))
    }
}

impl StoredMembers<'_> {
    /// The members of `tenant` among `online`: each checked for
    /// membership when few are online, else picked from a read of every
    /// member.
    fn among(&self, tenant: TenantId, online: Vec<UserId>) -> Result<Vec<UserKey>, PipelineError> {
        use plan::Members as _;
        let key = |user| UserKey::new(tenant, user);
        if online.len().saturating_mul(8) < self.count()? {
            let mut out = Vec::with_capacity(online.len());
            for user in online {
                if self.contains(user)? {
                    out.push(key(user));
                }
            }
            return Ok(out);
        }
        let online: HashSet<UserId> = online.into_iter().collect();
        Ok(self
            .all()?
            .into_iter()
            .map(UserId)
            .filter(|u| online.contains(u))
            .map(key)
            .collect())
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
/// Conversation-list entries kept (about 100 bytes each).
const ENTRY_CACHE: usize = 1 << 18;

pub struct Processor {
    store: Arc<Store>,
    hub: Arc<Hub>,
    clock: Arc<dyn Clock>,
    large_group_threshold: usize,
    /// Where a large group's hints go (paced).
    hints: Arc<HintPacer>,
    /// Latest durable pts per user.
    pts: HashMap<UserKey, u64>,
    /// Durable conversation-list entries by (user, conversation), as this
    /// processor (their only writer while the home is here) last wrote or
    /// read them; dropped with `pts`.
    entries: HashMap<(UserKey, u64), ConvListEntry>,
    /// [`Store::handovers`] when `pts` was last cleared: a home sealed for
    /// a move may come back stale, and must be looked at again.
    handovers_seen: u64,
    next_notification: u64,
    notifications: Arc<Notify>,
    /// With no webhook: notifications go to this log as they are made,
    /// not through the durable queue (nothing is delivered to retry).
    notification_log: Option<Arc<super::notify::LogSink>>,
    /// See [`Signals::processed`].
    processed: Arc<tokio::sync::watch::Sender<u64>>,
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
    /// The highest outbox id whose effects are durable (a graceful stop
    /// waits for it to reach the last one written).
    pub processed: Arc<tokio::sync::watch::Sender<u64>>,
}

/// Where a forwarded user event is addressed when it is queued. The
/// forwarder sends every user event to the home it finds when it reaches
/// the record; the address groups a batch's events into records.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Via {
    /// The home cell known now.
    Cell(String),
    /// No cell yet: the home is frozen for a move, or the user's earlier
    /// events are still queued (this one follows them).
    Resolve,
}

impl Via {
    /// The record's `endpoint` ("" for [`Via::Resolve`]).
    fn endpoint(self) -> String {
        match self {
            Via::Cell(endpoint) => endpoint,
            Via::Resolve => String::new(),
        }
    }
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
    fn stage(
        &mut self,
        m: &mut Mutation,
        records: impl ExactSizeIterator<Item = (String, Vec<PeerEvent>)>,
    ) -> bool {
        if records.len() == 0 {
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
    /// Events for users homed elsewhere, by where they are addressed.
    forward: HashMap<Via, Vec<PeerEvent>>,
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

    /// Queues `event` for each of `standbys` its tenant's data may live on
    /// (see [`Homes::may_hold`]).
    fn queue_for_standbys(&mut self, homes: &dyn Homes, standbys: &[String], event: PeerEvent) {
        let tenant = cellmesh_proto::ids::TenantId(event.tenant_id);
        for endpoint in standbys.iter().filter(|e| homes.may_hold(tenant, e)) {
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
    fn user(&self, user: UserId) -> UserKey {
        UserKey::new(TenantId(self.tenant), user)
    }

    fn sender(&self) -> UserKey {
        self.user(UserId(self.sender))
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
            hints: HintPacer::start(hub.clone(), Duration::ZERO),
            store,
            hub,
            clock,
            large_group_threshold,
            pts: HashMap::default(),
            entries: HashMap::default(),
            handovers_seen: 0,
            queued_for,
            next_notification,
            notifications: signals.notifications,
            notification_log: None,
            processed: signals.processed,
            homes,
            homes_queue,
            standbys_queue,
            recent: RecentAnswers::new(RECENT_ANSWERS),
            cell_id,
        })
    }

    /// Writes notifications to `log` instead of queueing them for a
    /// sink (the cell has no webhook).
    pub fn notifying_the_log(mut self, log: Option<Arc<super::notify::LogSink>>) -> Self {
        self.notification_log = log;
        self
    }

    /// Sends large groups' hints through `pacer` (by default, each at once).
    pub fn pacing_hints(mut self, pacer: Arc<HintPacer>) -> Self {
        self.hints = pacer;
        self
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
            if let Some(last) = deliveries.iter().map(|d| d.event.id).max() {
                self.processed.send_if_modified(|p| {
                    let higher = last > *p;
                    *p = (*p).max(last);
                    higher
                });
            }
        }
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
        let started = Instant::now();
        let mut batch = Batch::default();
        for delivery in deliveries {
            let Some(event) = &delivery.event.event else {
                continue;
            };
            self.apply_event(&mut batch, delivery.event.id, event)?;
        }
        observe_phase("apply", started);
        metrics
            .fanout_batch_entries
            .observe(batch.entries.len() as f64);
        self.store.failpoints().abort_at("fanout.read");
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
        let homes = std::mem::take(&mut batch.forward).into_iter();
        let homes = homes.map(|(via, events)| (via.endpoint(), events));
        let to_homes = (self.homes_queue).stage(&mut batch.mutation, homes);
        let standbys = std::mem::take(&mut batch.standby_forward).into_iter();
        let to_standbys = (self.standbys_queue).stage(&mut batch.mutation, standbys);
        for ((user, conversation), entry) in &batch.entries {
            batch
                .mutation
                .put_conv_list(*user, ConversationId(*conversation), entry);
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
            let started = Instant::now();
            if let Err(e) = self.store.commit_fan_out(mutation).await {
                // The cached pts and entries may now be ahead of storage.
                self.forget_cached();
                return Err(e.into());
            }
            observe_phase("commit", started);
            self.store.failpoints().abort_at("fanout.committed");
        }
        if self.pts.len() > PTS_CACHE || self.entries.len() > ENTRY_CACHE {
            self.forget_cached();
        }
        self.entries.extend(batch.entries);
        let started = Instant::now();
        let mut messages = HashMap::default();
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
            self.hints.hint(members, hint);
        }
        observe_phase("announce", started);
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
        // A large group's hint goes to its members online now.
        let hinted = match &plan.fanout {
            Fanout::Hint { .. } => {
                let tenant = TenantId(event.tenant_id);
                members.among(tenant, self.hub.online(tenant, self.clock.now_ms()))?
            }
            _ => Vec::new(),
        };
        let (count, large) = match &plan.fanout {
            Fanout::None => (0, false),
            Fanout::Records(records) => (records.len(), false),
            Fanout::Hint { .. } => (hinted.len(), true),
        };
        batch.trace.event(traced::fanout(
            &event.traceparent,
            ConversationId(event.conversation_id),
            event.seq,
            count,
            large,
        ));
        if plan.replicate_meta {
            self.replicate_meta(batch, ConversationId(id), event)?;
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
                    self.deliver(batch, origin.user(UserId(user)), id, &record, origin)?;
                }
            }
            Fanout::Hint { hint } => batch.hints.push((hinted, hint)),
        }
        Ok(())
    }
}

/// Records the time since `started` as `phase` of a fan-out batch.
fn observe_phase(phase: &'static str, started: Instant) {
    let phases = &crate::metrics::metrics().fanout_phase_seconds;
    let label = crate::metrics::PhaseLabel { phase };
    phases
        .get_or_create(&label)
        .observe(started.elapsed().as_secs_f64());
}

/// The users whose events wait in the forward queue.
fn queued_users(store: &Store) -> Result<HashSet<UserKey>, PipelineError> {
    let mut users = HashSet::default();
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
                    .map(|e| UserKey::new(TenantId(e.tenant_id), UserId(e.user_id))),
            );
        }
    }
}
