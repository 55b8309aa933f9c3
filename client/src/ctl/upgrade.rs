//! `cellmesh ctl upgrade`: which release each process of the deployment
//! runs, and the cluster version. Router replicas answer for themselves
//! (their status; every member of the group is asked, not only the
//! endpoints given); cells, edges and control-plane replicas report to the
//! routers every few seconds; a cell that is not Down but has not reported
//! is shown with the release it registered. `finalize` raises the cluster
//! version only when none of them lags — the route table checks the cells
//! again when it applies it — and it is never lowered: until then any
//! process may go back to the release before.

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::version::{self, Version};
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::commands::set_cluster_version;
use cellmesh_route_client::table::CellStatus;
use clap::Subcommand;
use serde::Serialize;

use crate::connect::describe;

#[derive(Subcommand)]
pub enum UpgradeCommand {
    /// Every process with its release, and the cluster version.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Raise the cluster version (default: this build's release) once
    /// every process runs it; refused with the list of those that do not.
    Finalize {
        #[arg(long)]
        version: Option<String>,
    },
    /// Move a component of a running `cellmesh dev` (`ctl --dev DIR`) to
    /// another binary: stop it, let the supervisor start it on `--binary`,
    /// wait until it reports that release. `all`: every component, one at
    /// a time, routers first and edges last.
    Process {
        /// A dev process (`router-eu-west`, `eu-west-c1`,
        /// `control-plane-1`, `edge-eu-west`), or `all`.
        name: String,
        #[arg(long)]
        binary: std::path::PathBuf,
        /// How long one component may take to come back.
        #[arg(long, default_value_t = 120)]
        wait_secs: u64,
    },
}

/// `upgrade process`: one component or all of them, in order.
pub async fn run_process(
    command: UpgradeCommand,
    dev: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let UpgradeCommand::Process {
        name,
        binary,
        wait_secs,
    } = command
    else {
        bail!("not an `upgrade process` command");
    };
    let dev =
        dev.context("`upgrade process` moves a component of `cellmesh dev`: pass --dev DIR")?;
    let target = cellmesh_chaos::target::DevTarget::load(dev)?;
    let names = match name.as_str() {
        "all" => cellmesh_chaos::upgrade::rolling_order(&target.process_names()?),
        _ => vec![name],
    };
    let wait = std::time::Duration::from_secs(wait_secs);
    for name in names {
        let moved = target.move_process(&name, &binary, wait).await?;
        println!(
            "{}: runs {} (back in {:.1} s)",
            moved.name,
            moved.release,
            moved.took.as_secs_f64()
        );
    }
    Ok(())
}

/// One process as the upgrade sees it.
#[derive(Debug, Serialize)]
pub struct Process {
    pub role: String,
    pub name: String,
    /// "" = a build from before releases were reported.
    pub version: String,
    pub address: String,
    /// Why its version may be stale or missing.
    pub note: String,
}

impl Process {
    /// Whether it runs `target` or later (an unreachable replica does not).
    fn runs(&self, target: Version) -> bool {
        Version::reported(&self.version).is_some_and(|v| v >= target)
    }
}

/// The processes and the cluster version as the routers see them.
pub async fn survey(
    routes: &RouteClient,
    routers: &[String],
    secret: &ClusterSecret,
) -> (Vec<Process>, String) {
    let mut out = routers_of(routers, secret).await;
    let mut reported = BTreeMap::new();
    for p in routes.processes().await {
        let Some(r) = p.report else { continue };
        reported.insert((r.role.clone(), r.name.clone()), r);
    }
    for cell in routes.read(|t| t.cells.values().cloned().collect::<Vec<_>>()) {
        let key = ("cell".to_string(), cell.id.clone());
        if reported.contains_key(&key) || cell.status == CellStatus::Down {
            continue;
        }
        out.push(Process {
            role: "cell".into(),
            name: cell.id,
            version: cell.version,
            address: cell.address,
            note: "not reporting: as registered".into(),
        });
    }
    out.extend(reported.into_values().map(|r| Process {
        role: r.role,
        name: r.name,
        version: r.version,
        address: r.address,
        note: String::new(),
    }));
    out.sort_by(|a, b| (&a.role, &a.name).cmp(&(&b.role, &b.name)));
    let cluster = routes.read(|t| t.cluster_version.clone());
    (out, cluster)
}

