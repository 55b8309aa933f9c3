//! A RoutingService replica's configuration (`cellmesh router --config F`):
//! identity, listen addresses, Raft timing and log retention, the initial
//! cluster, and the deployment secret. Checked by [`RouterConfig::validate`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use cellmesh_proto::config::{ConfigError, check, check_grpc_urls, check_listen, check_range};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterConfig {
    /// Raft node id, unique and non-zero.
    pub node_id: u64,
    pub region: String,
    pub data_dir: PathBuf,
    /// The Routing API (cells, edges, control plane, `cellmesh ctl`).
    pub api_listen: SocketAddr,
    /// The RaftPeer service (other replicas only).
    pub raft_listen: SocketAddr,
    /// Addresses other replicas and clients use to reach this one; default
    /// `http://` + the bound listen address.
    pub advertise_api: String,
    pub advertise_raft: String,
    /// Shared secret every call must carry (empty: no check).
    pub cluster_secret: String,
    /// Where Prometheus scrapes `/metrics` (`host:port`, HTTP); empty (the
    /// default) turns it off.
    pub metrics_listen: String,
    /// OpenTelemetry trace export (`[telemetry]`); off without an endpoint.
    pub telemetry: cellmesh_telemetry::trace::TraceConfig,
    /// Mutual TLS on the deployment's internal links (`[tls]`: the CA, this
    /// process's certificate and key); none set: plaintext.
    pub tls: cellmesh_proto::tls::TlsConfig,
    /// Runs without `[tls]`: every internal link in plaintext, readable and
    /// forgeable by anyone on the network path. A config file must say so
    /// (`insecure_plaintext = true`) or configure `[tls]`; one that does
    /// neither is refused. `cellmesh dev` without `--tls` sets it.
    #[serde(default, skip_serializing_if = "cellmesh_proto::config::is_off")]
    pub insecure_plaintext: bool,
    pub raft: RaftConfig,
    pub cluster: ClusterConfig,
    /// Peer Raft address → the address this replica dials instead (a proxy
    /// on the path to another region).
    pub links: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RaftConfig {
    pub heartbeat_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Build a snapshot after this many new log entries.
    pub snapshot_every: u64,
    /// Log entries kept behind a snapshot (lagging followers catch up from
    /// the log instead of a snapshot while they are within this).
    pub keep_logs_after_snapshot: u64,
    /// Change batches the watch stream keeps for resuming watchers; a watcher
    /// further behind restarts from a copy of the table.
    pub watch_history: u64,
}

/// The first members. Only used when this replica's storage is empty and
/// `bootstrap` is set, on exactly one replica.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    pub bootstrap: bool,
    pub members: Vec<MemberConfig>,
    /// A route-table backup (the file `ctl backup restore-routes` writes)
    /// that an empty data dir is seeded from: this replica forms a new
    /// group of its own holding the backup's routes (ignored once the data
    /// dir holds a replica).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub restore_from: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberConfig {
    pub node_id: u64,
    pub region: String,
    pub raft_addr: String,
    pub api_addr: String,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            node_id: 1,
            region: "local".into(),
            data_dir: PathBuf::from("data/router-1"),
            api_listen: "127.0.0.1:7300".parse().expect("valid default"),
            raft_listen: "127.0.0.1:7301".parse().expect("valid default"),
            advertise_api: String::new(),
            advertise_raft: String::new(),
            cluster_secret: String::new(),
            metrics_listen: String::new(),
            telemetry: Default::default(),
            tls: Default::default(),
            // Configs built in code (tests, `cellmesh dev`) say what they
            // want; a file that does not say it gets `false`.
            insecure_plaintext: true,
            raft: RaftConfig::default(),
            cluster: ClusterConfig::default(),
            links: Default::default(),
        }
    }
}

impl Default for RaftConfig {
    fn default() -> Self {
        Self {
            heartbeat_ms: 60,
            election_timeout_min_ms: 300,
            election_timeout_max_ms: 600,
            snapshot_every: 10_000,
            keep_logs_after_snapshot: 1_000,
            watch_history: 100_000,
        }
    }
}

