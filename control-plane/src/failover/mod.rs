//! Unit degradation and failover (DESIGN.md §6): a [`detector`] turns health
//! probes into verdicts with hysteresis, a pure [`trigger`] says when a
//! failed cell is failed over, a pure [`planner`] turns it into route
//! changes, and [`execute`] applies them through the route
//! table's compare-and-set (a lost race is re-planned next round).
//! [`fail_fenced`] is the failover an operator asks for; [`holds`] are the
//! planned restarts it waits out.

pub mod backfill;
pub mod detector;
pub mod holds;
pub mod planner;
pub mod trigger;

use std::time::Duration;

use cellmesh_proto::v1::RouteCommand;
use cellmesh_route_client::client::RouteClient;

use planner::{FailoverPlan, plan_failover};

/// How long [`execute`] waits for its own view of what it applied.
const READ_YOUR_WRITES: Duration = Duration::from_secs(2);

/// Applies `commands` in order; stops at the first refusal (the caller
/// re-plans from the fresh table). Returns how many were applied, once
/// `routes` shows them (or after [`READ_YOUR_WRITES`]).
pub async fn execute(
    routes: &RouteClient,
    commands: &[RouteCommand],
) -> Result<usize, tonic::Status> {
    let mut last = 0;
    for (i, command) in commands.iter().enumerate() {
        match routes.apply(command.clone()).await {
            Ok(applied) => last = applied.index,
            Err(status) => {
                tracing::warn!(applied = i, error = %status.message(), "failover step refused");
                return Err(status);
            }
        }
    }
    // Read your writes: this client's view shows the moves once it returns.
    routes.wait_applied(last, READ_YOUR_WRITES).await;
    Ok(commands.len())
}

/// Fails `cell` over now (`ctl fail`): marks it Down, waits `fence` — the
/// cells' owner lease, after which a cell cut off from the route table has
/// stopped writing, so it and its successor never write at once — then
/// moves everything it owns (floors: the high-water mark its successor
/// holds + `margin`). `fenced` is
/// told when the wait begins. The plan as applied.
pub async fn fail_fenced(
    routes: &RouteClient,
    cell: &str,
    margin: u64,
    fence: Duration,
    fenced: impl FnOnce(&FailoverPlan),
) -> Result<FailoverPlan, tonic::Status> {
    let plan_now = || {
        routes
            .read(|t| plan_failover(t, cell, margin))
            .map_err(|e| tonic::Status::failed_precondition(e.to_string()))
    };
    let plan = plan_now()?;
    // The planner's first command marks the cell Down.
    execute(routes, &plan.commands[..1]).await?;
    if !fence.is_zero() {
        fenced(&plan);
        tokio::time::sleep(fence).await;
    }
    // Planned again: the successor may have changed its own holder list
    // during the fence (a conflict on its epoch is planned once more).
    let mut attempts = 0;
    loop {
        let plan = plan_now()?;
        match execute(routes, &plan.commands[1..]).await {
            Ok(_) => return Ok(plan),
            Err(status)
                if attempts < 5
                    && cellmesh_proto::status::error_detail(&status).known_reason()
                        == Some(cellmesh_proto::reason::Reason::StaleEpoch) =>
            {
                attempts += 1;
                let _ = routes.catch_up().await;
            }
            Err(status) => return Err(status),
        }
    }
}
