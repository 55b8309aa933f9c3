//! Deliveries of fan-out events from other cells: one batch per call
//! (`DeliverBatch`), or batches in order on one stream (`DeliverStream`),
//! which a forwarder keeps full without waiting for each answer. A stream
//! applies its batches one after another, ends at the first failure, and
//! keeps refusing a user it refused once, so an event never overtakes an
//! earlier one for the same user.

use cellmesh_proto::ids::{TenantId, UserId};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use cellmesh_proto::tls::Peer;
use cellmesh_proto::v1::{DeliverBatchRequest, DeliverBatchResponse, TenantUser};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use crate::message::MessageService;
use crate::migration::pipeline_unavailable;
use crate::pipeline::{PeerInbound, for_standby};
use crate::user::UserKey;

/// How long a delivery of replicated meta waits for this cell's route
/// table to reach the sender's index.
const STANDBY_ROUTE_WAIT: Duration = Duration::from_secs(2);

/// Answers in flight on one stream before its reader waits.
const STREAM_DEPTH: usize = 64;

pub type AnswerStream = ReceiverStream<Result<DeliverBatchResponse, Status>>;

/// Applies one batch. `refused` holds users refused earlier on the same
/// stream: their events are refused again without being looked at.
pub async fn deliver(
    inbound: &PeerInbound,
    service: &MessageService,
    peer: Option<&Peer>,
    r: DeliverBatchRequest,
    refused: &mut HashSet<UserKey>,
) -> Result<DeliverBatchResponse, Status> {
    // With mutual TLS, a cell delivers only as itself.
    if let Some(peer) = peer
        && (peer.role != cellmesh_proto::tls::Role::Cell || peer.id != r.source_cell)
    {
        return Err(cellmesh_proto::tls::denied(format!(
            "{peer} may not deliver as cell {:?}",
            r.source_cell
        )));
    }
    tracing::debug!(source = %r.source_cell, events = r.events.len(), "deliver batch");
    // Who owns a replicated conversation is judged on a table at least
    // as new as the sender's; what a view that does not get there in
    // time would refuse, the sender keeps and delivers again.
    let view_behind = r.route_index > 0
        && r.events.iter().any(for_standby)
        && !(service.ownership())
            .await_route_index(r.route_index, STANDBY_ROUTE_WAIT)
            .await;
    let (events, again): (Vec<_>, Vec<_>) = r.events.into_iter().partition(|e| {
        for_standby(e) || !refused.contains(&UserKey::new(TenantId(e.tenant_id), UserId(e.user_id)))
    });
    let delivered = inbound
        .deliver(r.source_cell, events, view_behind)
        .await
        .map_err(pipeline_unavailable)?;
    let mut users: Vec<UserKey> = again
        .iter()
        .map(|e| UserKey::new(TenantId(e.tenant_id), UserId(e.user_id)))
        .collect();
    users.extend(delivered.refused_users.iter().copied());
    users.sort_by_key(|u| (u.tenant, u.user));
    users.dedup();
    refused.extend(users.iter().copied());
    Ok(DeliverBatchResponse {
        applied: delivered.applied,
        refused: users
            .iter()
            .map(|u| TenantUser {
                tenant_id: u.tenant.get(),
                user_id: u.user.get(),
            })
            .collect(),
        refused_standby_events: delivered.refused_standby,
        deferred_standby_events: delivered.deferred_standby,
    })
}

/// Serves one `DeliverStream`: its batches in order, each answered before
/// the next is read, until the sender closes it, a batch fails, or the cell
/// begins to shut down (`closing`), which a stream would otherwise hold open.
pub fn stream(
    inbound: PeerInbound,
    service: Arc<MessageService>,
    peer: Option<Peer>,
    mut batches: Streaming<DeliverBatchRequest>,
    mut closing: watch::Receiver<bool>,
) -> AnswerStream {
    let (tx, rx) = mpsc::channel(STREAM_DEPTH);
    tokio::spawn(async move {
        let mut refused = HashSet::new();
        loop {
            let next = tokio::select! {
                next = batches.message() => next,
                _ = closed(&mut closing) => return,
            };
            let r = match next {
                Ok(Some(r)) => r,
                Ok(None) => return,
                Err(status) => {
                    tracing::debug!(%status, "a delivery stream ended");
                    return;
                }
            };
            let answer = deliver(&inbound, &service, peer.as_ref(), r, &mut refused).await;
            let failed = answer.is_err();
            if tx.send(answer).await.is_err() || failed {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Resolves once `closing` turns true (never, if its sender is gone).
async fn closed(closing: &mut watch::Receiver<bool>) {
    if closing.wait_for(|closing| *closing).await.is_err() {
        std::future::pending::<()>().await;
    }
}
