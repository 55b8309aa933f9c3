//! A cell the forwarder delivers to: its client, its backoff, and how a
//! batch reaches it — on an ordered `DeliverStream`, so the next batch need
//! not wait for this one's answer, or one `DeliverBatch` call at a time
//! (the standbys' queue, and a cell of an earlier release that serves no
//! streams).

use cellmesh_proto::ids::{TenantId, UserId};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
use cellmesh_proto::v1::{DeliverBatchRequest, DeliverBatchResponse};
use cellmesh_telemetry::trace::grpc::Channel;

use super::deliver_stream::{DeliverStream, Undelivered};
use crate::user::UserKey;

pub const DELIVER_TIMEOUT: Duration = Duration::from_secs(10);

/// What a destination left for later of a batch.
pub struct Answer {
    /// Users not homed there.
    pub refused_users: Vec<UserKey>,
    /// Standby events (their places in the batch) it could not judge yet.
    pub deferred: Vec<u32>,
}

impl From<DeliverBatchResponse> for Answer {
    fn from(response: DeliverBatchResponse) -> Self {
        Answer {
            refused_users: (response.refused.iter())
                .map(|u| UserKey::new(TenantId(u.tenant_id), UserId(u.user_id)))
                .collect(),
            deferred: response.deferred_standby_events,
        }
    }
}

/// A batch's answer, or why it was not delivered.
pub type Call = Pin<Box<dyn Future<Output = Result<Answer, Undelivered>> + Send>>;

pub struct Destination {
    client: CellPeerClient<Channel>,
    pub retry_at: Instant,
    pub backoff: Duration,
    stream: Option<DeliverStream>,
    /// Batches go one call at a time.
    unary: bool,
    /// The stream refused a user, and goes on refusing them for as long
    /// as it lasts: a new one is opened at the next pass.
    pub refused: bool,
}

impl Destination {
    /// Sends `batch`. Says whether it rides an ordered stream: a later
    /// batch may then go out before this one is answered.
    pub fn send(
        &mut self,
        batch: DeliverBatchRequest,
        secret: &ClusterSecret,
        streamed: bool,
    ) -> (Call, bool) {
        if self.unary || !streamed {
            let call = unary(self.client.clone(), secret.clone(), batch);
            return (Box::pin(call), false);
        }
        let stream = self.stream.get_or_insert_with(|| {
            DeliverStream::open(self.client.clone(), secret, DELIVER_TIMEOUT)
        });
        let answer = stream.submit(batch);
        let call = async move {
            match answer.await {
                Ok(outcome) => outcome.map(Answer::from),
                Err(_) => Err(Undelivered::Closed),
            }
        };
        (Box::pin(call), true)
    }

    /// Between passes (nothing in flight): a broken stream, or one that
    /// refused a user (whose home may come back here), is dropped so the
    /// next batch opens a new one; a cell that serves no streams gets one
    /// call at a time from now on.
    pub fn renew(&mut self, endpoint: &str) {
        let Some(stream) = &self.stream else {
            return;
        };
        if std::mem::take(&mut self.refused) {
            self.stream = None;
            return;
        }
        if !stream.is_broken() {
            return;
        }
        if stream.unimplemented() {
            tracing::info!(%endpoint, "the cell serves no delivery streams; delivering one batch at a time");
            self.unary = true;
        }
        self.stream = None;
    }
}

/// Sends one batch in a call of its own.
async fn unary(
    mut client: CellPeerClient<Channel>,
    secret: ClusterSecret,
    batch: DeliverBatchRequest,
) -> Result<Answer, Undelivered> {
    let mut request = tonic::Request::new(batch);
    secret.attach(&mut request);
    match tokio::time::timeout(DELIVER_TIMEOUT, client.deliver_batch(request)).await {
        Ok(Ok(response)) => Ok(response.into_inner().into()),
        Ok(Err(status)) => Err(Undelivered::Refused(status)),
        Err(_) => Err(Undelivered::TimedOut),
    }
}

/// The destination at `endpoint`, created on first use.
pub fn destination<'a>(
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
                stream: None,
                unary: false,
                refused: false,
            },
        );
    }
    destinations.get_mut(endpoint)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellmesh_proto::v1::DeliverBatchRequest;

    #[tokio::test]
    async fn a_stream_that_refused_a_user_is_replaced_between_passes() {
        let peers = cellmesh_route_client::peers::Peers::new(Default::default());
        let mut all = HashMap::new();
        let d = destination(&mut all, "http://127.0.0.1:1", &peers).unwrap();
        let (_call, ordered) = d.send(
            DeliverBatchRequest::default(),
            &ClusterSecret::default(),
            true,
        );
        assert!(ordered, "a users' queue rides a stream");
        // Not refused, not (yet) broken: the stream stays.
        d.renew("http://127.0.0.1:1");
        assert!(d.stream.is_some());
        d.refused = true;
        d.renew("http://127.0.0.1:1");
        assert!(
            d.stream.is_none(),
            "a stream that refused a user is dropped"
        );
        assert!(!d.refused && !d.unary);
        // The standbys' queue goes one call at a time.
        let (_call, ordered) = d.send(
            DeliverBatchRequest::default(),
            &ClusterSecret::default(),
            false,
        );
        assert!(!ordered && d.stream.is_none());
    }
}
