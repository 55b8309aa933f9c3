//! Delivers queued events to the cells where their users live, over
//! `CellPeer.DeliverBatch`, oldest first. Each user event goes to its user's
//! home as the route table says at delivery time, so an event queued before
//! a home moved follows the user; a home frozen for a move holds its
//! events until the switch. Conversation meta goes to the standby it was
//! queued for. A user whose event waits (home frozen, destination backed
//! off or refusing) has all their later events wait behind it, so each
//! user's events arrive in order; other users and destinations carry on:
//! one unreachable cell never stalls another's deliveries or the local
//! fan-out. A page goes to all its destinations at once, so a far cell
//! (a standby in another region) adds its round trip to no other's. Users'
//! events ride an ordered stream per home cell: while a page is in flight
//! the next one goes out, so an event never waits for the round trip of
//! the one before it (a user's events keep their target until answered,
//! and the stream keeps their order; see [`super::deliver_stream`]).

use cellmesh_proto::ids::{TenantId, UserId};
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::storage::v1::ForwardRecord;
use cellmesh_proto::v1::{DeliverBatchRequest, PeerEvent};
use cellmesh_telemetry::trace::{follow, traceparent};
use futures::FutureExt as _;
use prost::Message as _;
use tokio::sync::Notify;
use tracing::Instrument;

use super::deliver_stream::Undelivered;
use super::destination::{Answer, Call, Destination, destination};
use super::for_standby;
use super::{PeerInbound, PipelineError};
use crate::homes::{Home, Homes};
use crate::storage::{ForwardQueue, Mutation, Store};
use crate::user::UserKey;

/// Records read from the queue at a time.
const PAGE: usize = 256;
/// Pages in flight at most.
const MAX_IN_FLIGHT: usize = 16;
/// Short: a standby's copy of new conversations waits behind it.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Where one event goes now.
#[derive(Clone, PartialEq, Eq)]
enum Target {
    /// The user lives here (their home moved to this cell).
    Local,
    Remote(String),
    /// Not now: the home is frozen, or the destination is backed off.
    Hold,
}

/// What one pass over the queue has learned.
#[derive(Default)]
struct Pass {
    /// Destinations that failed or are backed off.
    waiting: HashSet<String>,
    /// Users with an earlier event still queued.
    blocked: HashSet<UserKey>,
    /// Each user's target, kept while they have events in flight.
    targets: HashMap<UserKey, Target>,
    /// Something was delivered or dropped.
    progress: bool,
}

impl Pass {
    /// Whether the pass may go on to records queued after it began:
    /// nothing held (a held user's later events wait for the next pass),
    /// no destination failing.
    fn may_extend(&self) -> bool {
        self.blocked.is_empty() && self.waiting.is_empty()
    }
}

/// A page's events by where they go, each with its record's slot in the
/// page and its place in the record.
type Outgoing = Vec<(Target, Vec<(usize, usize, PeerEvent)>)>;

/// A record being worked on, until its page's events are sent.
struct Open {
    id: u64,
    record: ForwardRecord,
    total: usize,
    /// Events that stay queued, by their place in the record.
    held: Vec<(usize, PeerEvent)>,
}

pub struct Forwarder {
    pub store: Arc<Store>,
    /// The queue this forwarder delivers (each queue has its own).
    pub queue: ForwardQueue,
    pub signal: Arc<Notify>,
    pub cell_id: String,
    pub secret: ClusterSecret,
    pub peers: cellmesh_route_client::peers::Peers,
    pub homes: Arc<dyn Homes>,
    /// This cell's processor, for events whose user now lives here.
    pub local: PeerInbound,
}

