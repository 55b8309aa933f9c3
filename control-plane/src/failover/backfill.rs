//! Backfill after a failed cell returns: every conversation that was failed
//! over away from it gets the history the returned cell still holds (the
//! seqs below the failover floor) copied into its current owner, which then
//! stops reporting that history as unavailable. The copy carries the
//! conversation's meta (for an owner that never received it) and its floor
//! jumps.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::time::Duration;

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::{CopyRequest, TenantConversationsRequest};
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::peers::Peers;
use cellmesh_route_client::table::Key;

/// Copies back what `returned` holds; returns (conversations backfilled,
/// messages copied).
pub async fn backfill(
    routes: &RouteClient,
    peers: &Peers,
    secret: &ClusterSecret,
    returned: &str,
) -> (usize, u64) {
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
    // What the returned cell holds of those tenants, and where each of
    // those conversations lives now.
    let mut work: Vec<(u64, u64, String)> = Vec::new();
    for tenant in tenants {
        let conversations = match stored_conversations(peers, &source, secret, TenantId(tenant))
            .await
        {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!(tenant, error = %e.message(), "backfill cannot list the returned cell");
                continue;
            }
        };
        routes.read(|t| {
            for conversation in conversations {
                let Some(r) = t.resolve(&Key::conversation(
                    TenantId(tenant),
                    ConversationId(conversation),
                )) else {
                    continue;
                };
                if r.entry.cell != returned && r.entry.floor_margin > 0 {
                    work.push((tenant, conversation, r.cell_address));
                }
            }
        });
    }
    let (mut done, mut messages) = (0, 0);
    for (tenant, conversation, owner) in work {
        let Ok(mut client) = peers.cell(&owner) else {
            continue;
        };
        let mut request = tonic::Request::new(CopyRequest {
            source_address: source.clone(),
            tenant_id: tenant,
            conversation_id: conversation,
            after_seq: 0,
            max_messages: 0,
            chunk: 1000,
            backfill: true,
        });
        secret.attach(&mut request);
        request.set_timeout(Duration::from_secs(60));
        match client.copy_conversation(request).await {
            Ok(r) => {
                done += 1;
                messages += r.into_inner().messages;
            }
            // The returned cell never had it: nothing to copy back.
            Err(e) if e.code() == tonic::Code::NotFound => {}
            Err(e) => tracing::warn!(conversation, error = %e.message(), "backfill failed"),
        }
    }
    (done, messages)
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
