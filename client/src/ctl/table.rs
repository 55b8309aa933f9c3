//! The `ctl` commands that read or change the route table directly: the
//! cells, one route, placing a tenant, failing a cell over, the
//! migrations in progress, and the router replicas.

use std::time::Duration;

use anyhow::Context;
use cellmesh_control_plane::failover::fail_fenced;
use cellmesh_proto::ids::TenantId;
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1 as pb;
use cellmesh_proto::v1::update_route::Transition;
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::commands::update_route;
use cellmesh_route_client::convert::{entry_to_pb, route_to_pb};
use cellmesh_route_client::table::{Entry, Phase, RouteState};
use serde_json::json;

use super::{KeyArgs, MigrationsCommand};
use crate::connect::describe;

/// `ctl cells`: every cell with its region, status and address.
pub(super) fn cells(routes: &RouteClient, json: bool) -> anyhow::Result<()> {
    let cells: Vec<_> = routes.read(|t| t.cells.values().cloned().collect());
    if json {
        let out: Vec<_> = cells
            .iter()
            .map(|c| json!({"cell_id": c.id, "region": c.region, "address": c.address, "status": format!("{:?}", c.status), "epoch": c.epoch}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("{:<20} {:<12} {:<10} ADDRESS", "CELL", "REGION", "STATUS");
        for c in cells {
            println!(
                "{:<20} {:<12} {:<10} {}",
                c.id,
                c.region,
                format!("{:?}", c.status),
                c.address
            );
        }
    }
    Ok(())
}

/// `ctl routes get`: where a tenant, conversation or user home lives.
pub(super) async fn route(
    routes: &RouteClient,
    key: &KeyArgs,
    linearizable: bool,
    json: bool,
) -> anyhow::Result<()> {
    let key = key.key();
    let (route, entry) = if linearizable {
        let r = routes
            .resolve_linearizable(&key)
            .await
            .map_err(|e| anyhow::anyhow!(describe(&e)))?;
        (r.route.unwrap_or_default(), r.entry.unwrap_or_default())
    } else {
        let r = routes
            .resolve(&key)
            .with_context(|| format!("no route for {key}"))?;
        (route_to_pb(&r), entry_to_pb(&r.entry))
    };
    let state = pb::RouteState::try_from(route.state)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("ROUTE_STATE_")
                .to_string()
        })
        .unwrap_or_default();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "key": key.to_string(),
                "cell_id": route.cell_id,
                "cell_address": route.cell_address,
                "epoch": route.epoch,
                "state": state,
                "migrating_to": entry.migrating_to,
                "seq_floor": route.seq_floor,
                "override": entry.key.as_ref().is_some_and(|k| !matches!(k.scope, Some(pb::route_key::Scope::Tenant(_)))),
            }))?
        );
    } else {
        println!(
            "{key}: {} ({}) epoch {} {state}, seq floor {}",
            route.cell_id, route.cell_address, route.epoch, route.seq_floor
        );
    }
    Ok(())
}

/// `ctl tenant place`: a new tenant's entry on `cell`.
pub(super) async fn place_tenant(
    routes: &RouteClient,
    tenant: TenantId,
    cell: &str,
    regions: &[String],
) -> anyhow::Result<()> {
    let epoch = routes
        .place_tenant(tenant, cell)
        .await
        .map_err(|e| anyhow::anyhow!(describe(&e)))?;
    println!("tenant {tenant} placed on {cell} at epoch {epoch}");
    if !regions.is_empty() {
        residency(routes, tenant, Some(regions)).await?;
    }
    Ok(())
}

/// `ctl tenant residency`: the regions `tenant` is bound to, after binding
/// it to `regions` when given (empty: unbinding it).
pub(super) async fn residency(
    routes: &RouteClient,
    tenant: TenantId,
    regions: Option<&[String]>,
) -> anyhow::Result<()> {
    let key = cellmesh_route_client::table::Key::tenant(tenant);
    let fail = |e: tonic::Status| anyhow::anyhow!(describe(&e));
    match regions {
        Some(regions) => routes.bind_regions(tenant, regions).await,
        // What the leader holds now.
        None => routes.catch_up().await,
    }
    .map_err(fail)?;
    let route = routes
        .resolve(&key)
        .with_context(|| format!("tenant {tenant} is not placed"))?;
    match route.entry.regions.as_slice() {
        [] => println!("tenant {tenant}: any region (on {})", route.entry.cell),
        regions => println!(
            "tenant {tenant}: only in {} (on {})",
            regions.join(", "),
            route.entry.cell
        ),
    }
    Ok(())
}

