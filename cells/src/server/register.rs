//! A routed cell's place in the deployment once it serves: its entry in
//! the route table (address, region, release), its lease in etcd when the
//! deployment has one, and the rounds that ship its high-water marks to
//! its standbys.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::commands::register_leased_cell;

use super::StartError;
use crate::config::CellConfig;
use crate::hwm::HighWaterMarks;
use crate::message::MessageService;

/// The cell's region (see [`crate::config::region_of`]).
pub(super) fn region(config: &CellConfig) -> &str {
    crate::config::region_of(&config.cell_id)
}

/// Registers the cell serving on `addr` and starts its mark rounds; the
/// etcd lease it holds while it serves, if any.
pub(super) async fn register(
    config: &Arc<CellConfig>,
    routes: RouteClient,
    marks: Arc<HighWaterMarks>,
    coordination: Option<Arc<dyn cellmesh_coord::Coordination>>,
    service: &Arc<MessageService>,
    addr: SocketAddr,
) -> Result<Option<cellmesh_coord::Lease>, StartError> {
    let advertise = if config.routing.advertise.is_empty() {
        format!("http://{addr}")
    } else {
        config.routing.advertise.clone()
    };
    let region = region(config);
    // The control plane waits out the lease announced here before it
    // fails the cell over.
    let lease = config.routing.owner_lease_ms;
    routes
        .apply(register_leased_cell(
            &config.cell_id,
            region,
            &advertise,
            lease,
        ))
        .await
        .map_err(|e| StartError::Routing(format!("cannot register: {}", e.message())))?;
    routes.report_process("cell", &config.cell_id, &advertise);
    routes.keep_cell_release(&config.cell_id, region, &advertise, lease);
    let mut registration = None;
    if let Some(etcd) = coordination.filter(|_| !config.routing.etcd_endpoints.is_empty()) {
        use cellmesh_coord::CELLS_PREFIX;
        let lease = etcd
            .register(
                &format!("{CELLS_PREFIX}{}", config.cell_id),
                &advertise,
                Duration::from_millis(config.routing.lease_ttl_ms),
            )
            .await
            .map_err(|e| StartError::Routing(e.to_string()))?;
        registration = Some(lease);
    }
    let rounds = crate::hwm::round::Rounds::new(marks, routes, config);
    tokio::spawn(rounds.run(
        Duration::from_millis(config.routing.checkpoint_interval_ms),
        Arc::downgrade(service),
    ));
    Ok(registration)
}