impl Forwarder {
    /// Forwards until a storage error.
    pub async fn run(self: Arc<Self>) -> Result<(), PipelineError> {
        let mut destinations: HashMap<String, Destination> = HashMap::new();
        loop {
            // A pass starts with nothing in flight: each user's target is
            // decided anew, and a broken stream is replaced.
            for (endpoint, dest) in destinations.iter_mut() {
                dest.renew(endpoint);
            }
            let mut pass = Pass::default();
            let mut flight = Flight::default();
            // The pass goes over the queue as it is now, page by page, and
            // then on to what is queued meanwhile only while nothing is held
            // or failing: a held user's later events wait for the next pass,
            // which starts once every page in flight is answered.
            let end = self.store.forward_last_id(self.queue)?;
            let (mut after, mut seen) = (0, 0);
            loop {
                while flight.may_send() && (after < end || pass.may_extend()) {
                    pass.targets
                        .retain(|user, _| flight.users.contains_key(user));
                    let pending = self.store.forwards(self.queue, after, PAGE)?;
                    let Some(&(last, _)) = pending.last() else {
                        break;
                    };
                    after = last;
                    seen += pending.len();
                    let page = self.send_page(&mut destinations, &mut pass, pending).await;
                    flight.push(page);
                }
                let extend = flight.may_send() && pass.may_extend();
                let Some(front) = flight.pages.front_mut() else {
                    break;
                };
                let answered = tokio::select! {
                    answered = &mut front.answers => Some(answered),
                    _ = self.signal.notified(), if extend => None,
                };
                if let Some(answered) = answered {
                    let mut m = Mutation::new();
                    take(&mut destinations, &mut pass, &mut m, flight.pop(), answered);
                    // And every later page already answered, in one commit.
                    while let Some(answered) = flight.front_answered() {
                        take(&mut destinations, &mut pass, &mut m, flight.pop(), answered);
                    }
                    store_outcome(&self.store, m).await?;
                }
            }
            if !pass.progress {
                // Nothing queued, or everything waits.
                let wait = if seen == 0 {
                    Duration::from_secs(1)
                } else {
                    Duration::from_millis(100)
                };
                let _ = tokio::time::timeout(wait, self.signal.notified()).await;
            }
        }
    }

    /// Decides where each event of one record goes now: into `out` by
    /// target (with its record's slot in the page), or held in the record.
    fn classify(
        &self,
        destinations: &mut HashMap<String, Destination>,
        pass: &mut Pass,
        out: &mut Outgoing,
        (slot, id): (usize, u64),
        record: ForwardRecord,
    ) -> Open {
        let events: Vec<PeerEvent> = record
            .events
            .iter()
            .filter_map(|e| PeerEvent::decode(e.as_slice()).ok())
            .collect();
        let mut open = Open {
            id,
            total: events.len(),
            record,
            held: Vec::new(),
        };
        for (at, e) in events.into_iter().enumerate() {
            let user = user_of(&e);
            let target = if for_standby(&e) {
                self.reachable(destinations, pass, &open.record.endpoint)
            } else if pass.blocked.contains(&user) {
                Target::Hold
            } else {
                let known = pass.targets.get(&user).cloned();
                let target = known.unwrap_or_else(|| match self.homes.home(user) {
                    Home::Here => Target::Local,
                    Home::Moving => Target::Hold,
                    Home::Remote(endpoint) => self.reachable(destinations, pass, &endpoint),
                });
                pass.targets.insert(user, target.clone());
                target
            };
            match target {
                Target::Hold => open.held.push((at, e)),
                target => match out.iter_mut().find(|(t, _)| *t == target) {
                    Some((_, batch)) => batch.push((slot, at, e)),
                    None => out.push((target, vec![(slot, at, e)])),
                },
            }
        }
        block_held(pass, &open);
        open
    }

