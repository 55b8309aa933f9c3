//! `ctl backfill`: copies the history a failed-over cell holds into its
//! conversations' current owners, as the control plane does when the cell
//! returns. The control plane tries each copy for about 15 s and then gives
//! up (`cellmesh_backfill_abandoned_total`, "backfill gave up" in its log);
//! running this once the cause is gone (an owner that kept refusing, a cut
//! link) brings the rest back. A copy is idempotent: messages an owner
//! already holds are left as they are, so running it again is harmless.

use cellmesh_control_plane::failover::backfill::{Outcome, backfill};
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::peers::Peers;
use cellmesh_route_client::table::CellStatus;

/// Runs the backfill of `cell`, which must be registered and no longer
/// marked Down (the control plane marks it Up once it answers its probes
/// again; until then it may not answer a copy either).
pub async fn run(
    routes: &RouteClient,
    secret: &ClusterSecret,
    cell: &str,
) -> anyhow::Result<Outcome> {
    let status = routes.read(|t| t.cell(cell).map(|c| c.status));
    match status {
        None => anyhow::bail!("no cell {cell:?} in the route table"),
        Some(CellStatus::Down) => anyhow::bail!(
            "{cell} is Down: its history can be copied back once it has returned \
             (the control plane marks it Up when it answers its probes again)"
        ),
        Some(_) => {}
    }
    Ok(backfill(routes, &Peers::default(), secret, cell).await)
}

/// `ctl backfill`: runs it and prints what it did; an error when it gave
/// up on anything.
pub(super) async fn show(
    routes: &RouteClient,
    secret: &ClusterSecret,
    cell: &str,
    json: bool,
) -> anyhow::Result<()> {
    let done = run(routes, secret, cell).await?;
    if json {
        let out = serde_json::json!({
            "cell": cell,
            "conversations": done.conversations,
            "messages": done.messages,
            "unlisted_tenants": done.unlisted,
            "failed_conversations": done.failed,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "{cell}: {} conversations backfilled ({} messages) into their owners",
            done.conversations, done.messages
        );
    }
    anyhow::ensure!(
        done.abandoned() == 0,
        "gave up on {} tenants {cell} did not list and {} conversations whose copy kept failing: \
         their history stays unavailable; see the owners' logs and run it again",
        done.unlisted,
        done.failed
    );
    Ok(())
}
