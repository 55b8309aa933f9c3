//! Moving the components of a running `cellmesh dev` to another binary, one
//! at a time: `cellmesh ctl upgrade process` and the `rolling-upgrade`
//! drill. The dev supervisor starts a child from the binary its
//! [`binary_file`] names; a move writes that file, stops the child
//! gracefully (SIGTERM: a cell drains, a router hands its work over) and
//! waits until the supervisor has restarted it and its `/metrics` reports
//! the new release (`cellmesh_build_info{version}`). A cell's failover is
//! held meanwhile (a planned restart), and released once it serves again.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::target::DevTarget;

/// The file under a dev data dir naming the binary child `name` runs from
/// its next start.
pub fn binary_file(data_dir: &Path, name: &str) -> PathBuf {
    data_dir.join("binaries").join(name.replace('/', "-"))
}

/// The release `binary` is (`cellmesh --version`).
pub fn release_of(binary: &Path) -> anyhow::Result<String> {
    let out = std::process::Command::new(binary)
        .arg("--version")
        .output()
        .with_context(|| format!("cannot run {}", binary.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.trim().strip_prefix("cellmesh ") {
        Some(version) if out.status.success() => Ok(version.to_string()),
        _ => bail!("{} is not a cellmesh binary", binary.display()),
    }
}

/// The order a rolling upgrade takes: routers (one at a time keeps a
/// quorum), the control plane, cells, then edges.
pub fn rolling_order(processes: &[String]) -> Vec<String> {
    let rank = |name: &str| match name {
        n if n.starts_with("router-") => 0,
        n if n.starts_with("control-plane-") => 1,
        n if n.starts_with("edge-") => 3,
        _ => 2,
    };
    let mut order: Vec<String> = (processes.iter())
        .filter(|n| !n.starts_with("etcd"))
        .cloned()
        .collect();
    order.sort_by_key(|n| (rank(n), n.clone()));
    order
}

/// Whether dev process `name` is a cell (`REGION-cN`).
pub fn is_cell(name: &str) -> bool {
    !(name.starts_with("router-") || name.starts_with("edge-") || name.starts_with("control-"))
}

/// The cell id of dev process `name` (`eu-west-c1` → `eu-west/c1`).
pub fn cell_id(name: &str) -> String {
    match name.rsplit_once('-') {
        Some((region, cell)) => format!("{region}/{cell}"),
        None => name.to_string(),
    }
}

/// How much longer than the wait for its restart a cell's failover is held.
const HOLD_MARGIN: Duration = Duration::from_secs(30);

/// How one process moved.
#[derive(Debug, Clone)]
pub struct Moved {
    pub name: String,
    pub release: String,
    /// From the stop to serving the new release.
    pub took: Duration,
}

impl DevTarget {
    /// The dev children that are cellmesh processes (those with metrics:
    /// not etcd or Prometheus), by name.
    pub fn process_names(&self) -> anyhow::Result<Vec<String>> {
        let info = self.info()?;
        let names = info["metrics"].as_object().into_iter().flatten();
        Ok(names.map(|(name, _)| name.clone()).collect())
    }

    /// Moves dev child `name` to `binary` and waits (up to `wait`) until
    /// it serves again reporting that binary's release.
    pub async fn move_process(
        &self,
        name: &str,
        binary: &Path,
        wait: Duration,
    ) -> anyhow::Result<Moved> {
        let binary = std::fs::canonicalize(binary)
            .with_context(|| format!("no binary at {}", binary.display()))?;
        let release = release_of(&binary)?;
        let held = match is_cell(name) {
            true => {
                self.hold(&cell_id(name), wait + HOLD_MARGIN, &release)
                    .await
            }
            false => None,
        };
        let moved = self.restart_on(name, &binary, release, wait).await;
        if let Some(cell) = held {
            // Released whether it came back or not: one that did not is
            // failed over now.
            self.hold(&cell, Duration::ZERO, "").await;
        }
        moved
    }

    /// Holds (or releases, `length` zero) the failover of `cell` for its
    /// planned restart; the cell held. A control plane that cannot (an
    /// older release, or none answering) is said so, and the restart goes
    /// on: a slow one may then be failed over.
    async fn hold(&self, cell: &str, length: Duration, release: &str) -> Option<String> {
        let secret = cellmesh_proto::secret::ClusterSecret::new(&self.cluster_secret);
        let reason = format!("restart on {release}");
        match cellmesh_control_plane::failover::holds::request(
            &self.admin,
            &secret,
            cell,
            length,
            &reason,
        )
        .await
        {
            Ok(_) => Some(cell.to_string()),
            Err(e) => {
                eprintln!(
                    "{cell}: failover not held ({}: {}); a slow restart may be failed over",
                    e.code(),
                    e.message()
                );
                None
            }
        }
    }

    /// Points dev child `name` at `binary`, stops it and waits until it
    /// serves `release`.
    async fn restart_on(
        &self,
        name: &str,
        binary: &Path,
        release: String,
        wait: Duration,
    ) -> anyhow::Result<Moved> {
        let info = self.info()?;
        let metrics = info["metrics"][name]
            .as_str()
            .with_context(|| format!("no process {name} in dev.json"))?
            .to_string();
        let old = self.pid(name)?;
        let file = binary_file(self.dir(), name);
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, binary.to_string_lossy().as_bytes())?;
        std::fs::rename(&tmp, &file)?;
        let started = Instant::now();
        crate::target::signal(old, libc::SIGTERM);
        let deadline = started + wait;
        while self.pid(name).ok() == Some(old) {
            if Instant::now() > deadline {
                bail!("{name} (pid {old}) did not stop within {wait:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let expect = format!("cellmesh_build_info{{version=\"{release}\"}} 1");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        loop {
            if let Ok(response) = http.get(&metrics).send().await
                && let Ok(text) = response.text().await
                && text.lines().any(|l| l == expect)
            {
                break;
            }
            if Instant::now() > deadline {
                bail!("{name} does not report release {release} within {wait:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(Moved {
            name: name.to_string(),
            release,
            took: started.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routers_go_first_and_edges_last() {
        let names = [
            "edge-eu-west",
            "eu-west-c1",
            "router-us-east",
            "etcd",
            "control-plane-1",
            "router-eu-west",
        ]
        .map(String::from);
        assert_eq!(
            rolling_order(&names),
            [
                "router-eu-west",
                "router-us-east",
                "control-plane-1",
                "eu-west-c1",
                "edge-eu-west"
            ]
        );
    }
}