    /// Sends a page's records: each event to where it goes now, one call
    /// per target, to every target at once (a far destination never delays
    /// a near one). Local deliveries are made before this returns; remote
    /// ones are answered when the page's `answers` are.
    async fn send_page(
        &self,
        destinations: &mut HashMap<String, Destination>,
        pass: &mut Pass,
        pending: Vec<(u64, ForwardRecord)>,
    ) -> InFlight {
        let mut open = Vec::with_capacity(pending.len());
        let mut out = Outgoing::new();
        for (id, record) in pending {
            let slot = (open.len(), id);
            let classified = self.classify(destinations, pass, &mut out, slot, record);
            open.push(classified);
        }
        let streamed = self.queue == ForwardQueue::Homes;
        let (mut ordered, mut users, mut calls) = (true, Vec::new(), Vec::new());
        for (target, batch) in out {
            let mut events: Vec<PeerEvent> = batch.iter().map(|(_, _, e)| e.clone()).collect();
            users.extend((events.iter()).filter(|e| !for_standby(e)).map(user_of));
            // The call joins the trace of the first traced event; the
            // receiving cell's spans of every traced event follow the call.
            let span = events
                .iter()
                .find(|e| !e.traceparent.is_empty())
                .and_then(|e| forward_span(&e.traceparent, &target, events.len()))
                .unwrap_or_else(tracing::Span::none);
            if !span.is_disabled() {
                let parent = traceparent(&span);
                for e in events.iter_mut().filter(|e| !e.traceparent.is_empty()) {
                    e.traceparent = parent.clone();
                }
            }
            let call: Call = match &target {
                Target::Local => {
                    let delivered = (self.local.deliver(String::new(), events, false))
                        .instrument(span)
                        .await;
                    let answer = delivered
                        .map(|d| Answer {
                            refused_users: d.refused_users,
                            deferred: Vec::new(),
                        })
                        .map_err(|e| Undelivered::Local(std::sync::Arc::new(e)));
                    Box::pin(std::future::ready(answer))
                }
                Target::Remote(endpoint) => {
                    let dest = destinations
                        .get_mut(endpoint)
                        .expect("reachable destination");
                    let request = DeliverBatchRequest {
                        source_cell: self.cell_id.clone(),
                        events,
                        route_index: self.homes.route_index(),
                    };
                    let (call, on_stream) = dest.send(request, &self.secret, streamed);
                    ordered &= on_stream;
                    // Under way now, answered or not when the page is taken.
                    let call = tokio::spawn(call.instrument(span));
                    Box::pin(async move {
                        call.await.unwrap_or_else(|e| {
                            tracing::error!(error = %e, "a delivery task failed");
                            Err(Undelivered::TaskFailed)
                        })
                    })
                }
                Target::Hold => unreachable!("held events are not sent"),
            };
            calls.push(async move { (target, batch, call.await) });
        }
        users.sort_by_key(|u| (u.tenant, u.user));
        users.dedup();
        InFlight {
            open,
            answers: Box::pin(futures::future::join_all(calls)),
            users,
            ordered,
        }
    }

    /// `endpoint` as a target: held while it is backed off or failed in
    /// this pass, or when it is not a valid endpoint.
    fn reachable(
        &self,
        destinations: &mut HashMap<String, Destination>,
        pass: &Pass,
        endpoint: &str,
    ) -> Target {
        if pass.waiting.contains(endpoint) {
            return Target::Hold;
        }
        match destination(destinations, endpoint, &self.peers) {
            Some(dest) if dest.retry_at > Instant::now() => Target::Hold,
            Some(_) => Target::Remote(endpoint.to_string()),
            None => {
                tracing::error!(%endpoint, "holding a forward to an invalid endpoint");
                Target::Hold
            }
        }
    }
}

/// Takes a page's answers: what a target refused or failed to take stays
/// queued in its record (its user now waits for the next pass), a failed
/// destination backs off, and each record is dropped or rewritten.
fn take(
    destinations: &mut HashMap<String, Destination>,
    pass: &mut Pass,
    m: &mut Mutation,
    page: InFlight,
    answered: Vec<Answered>,
) {
    let mut open = page.open;
    for (target, batch, refused) in answered {
        if let Target::Remote(endpoint) = &target {
            let dest = destinations
                .get_mut(endpoint)
                .expect("reachable destination");
            match &refused {
                Ok(answer) => {
                    dest.backoff = Duration::from_millis(100);
                    dest.refused |= !answer.refused_users.is_empty();
                }
                Err(error) => {
                    tracing::warn!(%endpoint, %error, "forward failed; backing off");
                    dest.retry_at = Instant::now() + dest.backoff;
                    dest.backoff = (dest.backoff * 2).min(MAX_BACKOFF);
                    pass.waiting.insert(endpoint.clone());
                }
            }
        }
        for (sent, (slot, at, e)) in batch.into_iter().enumerate() {
            let kept = match &refused {
                Err(_) => true,
                Ok(answer) if for_standby(&e) => answer.deferred.contains(&(sent as u32)),
                Ok(answer) => answer.refused_users.contains(&user_of(&e)),
            };
            if kept {
                if !for_standby(&e) {
                    pass.blocked.insert(user_of(&e));
                }
                open[slot].held.push((at, e));
            }
        }
    }
    for record in open {
        finish(pass, m, record);
    }
}

