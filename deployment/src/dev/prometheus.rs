//! `cellmesh dev --prometheus`: a real Prometheus (the `prometheus`
//! binary, from the Debian package the set-up installs) scraping every
//! process of the deployment every 2 s, each target labelled with its
//! role, region and cell, its data under `DATA_DIR/prometheus`.

use std::path::Path;

use super::supervisor::Supervisor;
use super::topology::MetricsTarget;

/// How often Prometheus scrapes each process.
pub const SCRAPE_INTERVAL: &str = "2s";

/// The scrape configuration for `targets` (Prometheus reads YAML, of
/// which JSON is a subset).
pub fn config(targets: &[MetricsTarget]) -> serde_json::Value {
    let static_configs: Vec<_> = targets
        .iter()
        .map(|t| {
            let mut labels = serde_json::json!({
                "role": t.role, "region": t.region, "process": t.name,
            });
            if !t.cell.is_empty() {
                labels["cell"] = t.cell.clone().into();
            }
            serde_json::json!({"targets": [t.address], "labels": labels})
        })
        .collect();
    serde_json::json!({
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "scrape_configs": [{
            "job_name": "cellmesh",
            "metrics_path": "/metrics",
            "static_configs": static_configs,
        }],
    })
}

/// Starts Prometheus on `port` and waits until it listens; its URL.
pub async fn start(
    sup: &mut Supervisor,
    data: &Path,
    port: u16,
    targets: &[MetricsTarget],
) -> anyhow::Result<String> {
    if which("prometheus").is_none() {
        anyhow::bail!(
            "--prometheus needs the `prometheus` binary on PATH (Debian: apt-get install prometheus; scripts/common.sh's set-up installs it)"
        );
    }
    let dir = data.join("prometheus");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("prometheus.yml");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&config(targets))? + "\n",
    )?;
    let listen = format!("127.0.0.1:{port}");
    sup.start_command(
        "prometheus",
        "prometheus",
        vec![
            format!("--config.file={}", path.display()),
            format!("--storage.tsdb.path={}", dir.join("tsdb").display()),
            format!("--web.listen-address={listen}"),
            "--storage.tsdb.retention.time=1d".into(),
        ],
    )?;
    super::wait_listening(port, "Prometheus").await?;
    Ok(format!("http://{listen}"))
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(program))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::topology::Topology;

    #[test]
    fn every_process_is_a_labelled_target() {
        let targets = Topology { base: 7500 }.metrics_targets(2);
        // 3 regions × (router + 2 cells + edge) + 2 control planes.
        assert_eq!(targets.len(), 14);
        let config = config(&targets);
        let statics = config["scrape_configs"][0]["static_configs"]
            .as_array()
            .unwrap();
        let cell = statics
            .iter()
            .find(|s| s["labels"]["cell"] == "us-east/c2")
            .unwrap();
        assert_eq!(cell["labels"]["role"], "cell");
        assert_eq!(cell["labels"]["region"], "us-east");
        let mut addresses: Vec<_> = targets.iter().map(|t| t.address.clone()).collect();
        addresses.sort();
        addresses.dedup();
        assert_eq!(addresses.len(), targets.len(), "ports collide");
    }
}
