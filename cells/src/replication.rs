//! Replication mode `sync`, owner side: before a write of a `sync` tenant is
//! acknowledged, what its commit made durable here — a new message with its
//! answer (idempotency record), or a rewritten message — is stored on every
//! standby of this cell (the cells the route table fails its conversations
//! over to). Concurrent writes share one call per standby, as concurrent
//! commits share one fsync: while a call is in flight the next group
//! gathers. The first write of a conversation a standby is not known to
//! hold carries the conversation's meta, so a standby never holds messages
//! of a conversation it cannot serve. `async` tenants pass straight
//! through; their answers reach the standbys through the forward queue
//! (see `pipeline::processor`).
//!
//! The standbys are the ones the route table lists as up. With none (the
//! cell has taken over its failed standby's conversations), writes are
//! acknowledged unreplicated and the cell logs that it is degraded, unless
//! `replication.require_standby` asks to refuse them.

use cellmesh_proto::ids::{ConversationId, TenantId};
use cellmesh_proto::reason::Reason;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
use cellmesh_proto::v1::{ConversationMeta, ReplicateRequest, ReplicatedWrite};
use cellmesh_telemetry::trace::grpc::Channel;
use prost::Message as _;
use tokio::sync::{mpsc, oneshot};

use crate::config::{CellConfig, ReplicationConfig, ReplicationMode};
use crate::error::{CellError, Result};
use crate::homes::Homes;
use crate::storage::Store;

/// Most writes in one call to a standby.
const MAX_GROUP: usize = 1024;
/// Most encoded bytes in one call (well inside the peers' 64 MiB limit).
const MAX_GROUP_BYTES: usize = 16 << 20;
/// Writes waiting for a group before senders wait for room.
const QUEUE_DEPTH: usize = 8192;

struct Pending {
    write: ReplicatedWrite,
    reply: oneshot::Sender<Result<()>>,
}

/// Ships the writes of `sync` tenants to this cell's standbys.
pub struct Replicator {
    config: ReplicationConfig,
    /// Absent when no tenant replicates synchronously.
    tx: Option<mpsc::Sender<Pending>>,
}

impl Replicator {
    /// Starts the shipping task when the config names any `sync` tenant.
    pub fn start(config: &CellConfig, homes: Arc<dyn Homes>, store: Arc<Store>) -> Self {
        let replication = config.replication.clone();
        let any_sync = replication.mode == ReplicationMode::Sync
            || replication
                .tenants
                .values()
                .any(|m| *m == ReplicationMode::Sync);
        let tx = any_sync.then(|| {
            let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
            let shipper = Shipper {
                homes,
                store,
                cell_id: config.cell_id.clone(),
                secret: ClusterSecret::new(&config.routing.cluster_secret),
                peers: config.routing.peers(),
                timeout: Duration::from_millis(replication.timeout_ms),
                require_standby: replication.require_standby,
                degraded: false,
                described: HashMap::new(),
            };
            tokio::spawn(run(rx, shipper));
            tx
        });
        Self {
            config: replication,
            tx,
        }
    }

    /// Every tenant `async`: nothing is shipped.
    pub fn disabled() -> Self {
        Self {
            config: ReplicationConfig::default(),
            tx: None,
        }
    }

    /// Whether `tenant`'s writes wait for the standbys.
    pub fn is_sync(&self, tenant: TenantId) -> bool {
        self.tx.is_some() && self.config.mode_of(tenant) == ReplicationMode::Sync
    }

    /// Returns once every standby stored `write`. Call only for a `sync`
    /// tenant (see [`Self::is_sync`]).
    pub async fn replicate(&self, write: ReplicatedWrite) -> Result<()> {
        let Some(tx) = &self.tx else {
            return Ok(());
        };
        let (reply, answer) = oneshot::channel();
        tx.send(Pending { write, reply })
            .await
            .map_err(|_| closed())?;
        answer.await.unwrap_or_else(|_| Err(closed()))
    }
}

fn closed() -> CellError {
    CellError::Storage(crate::storage::StorageError::Closed)
}

fn unreachable(message: String) -> CellError {
    CellError::RetryLater {
        reason: Reason::StandbyUnreachable,
        message,
        retry_after: Duration::from_millis(200),
    }
}

async fn run(mut rx: mpsc::Receiver<Pending>, mut shipper: Shipper) {
    let mut group: Vec<Pending> = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut bytes = first.write.encoded_len();
        group.push(first);
        while group.len() < MAX_GROUP && bytes < MAX_GROUP_BYTES {
            match rx.try_recv() {
                Ok(next) => {
                    bytes += next.write.encoded_len();
                    group.push(next);
                }
                Err(_) => break,
            }
        }
        let writes = group.iter().map(|p| p.write.clone()).collect();
        let outcome = shipper.ship(writes).await;
        for pending in group.drain(..) {
            let answer = match &outcome {
                Ok(()) => Ok(()),
                Err(why) => Err(unreachable(why.to_string())),
            };
            let _ = pending.reply.send(answer);
        }
    }
}

struct Shipper {
    homes: Arc<dyn Homes>,
    /// Where the meta sent with a conversation's first write is read.
    store: Arc<Store>,
    cell_id: String,
    secret: ClusterSecret,
    peers: cellmesh_route_client::peers::Peers,
    timeout: Duration,
    require_standby: bool,
    /// Writes are acknowledged with no standby up (logged once per spell).
    degraded: bool,
    /// Per standby, the conversations whose meta it has stored.
    described: HashMap<String, HashSet<u64>>,
}