/// A call's target, the events it carried (with their record's slot in the
/// page and place in the record), and its answer.
type Answered = (
    Target,
    Vec<(usize, usize, PeerEvent)>,
    Result<Answer, Undelivered>,
);

/// A page sent and not yet taken.
struct InFlight {
    open: Vec<Open>,
    answers: Pin<Box<dyn Future<Output = Vec<Answered>> + Send>>,
    /// Users with events in the page.
    users: Vec<UserKey>,
    /// Every remote call rides an ordered stream.
    ordered: bool,
}

/// Pages in flight, oldest first, and how many of them each user has
/// events in (such a user keeps the target they went to).
#[derive(Default)]
struct Flight {
    pages: VecDeque<InFlight>,
    users: HashMap<UserKey, usize>,
}

impl Flight {
    /// Whether another page may go out before those in flight are
    /// answered: few enough are, and all ride ordered streams.
    fn may_send(&self) -> bool {
        self.pages.len() < MAX_IN_FLIGHT && self.pages.iter().all(|p| p.ordered)
    }

    fn push(&mut self, page: InFlight) {
        for user in &page.users {
            *self.users.entry(*user).or_default() += 1;
        }
        self.pages.push_back(page);
    }

    fn pop(&mut self) -> InFlight {
        let page = self.pages.pop_front().expect("a page in flight");
        for user in &page.users {
            if let Some(n) = self.users.get_mut(user) {
                *n -= 1;
                if *n == 0 {
                    self.users.remove(user);
                }
            }
        }
        page
    }

    /// The oldest page's answers, if they are all in.
    fn front_answered(&mut self) -> Option<Vec<Answered>> {
        let front = self.pages.front_mut()?;
        (&mut front.answers).now_or_never()
    }
}

/// Users with a held event wait behind it for the rest of the pass.
fn block_held(pass: &mut Pass, open: &Open) {
    for (_, e) in &open.held {
        if !for_standby(e) {
            pass.blocked.insert(user_of(e));
        }
    }
}

/// The user a (non-meta) event is for.
fn user_of(e: &PeerEvent) -> UserKey {
    UserKey::new(TenantId(e.tenant_id), UserId(e.user_id))
}

/// Drops a delivered record, or keeps what is left of it, in order, in its
/// place.
fn finish(pass: &mut Pass, m: &mut Mutation, mut open: Open) {
    if open.held.is_empty() {
        m.delete_forward(open.id);
        pass.progress = true;
    } else if open.held.len() < open.total {
        open.held.sort_by_key(|(at, _)| *at);
        let record = ForwardRecord {
            events: open.held.iter().map(|(_, e)| e.encode_to_vec()).collect(),
            attempts: open.record.attempts.saturating_add(1),
            ..open.record
        };
        m.put_forward(open.id, &record);
        pass.progress = true;
    }
}

async fn store_outcome(store: &Store, m: Mutation) -> Result<(), PipelineError> {
    if !m.is_empty() {
        store.commit(m).await?;
    }
    Ok(())
}

/// The span of a call that carries a traced event.
fn forward_span(parent: &str, target: &Target, events: usize) -> Option<tracing::Span> {
    let to = match target {
        Target::Remote(endpoint) => endpoint.as_str(),
        _ => "local",
    };
    let span = tracing::info_span!("forward", to, events);
    follow(&span, parent).then_some(span)
}