/// Every member of the router group (found through those given), each as
/// its own status says.
async fn routers_of(routers: &[String], secret: &ClusterSecret) -> Vec<Process> {
    use cellmesh_control_plane::status::router_status;
    let mut seen = BTreeMap::new();
    let mut to_ask: Vec<String> = routers.to_vec();
    let mut asked = std::collections::BTreeSet::new();
    while let Some(endpoint) = to_ask.pop() {
        if !asked.insert(endpoint.clone()) {
            continue;
        }
        match router_status(&endpoint, secret).await {
            Ok(s) => {
                for n in s.voters.iter().chain(&s.learners) {
                    to_ask.push(n.api_address.clone());
                }
                seen.insert(
                    s.node_id.to_string(),
                    Process {
                        role: "router".into(),
                        name: format!("node {}", s.node_id),
                        version: s.version,
                        address: endpoint,
                        note: String::new(),
                    },
                );
            }
            Err(e) => {
                seen.entry(endpoint.clone()).or_insert(Process {
                    role: "router".into(),
                    name: endpoint.clone(),
                    version: String::new(),
                    address: endpoint,
                    note: format!("unreachable: {}", describe(&e)),
                });
            }
        }
    }
    seen.into_values().collect()
}

fn shown(version: &str) -> &str {
    if version.is_empty() {
        "before 0.2.0"
    } else {
        version
    }
}

pub async fn run(
    command: UpgradeCommand,
    routes: &RouteClient,
    routers: &[String],
    secret: &ClusterSecret,
) -> anyhow::Result<()> {
    let (processes, cluster) = survey(routes, routers, secret).await;
    match command {
        UpgradeCommand::Status { json } => {
            if json {
                let out = serde_json::json!({
                    "binary_version": version::BINARY,
                    "cluster_version": cluster,
                    "processes": processes,
                });
                println!("{}", serde_json::to_string_pretty(&out)?);
                return Ok(());
            }
            println!("cluster version: {}", shown(&cluster));
            println!(
                "{:<14} {:<28} {:<14} {:<28} NOTE",
                "ROLE", "NAME", "VERSION", "ADDRESS"
            );
            for p in &processes {
                println!(
                    "{:<14} {:<28} {:<14} {:<28} {}",
                    p.role,
                    p.name,
                    shown(&p.version),
                    p.address,
                    p.note
                );
            }
        }
        UpgradeCommand::Process { .. } => unreachable!("`ctl` runs it before reading the table"),
        UpgradeCommand::Finalize { version } => {
            let target = version.as_deref().unwrap_or(version::BINARY);
            let target = Version::parse(target).map_err(anyhow::Error::msg)?;
            let laggards: Vec<String> = processes
                .iter()
                .filter(|p| !p.runs(target))
                .map(|p| {
                    let mut s = format!("{} {} runs {}", p.role, p.name, shown(&p.version));
                    if !p.note.is_empty() {
                        s.push_str(&format!(" ({})", p.note));
                    }
                    s
                })
                .collect();
            if !laggards.is_empty() {
                bail!(
                    "cannot finalize {target}: {} process(es) do not run it yet:\n  {}",
                    laggards.len(),
                    laggards.join("\n  ")
                );
            }
            routes
                .apply(set_cluster_version(&target.to_string()))
                .await
                .map_err(|e| anyhow::anyhow!(describe(&e)))
                .context("finalize")?;
            println!(
                "cluster version {target}: every process runs it; what it writes differently is \
                 now on, and going back to an earlier release is no longer possible"
            );
        }
    }
    Ok(())
}
