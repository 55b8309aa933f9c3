//! The seq floor each conversation's owner assigns above, as the owner
//! sees it. A failover floor is not in the route table (which holds nothing
//! per conversation): the route carries a margin, and the new owner adds it
//! to the high-water mark it holds from the failed cell. Drills and tests
//! ask the owner for that mark to learn which gaps a failover explains.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::GetHighWaterMarksRequest;
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::peers::Peers;
use cellmesh_route_client::table::Key;

/// The floor of each of `conversations` of `tenant` now (conversations
/// without a route are left out; an owner that does not answer gives the
/// route's own floor).
pub async fn failover_floors(
    routes: &RouteClient,
    secret: &ClusterSecret,
    tenant: u64,
    conversations: &[u64],
) -> BTreeMap<u64, u64> {
    let mut floors = BTreeMap::new();
    let peers = Peers::default();
    // Owner address → (conversation, margin) of failed-over routes.
    let mut ask: HashMap<String, Vec<(u64, u64)>> = HashMap::new();
    routes.read(|t| {
        for &c in conversations {
            let Some(r) = t.resolve(&Key::conversation(TenantId(tenant), ConversationId(c))) else {
                continue;
            };
            floors.insert(c, r.seq_floor);
            if r.entry.floor_margin > 0 {
                ask.entry(r.cell_address)
                    .or_default()
                    .push((c, r.entry.floor_margin));
            }
        }
    });
    for (address, wanted) in ask {
        let Ok(mut peer) = peers.cell(&address) else {
            continue;
        };
        let mut request = tonic::Request::new(GetHighWaterMarksRequest {
            tenant_id: tenant,
            conversation_ids: wanted.iter().map(|&(c, _)| c).collect(),
        });
        secret.attach(&mut request);
        request.set_timeout(Duration::from_secs(5));
        let Ok(held) = peer.get_high_water_marks(request).await else {
            continue;
        };
        for (mark, (c, margin)) in held.into_inner().marks.iter().zip(&wanted) {
            let floor = floors.entry(*c).or_default();
            *floor = (*floor).max(mark.hwm + margin);
        }
    }
    floors
}
