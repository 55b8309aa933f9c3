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
//! (a standby in another region) adds its round trip to no other's.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::storage::v1::ForwardRecord;
use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
use cellmesh_proto::v1::{DeliverBatchRequest, PeerEvent};
use cellmesh_telemetry::trace::grpc::Channel;
use cellmesh_telemetry::trace::{follow, traceparent};
use prost::Message as _;
use tokio::sync::Notify;
use tracing::Instrument;

use super::for_standby;
use super::{PeerInbound, PipelineError};
use crate::homes::{Home, Homes};
use crate::storage::{ForwardQueue, Mutation, Store};
use crate::user::UserKey;

const DELIVER_TIMEOUT: Duration = Duration::from_secs(10);
/// Records read from the queue at a time, and at most per pass.
const PAGE: usize = 256;
const MAX_PASS: usize = 16 * PAGE;
/// Short: a standby's copy of new conversations waits behind it.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

struct Destination {
    client: CellPeerClient<Channel>,
    retry_at: Instant,
    backoff: Duration,
}

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
    /// Each user's target, decided once per pass.
    targets: HashMap<UserKey, Target>,
    /// Something was delivered or dropped.
    progress: bool,
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
            let mut m = Mutation::new();
            let mut pass = Pass::default();
            // One pass over the queue as it is now, page by page. A pass
            // decides each user's target once, so it must not chase records
            // queued after it began: under steady load it would never end,
            // and a user whose home switched meanwhile would wait behind
            // the decision taken before the switch.
            let end = self.store.forward_last_id(self.queue)?;
            let (mut after, mut seen) = (0, 0);
            loop {
                let mut pending = self.store.forwards(self.queue, after, PAGE)?;
                pending.retain(|(id, _)| *id <= end);
                let Some(&(last, _)) = pending.last() else {
                    break;
                };
                after = last;
                seen += pending.len();
                // A page's events go out once per destination, in queue
                // order: a single call for each cell, and the processor here.
                let mut open = Vec::with_capacity(pending.len());
                let mut out = Outgoing::new();
                for (id, record) in pending {
                    let slot = (open.len(), id);
                    let classified =
                        self.classify(&mut destinations, &mut pass, &mut out, slot, record);
                    open.push(classified);
                }
                self.send_page(&mut destinations, &mut pass, &mut open, out)
                    .await;
                for record in open {
                    finish(&mut pass, &mut m, record);
                }
                if seen >= MAX_PASS {
                    break;
                }
            }
            store_outcome(&self.store, m).await?;
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

    /// Sends a page's events, one call per target, to every target at once
    /// (a far destination never delays a near one); what a target refuses
    /// or fails to take stays queued in its record.
    async fn send_page(
        &self,
        destinations: &mut HashMap<String, Destination>,
        pass: &mut Pass,
        open: &mut [Open],
        out: Outgoing,
    ) {
        let from = (self.cell_id.as_str(), self.homes.route_index());
        let calls = out.into_iter().map(|(target, batch)| {
            let mut events: Vec<PeerEvent> = batch.iter().map(|(_, _, e)| e.clone()).collect();
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
            let remote = match &target {
                Target::Remote(endpoint) => {
                    let dest = destinations.get(endpoint).expect("reachable destination");
                    Some(dest.client.clone())
                }
                _ => None,
            };
            async move {
                let refused: Result<Answer, String> = match (&target, remote) {
                    (Target::Local, _) => self
                        .local
                        .deliver(String::new(), events, false)
                        .instrument(span)
                        .await
                        .map(|d| Answer {
                            refused_users: d.refused_users,
                            deferred: Vec::new(),
                        })
                        .map_err(|e| e.to_string()),
                    (Target::Remote(_), Some(client)) => {
                        deliver(client, from, &self.secret, events)
                            .instrument(span)
                            .await
                    }
                    _ => unreachable!("held events are not sent"),
                };
                (target, batch, refused)
            }
        });
        for (target, batch, refused) in futures::future::join_all(calls).await {
            if let Target::Remote(endpoint) = &target {
                let dest = destinations
                    .get_mut(endpoint)
                    .expect("reachable destination");
                match &refused {
                    Ok(_) => dest.backoff = Duration::from_millis(100),
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
    UserKey::new(e.tenant_id, e.user_id)
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

/// What a destination left for later of a batch.
struct Answer {
    /// Users not homed there.
    refused_users: Vec<UserKey>,
    /// Standby events (their places in the batch) it could not judge yet.
    deferred: Vec<u32>,
}

/// Sends one batch; what the destination left for later, or why the call
/// failed (the caller backs the destination off).
async fn deliver(
    mut client: CellPeerClient<Channel>,
    (cell_id, route_index): (&str, u64),
    secret: &ClusterSecret,
    events: Vec<PeerEvent>,
) -> Result<Answer, String> {
    let mut request = tonic::Request::new(DeliverBatchRequest {
        source_cell: cell_id.to_string(),
        events,
        route_index,
    });
    secret.attach(&mut request);
    match tokio::time::timeout(DELIVER_TIMEOUT, client.deliver_batch(request)).await {
        Ok(Ok(response)) => {
            let response = response.into_inner();
            Ok(Answer {
                refused_users: (response.refused.iter())
                    .map(|u| UserKey::new(u.tenant_id, u.user_id))
                    .collect(),
                deferred: response.deferred_standby_events,
            })
        }
        Ok(Err(status)) => Err(status.to_string()),
        Err(_) => Err("timed out".to_string()),
    }
}

fn destination<'a>(
    destinations: &'a mut HashMap<String, Destination>,
    endpoint: &str,
    peers: &cellmesh_route_client::peers::Peers,
) -> Option<&'a mut Destination> {
    if endpoint.is_empty() {
        return None;
    }
    if !destinations.contains_key(endpoint) {
        let client = peers.cell(endpoint).ok()?;
        destinations.insert(
            endpoint.to_string(),
            Destination {
                client,
                retry_at: Instant::now(),
                backoff: Duration::from_millis(100),
            },
        );
    }
    destinations.get_mut(endpoint)
}
