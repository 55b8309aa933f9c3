//! Unit degradation and failover (DESIGN.md §6): a [`detector`] turns health
//! probes into verdicts with hysteresis, a pure [`planner`] turns a failed
//! cell into route changes, and [`execute`] applies them through the route
//! table's compare-and-set (a lost race is re-planned next round).

pub mod backfill;
pub mod detector;
pub mod planner;

use cellmesh_proto::v1::RouteCommand;
use cellmesh_router::client::RouteClient;

/// Applies `commands` in order; stops at the first refusal (the caller
/// re-plans from the fresh table). Returns how many were applied.
pub async fn execute(
    routes: &RouteClient,
    commands: &[RouteCommand],
) -> Result<usize, tonic::Status> {
    for (i, command) in commands.iter().enumerate() {
        if let Err(status) = routes.apply(command.clone()).await {
            tracing::warn!(applied = i, error = %status.message(), "failover step refused");
            return Err(status);
        }
    }
    Ok(commands.len())
}
