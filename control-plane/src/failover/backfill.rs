//! Backfill after a failed cell returns: every conversation that was failed
//! over away from it gets the history the returned cell still holds (the
//! seqs below the failover floor) copied into its current owner, which then
//! stops reporting that history as unavailable.

use std::time::Duration;

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::CopyRequest;
use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::table::Key;
use tonic::transport::Channel;

/// Copies back what `returned` holds; returns (conversations backfilled,
/// messages copied).
pub async fn backfill(
    routes: &RouteClient,
    secret: &ClusterSecret,
    returned: &str,
) -> (usize, u64) {
    let (source, work) = routes.read(|t| {
        let source = t
            .cell(returned)
            .map(|c| c.address.clone())
            .unwrap_or_default();
        let work: Vec<(u64, u64, String)> = t
            .checkpoints
            .keys()
            .filter_map(|&(tenant, conversation)| {
                let r = t.resolve(&Key::conversation(tenant, conversation))?;
                (r.entry.cell != returned && r.entry.floor_margin > 0).then_some((
                    tenant,
                    conversation,
                    r.cell_address,
                ))
            })
            .collect();
        (source, work)
    });
    let (mut done, mut messages) = (0, 0);
    for (tenant, conversation, owner) in work {
        let Ok(endpoint) = Channel::from_shared(owner.clone()) else {
            continue;
        };
        let mut client = CellPeerClient::new(
            endpoint
                .connect_timeout(Duration::from_secs(2))
                .connect_lazy(),
        );
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