/// `ctl fail`: mark `cell` Down and, after `fence`, move what it owns.
pub(super) async fn fail(
    routes: &RouteClient,
    cell: &str,
    margin: u64,
    fence: humantime::Duration,
) -> anyhow::Result<()> {
    let fence = Duration::from(fence);
    let plan = fail_fenced(routes, cell, margin, fence, |_| {
        println!(
            "{cell} is Down; moving its routes in {} (its owner lease)",
            humantime::format_duration(fence)
        )
    })
    .await
    .map_err(|e| anyhow::anyhow!(describe(&e)))?;
    println!(
        "{cell} is Down; {} routes moved to {} (floors: checkpoint + {margin})",
        plan.moved_entries, plan.fallback
    );
    for key in &plan.stranded {
        println!("{key}: stays on {cell}: no healthy holder of its marks lies in its regions");
    }
    Ok(())
}

/// `ctl migrations`: list the routes being moved, or cancel, pause or
/// resume one.
pub(super) async fn migrations(
    routes: &RouteClient,
    command: Option<MigrationsCommand>,
    json: bool,
) -> anyhow::Result<()> {
    match command {
        Some(MigrationsCommand::Cancel(moving)) => {
            let key = moving.key();
            let entry = routes
                .resolve(&key)
                .with_context(|| format!("no route for {key}"))?
                .entry;
            let command = update_route(&key, entry.epoch, Transition::Cancel(true));
            // A retry of a cancel whose answer was lost finds the route
            // back on its source.
            let cancelled = |e: &Entry| e.state == RouteState::Active && e.cell == entry.cell;
            let epoch = routes
                .apply_recognised(command, &key, entry.epoch, cancelled)
                .await
                .map_err(|e| anyhow::anyhow!(describe(&e)))?;
            println!(
                "{key}: migration cancelled, active on {} at epoch {epoch}",
                entry.cell
            );
        }
        Some(MigrationsCommand::Pause(ref moving) | MigrationsCommand::Resume(ref moving)) => {
            let pause = matches!(command, Some(MigrationsCommand::Pause(_)));
            let key = moving.key();
            let entry = routes
                .resolve(&key)
                .with_context(|| format!("no route for {key}"))?
                .entry;
            let (phase, wanted) = if pause {
                (pb::MigrationPhase::Paused, Phase::Paused)
            } else {
                (pb::MigrationPhase::CatchUp, Phase::CatchUp)
            };
            let command = update_route(&key, entry.epoch, Transition::SetPhase(phase as i32));
            // A retry of a write whose answer was lost finds the phase set.
            let set = |e: &Entry| matches!(&e.state, RouteState::Migrating { phase, .. } if *phase == wanted);
            let epoch = routes
                .apply_recognised(command, &key, entry.epoch, set)
                .await
                .map_err(|e| anyhow::anyhow!(describe(&e)))?;
            println!(
                "{key}: migration {} at epoch {epoch}",
                if pause { "paused" } else { "resumed" },
            );
        }
        None => {
            let moving: Vec<_> = routes.read(|t| {
                t.routes
                    .values()
                    .filter(|e| e.state != RouteState::Active)
                    .cloned()
                    .collect()
            });
            if json {
                let out: Vec<_> = moving
                .iter()
                .map(|e| {
                    let (state, to, phase) = match &e.state {
                        RouteState::Migrating { to, phase } => ("Migrating", to.clone(), format!("{phase:?}")),
                        RouteState::Frozen { to } => ("Frozen", to.clone(), "Freeze".into()),
                        RouteState::Active => ("Active", String::new(), String::new()),
                    };
                    json!({"key": e.key.to_string(), "from": e.cell, "to": to, "state": state, "phase": phase, "epoch": e.epoch})
                })
                .collect();
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else if moving.is_empty() {
                println!("no migrations in progress");
            } else {
                for e in moving {
                    println!("{}: {} {:?} (epoch {})", e.key, e.cell, e.state, e.epoch);
                }
            }
        }
    }
    Ok(())
}

/// `ctl routers`: every router replica's raft state.
pub(super) async fn routers(
    endpoints: &[String],
    secret: &ClusterSecret,
    json: bool,
) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for endpoint in endpoints {
        let status = cellmesh_control_plane::status::router_status(endpoint, secret)
            .await
            .map_err(|e| describe(&e));
        rows.push((endpoint.clone(), status));
    }
    if json {
        let out: Vec<_> = rows
            .iter()
            .map(|(e, s)| match s {
                Ok(s) => json!({"endpoint": e, "node_id": s.node_id, "region": s.region, "role": s.role, "leader": s.current_leader, "term": s.term, "applied_index": s.applied_index, "last_log_index": s.last_log_index, "snapshot_index": s.snapshot_index}),
                Err(err) => json!({"endpoint": e, "error": err}),
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "{:<28} {:>4} {:<10} {:<10} {:>6} {:>8} {:>8}",
            "ENDPOINT", "ID", "REGION", "ROLE", "LEADER", "TERM", "APPLIED"
        );
        for (e, s) in rows {
            match s {
                Ok(s) => println!(
                    "{e:<28} {:>4} {:<10} {:<10} {:>6} {:>8} {:>8}",
                    s.node_id, s.region, s.role, s.current_leader, s.term, s.applied_index
                ),
                Err(err) => println!("{e:<28} unreachable: {err}"),
            }
        }
    }
    Ok(())
}
