//! Backfill after a failed cell returns: every conversation that was failed
//! over away from it gets the history the returned cell still holds (the
//! seqs below the failover floor) copied into its current owner, which then
//! stops reporting that history as unavailable. The copy carries the
//! conversation's meta (for an owner that never received it) and its floor
//! jumps. A copy that fails is tried again for a while.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::time::Duration;

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::{CopyRequest, TenantConversationsRequest};
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::peers::Peers;
use cellmesh_route_client::table::Key;

/// What one backfill did, and what it gave up on.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Conversations whose history was copied into their owner.
    pub conversations: usize,
    /// The messages copied.
    pub messages: u64,
    /// Tenants whose conversations the returned cell never listed (it kept
    /// failing to answer): their history stays unavailable.
    pub unlisted: usize,
    /// Conversations whose copy kept failing.
    pub failed: usize,
}

impl Outcome {
    /// What it gave up on: tenants unlisted and conversations not copied.
    pub fn abandoned(&self) -> usize {
        self.unlisted + self.failed
    }
}

/// Copies back what `returned` holds.
pub async fn backfill(
    routes: &RouteClient,
    peers: &Peers,
    secret: &ClusterSecret,
    returned: &str,
) -> Outcome {
    let (source, tenants) = routes.read(|t| {
        let source = t
            .cell(returned)
            .map(|c| c.address.clone())
            .unwrap_or_default();
        // Every failed-over tenant: a route remembers only the first cell a
        // chain of failovers took it from (A → B → A still names A), and the
        // returned cell may be a later link of the chain.
        let tenants: std::collections::BTreeSet<u64> = t
            .routes
            .values()
            .filter(|e| e.failed_from.is_some())
            .map(|e| e.key.tenant.get())
            .collect();
        (source, tenants)
    });
    // What the returned cell holds of those tenants. A cell just back may
    // not answer at once: its listing is tried again like a copy.
    let (listed, unlisted) = retried(tenants.into_iter().map(TenantId).collect(), |tenant| {
        let source = &source;
        async move {
            let ids = stored_conversations(peers, source, secret, tenant).await;
            ids.map_err(|e| {
                tracing::warn!(tenant = tenant.get(), error = %e.message(), "backfill cannot list the returned cell");
            })
        }
    })
    .await;
    let held: Vec<(TenantId, ConversationId)> = listed
        .into_iter()
        .flat_map(|(tenant, ids)| ids.into_iter().map(move |c| (tenant, ConversationId(c))))
        .collect();
    // A copy that fails (an owner busy or restarting, a link cut) is tried
    // again, each time at the conversation's owner then: the history it
    // brings is nowhere else.
    let (copied, failed) = retried(held, |(tenant, conversation)| {
        let source = &source;
        async move {
            let Some(owner) = owner(routes, returned, (tenant, conversation)) else {
                return Ok(None);
            };
            match copy_back(peers, secret, source, (tenant, conversation), &owner).await {
                Ok(n) => Ok(Some(n)),
                // The returned cell never had it: nothing to copy back.
                Err(e) if e.code() == tonic::Code::NotFound => Ok(None),
                Err(e) => {
                    tracing::warn!(conversation = conversation.get(), error = %e.message(), "backfill failed");
                    Err(())
                }
            }
        }
    })
    .await;
    let copied: Vec<u64> = copied.into_iter().filter_map(|(_, n)| n).collect();
    Outcome {
        conversations: copied.len(),
        messages: copied.iter().sum(),
        unlisted: unlisted.len(),
        failed: failed.len(),
    }
}

/// Runs `work` on each of `items`, those it fails again up to [`RETRIES`]
/// times, backing off; returns what each that succeeded gave, and those
/// that kept failing.
async fn retried<T: Copy, R, F>(
    mut items: Vec<T>,
    mut work: impl FnMut(T) -> F,
) -> (Vec<(T, R)>, Vec<T>)
where
    F: std::future::Future<Output = Result<R, ()>>,
{
    let mut done = Vec::new();
    for attempt in 0..=RETRIES {
        if items.is_empty() {
            break;
        }
        if attempt > 0 {
            tokio::time::sleep(retry_after(attempt)).await;
        }
        let mut failed = Vec::new();
        for item in items {
            match work(item).await {
                Ok(r) => done.push((item, r)),
                Err(()) => failed.push(item),
            }
        }
        items = failed;
    }
    (done, items)
}

/// How many times a failed listing or copy is tried again (over about 15 s).
const RETRIES: u32 = 5;

/// The wait before try `attempt` (0.5, 1, 2, 4, 8 s).
fn retry_after(attempt: u32) -> Duration {
    Duration::from_millis(500 << (attempt - 1).min(4))
}

/// The address of `conversation`'s owner now, if it was failed over away
/// from `returned`.
fn owner(
    routes: &RouteClient,
    returned: &str,
    (tenant, conversation): (TenantId, ConversationId),
) -> Option<String> {
    routes.read(|t| {
        let r = t.resolve(&Key::conversation(tenant, conversation))?;
        (r.entry.cell != returned && r.entry.floor_margin > 0).then_some(r.cell_address)
    })
}

/// Has the owner at `owner` copy `conversation`'s history back from the
/// returned cell at `source`; the messages copied.
async fn copy_back(
    peers: &Peers,
    secret: &ClusterSecret,
    source: &str,
    (tenant, conversation): (TenantId, ConversationId),
    owner: &str,
) -> Result<u64, tonic::Status> {
    let mut client = (peers.cell(owner)).map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut request = tonic::Request::new(CopyRequest {
        source_address: source.to_string(),
        tenant_id: tenant.get(),
        conversation_id: conversation.get(),
        after_seq: 0,
        max_messages: 0,
        chunk: 1000,
        backfill: true,
    });
    secret.attach(&mut request);
    request.set_timeout(Duration::from_secs(60));
    Ok(client
        .copy_conversation(request)
        .await?
        .into_inner()
        .messages)
}

/// The ids of `tenant`'s conversations stored on the cell at `address`.
async fn stored_conversations(
    peers: &Peers,
    address: &str,
    secret: &ClusterSecret,
    tenant: TenantId,
) -> Result<Vec<u64>, tonic::Status> {
    let mut client =
        (peers.cell(address)).map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
    let (mut out, mut after) = (Vec::new(), 0);
    loop {
        let mut request = tonic::Request::new(TenantConversationsRequest {
            tenant_id: tenant.get(),
            after_id: after,
            limit: 10_000,
            epoch: 0,
        });
        secret.attach(&mut request);
        request.set_timeout(Duration::from_secs(30));
        let page = client.tenant_conversations(request).await?.into_inner();
        out.extend(&page.conversation_ids);
        match page.conversation_ids.last() {
            Some(&last) if page.has_more => after = last,
            _ => return Ok(out),
        }
    }
}
