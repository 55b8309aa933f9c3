//! `cellmesh ctl hold`: failover holds for planned restarts (an upgrade, a
//! host's reboot), recorded by the control plane: while a cell is held the
//! control plane neither fences it nor fails it over for failed probes.

use std::time::Duration;

use cellmesh_control_plane::failover::holds;
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1 as pb;
use clap::Args;

use crate::connect::describe;

#[derive(Args)]
pub struct HoldArgs {
    /// The cell; none: list the holds in force.
    cell: Option<String>,
    /// How long from now (an hour at most).
    #[arg(long = "for", default_value = "10m")]
    length: humantime::Duration,
    /// Shown with the hold.
    #[arg(long, default_value = "")]
    reason: String,
    /// End the cell's hold now: a cell still failing is failed over.
    #[arg(long)]
    release: bool,
    #[arg(long)]
    json: bool,
}

pub async fn run(admin: &[String], secret: &ClusterSecret, args: HoldArgs) -> anyhow::Result<()> {
    let in_force = match &args.cell {
        Some(cell) => {
            let length = if args.release {
                Duration::ZERO
            } else {
                *args.length
            };
            holds::request(admin, secret, cell, length, &args.reason)
                .await
                .map_err(|e| anyhow::anyhow!(describe(&e)))?
        }
        None => {
            anyhow::ensure!(!args.release, "--release needs the cell");
            let mut client = super::ops::connect(admin).await?;
            client
                .list_failover_holds(super::ops::request(secret, pb::ListFailoverHoldsRequest {}))
                .await
                .map_err(|e| anyhow::anyhow!(describe(&e)))?
                .into_inner()
                .holds
        }
    };
    if args.json {
        let rows: Vec<_> = in_force
            .iter()
            .map(|h| serde_json::json!({"cell": h.cell_id, "until_ms": h.until_ms, "reason": h.reason}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else if in_force.is_empty() {
        println!("no failover holds");
    } else {
        let now = cellmesh_operations::now_ms();
        for h in &in_force {
            let left = h.until_ms.saturating_sub(now).div_ceil(1000);
            let why = if h.reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", h.reason)
            };
            println!("{}: failover held for {left} s more{why}", h.cell_id);
        }
    }
    Ok(())
}
