//! Unit degradation and failover (DESIGN.md §6): a [`detector`] turns health
//! probes into verdicts with hysteresis, a pure [`planner`] turns a failed
//! cell into route changes, and [`execute`] applies them through the route
//! table's compare-and-set (a lost race is re-planned next round).
//! [`fail_fenced`] is the failover an operator asks for.

pub mod backfill;
pub mod detector;
pub mod planner;

use std::time::Duration;

use cellmesh_proto::v1::RouteCommand;
use cellmesh_router::client::RouteClient;

use planner::{FailoverPlan, plan_failover};

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

/// Fails `cell` over now (`ctl fail`): marks it Down, waits `fence` — the
/// cells' owner lease, after which a cell cut off from the route table has
/// stopped writing, so it and its successor never write at once — then
/// moves everything it owns (floors: checkpoint + `margin`). `fenced` is
/// told when the wait begins. The plan as applied.
pub async fn fail_fenced(
    routes: &RouteClient,
    cell: &str,
    margin: u64,
    fence: Duration,
    fenced: impl FnOnce(&FailoverPlan),
) -> Result<FailoverPlan, tonic::Status> {
    let plan = routes
        .read(|t| plan_failover(t, cell, margin))
        .map_err(|e| tonic::Status::failed_precondition(e.to_string()))?;
    // The planner's first command marks the cell Down.
    let (down, moves) = plan.commands.split_at(1.min(plan.commands.len()));
    execute(routes, down).await?;
    if !fence.is_zero() {
        fenced(&plan);
        tokio::time::sleep(fence).await;
    }
    execute(routes, moves).await?;
    Ok(plan)
}
