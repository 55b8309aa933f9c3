//! Delivers queued events to the cells where their users live, over
//! `CellPeer.DeliverBatch`, oldest first per destination. A destination that
//! fails is backed off and its later records wait (so its users keep their
//! order), while other destinations carry on: one unreachable cell never
//! stalls another's deliveries or the local fan-out.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::storage::v1::ForwardRecord;
use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
use cellmesh_proto::v1::{DeliverBatchRequest, PeerEvent};
use prost::Message as _;
use tokio::sync::Notify;
use tonic::transport::{Channel, Endpoint};

use super::PipelineError;
use crate::storage::{Mutation, Store};

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

/// Forwards until a storage error.
pub async fn run(
    store: Arc<Store>,
    signal: Arc<Notify>,
    cell_id: String,
    secret: ClusterSecret,
    links: Arc<std::collections::BTreeMap<String, String>>,
) -> Result<(), PipelineError> {
    let mut destinations: HashMap<String, Destination> = HashMap::new();
    loop {
        let mut m = Mutation::new();
        let mut waiting: HashSet<String> = HashSet::new();
        // One pass over the queue, page by page: records behind a backed-off
        // destination's backlog still go out to every other destination.
        let (mut after, mut seen) = (0, 0);
        loop {
            let pending = store.forwards(after, PAGE)?;
            let Some(&(last, _)) = pending.last() else {
                break;
            };
            after = last;
            seen += pending.len();
            for (id, record) in pending {
                if waiting.contains(&record.endpoint) {
                    continue;
                }
                let Some(dest) = destination(&mut destinations, &record.endpoint, &links) else {
                    tracing::error!(endpoint = %record.endpoint, "dropping forward to an invalid endpoint");
                    m.delete_forward(id);
                    continue;
                };
                if dest.retry_at > Instant::now() {
                    waiting.insert(record.endpoint);
                    continue;
                }
                if deliver(dest, &cell_id, &secret, &record).await {
                    m.delete_forward(id);
                } else {
                    waiting.insert(record.endpoint);
                }
            }
            if seen >= MAX_PASS {
                break;
            }
        }
        let idle = m.is_empty();
        store.commit(m).await?;
        if idle {
            // Nothing queued, or everything waits for a backoff to pass.
            let wait = if seen == 0 {
                Duration::from_secs(1)
            } else {
                Duration::from_millis(100)
            };
            let _ = tokio::time::timeout(wait, signal.notified()).await;
        }
    }
}

/// Sends one record; on failure backs its destination off.
async fn deliver(
    dest: &mut Destination,
    cell_id: &str,
    secret: &ClusterSecret,
    record: &ForwardRecord,
) -> bool {
    let events: Vec<PeerEvent> = record
        .events
        .iter()
        .filter_map(|e| PeerEvent::decode(e.as_slice()).ok())
        .collect();
    let mut request = tonic::Request::new(DeliverBatchRequest {
        source_cell: cell_id.to_string(),
        events,
    });
    secret.attach(&mut request);
    match tokio::time::timeout(DELIVER_TIMEOUT, dest.client.deliver_batch(request)).await {
        Ok(Ok(_)) => {
            dest.backoff = Duration::from_millis(100);
            true
        }
        outcome => {
            let error = match outcome {
                Ok(Err(status)) => status.to_string(),
                _ => "timed out".to_string(),
            };
            tracing::warn!(endpoint = %record.endpoint, %error, "forward failed; backing off");
            dest.retry_at = Instant::now() + dest.backoff;
            dest.backoff = (dest.backoff * 2).min(MAX_BACKOFF);
            false
        }
    }
}

fn destination<'a>(
    destinations: &'a mut HashMap<String, Destination>,
    endpoint: &str,
    links: &std::collections::BTreeMap<String, String>,
) -> Option<&'a mut Destination> {
    if !destinations.contains_key(endpoint) {
        let dial = cellmesh_proto::config::via(links, endpoint);
        let channel = Endpoint::from_shared(dial.to_string())
            .ok()?
            .connect_timeout(Duration::from_secs(2))
            .connect_lazy();
        destinations.insert(
            endpoint.to_string(),
            Destination {
                client: CellPeerClient::new(channel),
                retry_at: Instant::now(),
                backoff: Duration::from_millis(100),
            },
        );
    }
    destinations.get_mut(endpoint)
}
