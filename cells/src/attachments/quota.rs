//! A tenant's quota over every cell: every `quota_sync_secs` a cell asks
//! the other cells of the route table for their bytes of the tenants with a
//! quota (`CellPeer.Stats`), and a reservation is measured against its own
//! count plus theirs. Between two rounds the cells together may go over by
//! what is reserved elsewhere meanwhile; a cell that does not answer keeps
//! its last answer, so a quota is never loosened by a cell being away.

use cellmesh_proto::ids::TenantId;
use std::collections::HashMap;

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::StatsRequest;
use cellmesh_route_client::peers::Peers;

use super::Attachments;

impl Attachments {
    /// `tenant`'s bytes on the other cells, as they last answered.
    pub fn elsewhere(&self, tenant: TenantId) -> u64 {
        let elsewhere = self.elsewhere.lock().expect("elsewhere lock");
        elsewhere
            .values()
            .filter_map(|tenants| tenants.get(&tenant.get()))
            .sum()
    }

    /// Asks each of `cells` (addresses) for its bytes of the tenants with a
    /// quota; how many answered. Cells no longer listed are dropped.
    pub async fn sync_quotas(
        &self,
        cells: Vec<String>,
        peers: &Peers,
        secret: &ClusterSecret,
    ) -> usize {
        let tenants = self.config.quota_tenants();
        if tenants.is_empty() {
            return 0;
        }
        let tenants = &tenants;
        let asks = cells.iter().map(|address| async move {
            let mut client = peers.cell(address).ok()?;
            let mut request = tonic::Request::new(StatsRequest {});
            request.set_timeout(std::time::Duration::from_secs(2));
            secret.attach(&mut request);
            let stats = client.stats(request).await.ok()?.into_inner();
            let bytes: HashMap<u64, u64> = (stats.files.iter())
                .filter(|f| tenants.contains(&TenantId(f.tenant_id)))
                .map(|f| (f.tenant_id, f.bytes))
                .collect();
            Some((address.clone(), bytes))
        });
        let answers = futures::future::join_all(asks).await;
        let mut elsewhere = self.elsewhere.lock().expect("elsewhere lock");
        elsewhere.retain(|address, _| cells.contains(address));
        let mut answered = 0;
        for (address, bytes) in answers.into_iter().flatten() {
            elsewhere.insert(address, bytes);
            answered += 1;
        }
        answered
    }
}