/// Why writes were not stored on the standbys.
#[derive(Debug, Clone, thiserror::Error)]
enum Shipped {
    /// It holds no record of a conversation the call did not describe.
    #[error("standby {endpoint}: {}", status.message())]
    LacksMeta {
        endpoint: String,
        status: tonic::Status,
    },
    #[error("standby {endpoint}: {}", status.message())]
    Refused {
        endpoint: String,
        status: tonic::Status,
    },
    #[error("standby {0}: bad address")]
    BadAddress(String),
    #[error("standby {endpoint} did not answer within {timeout:?}")]
    TimedOut { endpoint: String, timeout: Duration },
    #[error("this cell has no standby up to replicate to")]
    NoStandby,
}

/// Conversations remembered as described per standby before the set
/// starts again (their next writes carry the meta once more).
const MAX_DESCRIBED: usize = 1 << 20;

impl Shipper {
    /// Stores `writes` on every standby; the first failure otherwise.
    async fn ship(&mut self, writes: Vec<ReplicatedWrite>) -> Result<(), Shipped> {
        let standbys = self.homes.standbys();
        if standbys.is_empty() {
            if self.require_standby {
                return Err(Shipped::NoStandby);
            }
            if !self.degraded {
                tracing::warn!("no standby up: sync writes are acknowledged unreplicated");
                self.degraded = true;
            }
            return Ok(());
        }
        if self.degraded {
            tracing::info!(?standbys, "a standby is up again: sync writes replicate");
            self.degraded = false;
        }
        // Each standby gets the writes of the tenants whose data may live
        // there (a tenant bound to regions: the standbys inside them).
        let held_somewhere = |w: &ReplicatedWrite| {
            (standbys.iter()).any(|e| self.homes.may_hold(TenantId(w.tenant_id), e))
        };
        if self.require_standby && !writes.iter().all(held_somewhere) {
            return Err(Shipped::NoStandby);
        }
        let shares: Vec<(String, Vec<ReplicatedWrite>)> = standbys
            .into_iter()
            .map(|endpoint| {
                let share = (writes.iter())
                    .filter(|w| self.homes.may_hold(TenantId(w.tenant_id), &endpoint))
                    .cloned()
                    .collect();
                (endpoint, share)
            })
            .filter(|(_, share): &(String, Vec<ReplicatedWrite>)| !share.is_empty())
            .collect();
        let calls: Vec<_> = shares
            .iter()
            .map(|(endpoint, share)| {
                let request = self.request(endpoint, share, false);
                self.call(endpoint, request)
            })
            .collect();
        let mut outcomes = futures::future::join_all(calls).await;
        // A standby that lost (or never had) a conversation's meta gets the
        // writes once more, each conversation's with it.
        for ((endpoint, outcome), (_, share)) in outcomes.iter_mut().zip(&shares) {
            if matches!(outcome, Err(Shipped::LacksMeta { .. })) {
                let request = self.request(endpoint, share, true);
                *outcome = self.call(endpoint, request).await.1;
            }
        }
        let mut first_error = None;
        for ((endpoint, outcome), (_, share)) in outcomes.into_iter().zip(&shares) {
            match outcome {
                Ok(()) => {
                    let described = self.described.entry(endpoint).or_default();
                    if described.len() > MAX_DESCRIBED {
                        described.clear();
                    }
                    described.extend(share.iter().map(|w| w.conversation_id));
                }
                Err(why) => {
                    first_error.get_or_insert(why);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// One call to the standby at `endpoint`.
    fn call(
        &mut self,
        endpoint: &str,
        request: ReplicateRequest,
    ) -> impl std::future::Future<Output = (String, Result<(), Shipped>)> + use<> {
        let client = self.client(endpoint);
        let mut call = tonic::Request::new(request);
        self.secret.attach(&mut call);
        let (timeout, endpoint) = (self.timeout, endpoint.to_string());
        async move {
            let Some(mut client) = client else {
                let failed = Shipped::BadAddress(endpoint.clone());
                return (endpoint, Err(failed));
            };
            let outcome = match tokio::time::timeout(timeout, client.replicate(call)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(status)) => {
                    let reason = Reason::parse(&error_detail(&status).reason);
                    let endpoint = endpoint.clone();
                    Err(match reason == Some(Reason::StandbyLacksMeta) {
                        true => Shipped::LacksMeta { endpoint, status },
                        false => Shipped::Refused { endpoint, status },
                    })
                }
                Err(_) => Err(Shipped::TimedOut {
                    endpoint: endpoint.clone(),
                    timeout,
                }),
            };
            (endpoint, outcome)
        }
    }

    /// The call for `endpoint`: each conversation's first write carries its
    /// meta unless the standby is known to hold it.
    fn request(&self, endpoint: &str, writes: &[ReplicatedWrite], all: bool) -> ReplicateRequest {
        let known = self.described.get(endpoint);
        let mut described = HashSet::new();
        let writes = writes
            .iter()
            .map(|w| {
                let conversation = w.conversation_id;
                let mut w = w.clone();
                if (all || !known.is_some_and(|k| k.contains(&conversation)))
                    && described.insert(conversation)
                {
                    w.meta = self.meta(ConversationId(conversation));
                }
                w
            })
            .collect();
        ReplicateRequest {
            source_cell: self.cell_id.clone(),
            writes,
        }
    }

    /// The conversation's record and members as stored here.
    fn meta(&self, conversation: ConversationId) -> Option<ConversationMeta> {
        let record = self.store.conversation(conversation).ok().flatten()?;
        let (members, _) = self.store.members(conversation, 0, usize::MAX).ok()?;
        Some(ConversationMeta {
            record: Some(record),
            members,
        })
    }

    fn client(&mut self, endpoint: &str) -> Option<CellPeerClient<Channel>> {
        self.peers.cell(endpoint).ok()
    }
}