impl RouterConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        cellmesh_proto::config::load_toml(path, Self::validate)
    }

    /// Every field, then whether the internal links are secured (or
    /// knowingly not).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_fields()?;
        cellmesh_proto::config::check_transport(&self.tls, self.insecure_plaintext)
    }

    fn validate_fields(&self) -> Result<(), ConfigError> {
        cellmesh_proto::config::check_tls(
            &self.tls,
            cellmesh_proto::tls::Role::Router,
            Some(&self.node_id.to_string()),
        )?;
        cellmesh_proto::config::check(
            "cluster.restore_from",
            self.cluster.restore_from.is_empty() || !self.cluster.bootstrap,
            "a restored replica forms its own group: leave cluster.bootstrap off",
        )?;
        check_listen("metrics_listen", &self.metrics_listen)?;
        self.telemetry.validate()?;
        for (field, url) in [
            ("advertise_api", &self.advertise_api),
            ("advertise_raft", &self.advertise_raft),
        ] {
            if !url.is_empty() {
                check_grpc_urls(field, [url])?;
            }
        }
        check("node_id", self.node_id > 0, "must be greater than 0")?;
        check("region", !self.region.is_empty(), "must not be empty")?;
        check(
            "api_listen",
            self.api_listen.port() == 0 || self.api_listen != self.raft_listen,
            "must differ from raft_listen",
        )?;
        let r = &self.raft;
        check_range("raft.heartbeat_ms", r.heartbeat_ms, 1, 60_000)?;
        check_range(
            "raft.election_timeout_max_ms",
            r.election_timeout_max_ms,
            2,
            600_000,
        )?;
        check_range("raft.snapshot_every", r.snapshot_every, 1, 10_000_000)?;
        check_range(
            "raft.keep_logs_after_snapshot",
            r.keep_logs_after_snapshot,
            0,
            10_000_000,
        )?;
        check_range("raft.watch_history", r.watch_history, 1, 10_000_000)?;
        check(
            "raft.election_timeout_min_ms",
            r.election_timeout_min_ms > r.heartbeat_ms,
            "must be greater than raft.heartbeat_ms",
        )?;
        check(
            "raft.election_timeout_max_ms",
            r.election_timeout_max_ms > r.election_timeout_min_ms,
            "must be greater than raft.election_timeout_min_ms",
        )?;
        check(
            "raft.snapshot_every",
            r.snapshot_every > 0,
            "must be greater than 0",
        )?;
        check(
            "raft.watch_history",
            r.watch_history > 0,
            "must be greater than 0",
        )?;
        if self.cluster.bootstrap {
            check(
                "cluster.members",
                self.cluster
                    .members
                    .iter()
                    .any(|m| m.node_id == self.node_id),
                "must include this replica when bootstrapping",
            )?;
        }
        for m in &self.cluster.members {
            check(
                "cluster.members.node_id",
                m.node_id > 0,
                "must be greater than 0",
            )?;
            check_grpc_urls("cluster.members.raft_addr", [&m.raft_addr])?;
            check_grpc_urls("cluster.members.api_addr", [&m.api_addr])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_name_their_field() {
        RouterConfig::default().validate().unwrap();
        let mut c = RouterConfig::default();
        c.raft.election_timeout_min_ms = 10;
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("raft.election_timeout_min_ms"), "{err}");
        let mut c = RouterConfig::default();
        c.cluster.bootstrap = true;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("cluster.members")
        );
        // The documented example file is exactly the defaults.
        let example = include_str!("../../config/router.toml");
        let parsed: RouterConfig = cellmesh_proto::config::parse_toml(example).unwrap();
        assert_eq!(
            toml::to_string(&parsed).unwrap(),
            toml::to_string(&RouterConfig::default()).unwrap()
        );
        let text = "node_id = 2\nbogus = 1\n";
        assert!(cellmesh_proto::config::parse_toml::<RouterConfig>(text).is_err());
    }
}
