//! Losing and rebuilding a region of a running `cellmesh dev`: every
//! process of the region (its router replica, its cells, its edge) held
//! down ([`held_file`]), killed and its data directory deleted; later
//! released one by one, each started again by the supervisor.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::bail;
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::tls::Dial;

use crate::target::{DevTarget, held_file, signal};

/// How long a killed process may take to be gone.
const GONE_WAIT: Duration = Duration::from_secs(10);

impl DevTarget {
    /// The dev processes of `region`: its router replica, its cells (in
    /// id order) and its edge.
    pub fn region_processes(&self, region: &str) -> anyhow::Result<Vec<String>> {
        let mut names: Vec<String> = (self.process_names()?.into_iter())
            .filter(|n| {
                *n == format!("router-{region}")
                    || *n == format!("edge-{region}")
                    || n.strip_prefix(region)
                        .and_then(|rest| rest.strip_prefix("-c"))
                        .is_some_and(|c| c.parse::<u32>().is_ok())
            })
            .collect();
        names.sort_by_key(|n| (!n.starts_with("router-"), n.starts_with("edge-"), n.clone()));
        anyhow::ensure!(!names.is_empty(), "dev.json lists no process of {region}");
        Ok(names)
    }

    /// Holds `names` down, SIGKILLs them, waits until each is gone, then
    /// deletes their data directories; the directories deleted.
    pub async fn lose(&self, names: &[String]) -> anyhow::Result<Vec<PathBuf>> {
        std::fs::create_dir_all(self.dir().join("held"))?;
        let mut pids = Vec::new();
        for name in names {
            std::fs::write(held_file(self.dir(), name), b"")?;
            pids.push((name, self.pid(name)?));
        }
        for (_, pid) in &pids {
            signal(*pid, libc::SIGKILL);
        }
        let deadline = Instant::now() + GONE_WAIT;
        for (name, pid) in pids {
            // The supervisor reaps it within a tick; until then it is a zombie.
            // SAFETY: kill(2) with signal 0 only checks that the pid exists.
            while unsafe { libc::kill(pid, 0) } == 0 {
                if Instant::now() > deadline {
                    bail!("{name} (pid {pid}) is still there {GONE_WAIT:?} after SIGKILL");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let mut deleted = Vec::new();
        for name in names {
            let dir = self.dir().join(name.replace('/', "-"));
            if dir.is_dir() {
                std::fs::remove_dir_all(&dir)?;
                deleted.push(dir);
            }
        }
        Ok(deleted)
    }

    /// Lets the supervisor start `name` again; waits (up to `wait`) until
    /// it runs under a new pid.
    pub async fn release(&self, name: &str, wait: Duration) -> anyhow::Result<i32> {
        let old = self.pid(name)?;
        let file = held_file(self.dir(), name);
        if file.exists() {
            std::fs::remove_file(&file)?;
        }
        let deadline = Instant::now() + wait;
        loop {
            match self.pid(name) {
                Ok(pid) if pid != old => return Ok(pid),
                _ if Instant::now() > deadline => bail!("{name} did not start within {wait:?}"),
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// The config file `cellmesh dev` wrote for child `name`.
    pub fn config_file(&self, name: &str) -> PathBuf {
        self.dir()
            .join("config")
            .join(format!("{}.toml", name.replace('/', "-")))
    }
}

/// What a router replica's config says of its place in the group.
#[derive(serde::Deserialize)]
struct RouterIdentity {
    node_id: u64,
    region: String,
    api_listen: String,
    raft_listen: String,
}

impl DevTarget {
    /// Brings router replica `name` back with an empty data directory, as
    /// a new member: a replica must never rejoin under its old node id
    /// with its log gone (it would have forgotten its votes and the
    /// entries it acknowledged). Its config gets the next free node id,
    /// it is released, added as a learner through the leader (which waits
    /// until it has caught up), and then replaces the old id among the
    /// voters in one membership change. (old id, new id).
    pub async fn rejoin_router(&self, name: &str, wait: Duration) -> anyhow::Result<(u64, u64)> {
        use cellmesh_proto::v1 as pb;
        let file = self.config_file(name);
        let text = std::fs::read_to_string(&file)?;
        let me: RouterIdentity = cellmesh_proto::config::parse_toml(&text)?;
        let (leader, status) = self.router_leader().await?;
        let taken = (status.voters.iter().chain(&status.learners)).map(|n| n.node_id);
        let new_id = taken.max().unwrap_or(0).max(me.node_id) + 1;
        let old_line = format!("node_id = {}", me.node_id);
        let Some(at) = text.lines().position(|l| l == old_line) else {
            bail!("{} has no line {old_line:?}", file.display());
        };
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines[at] = format!("node_id = {new_id}");
        std::fs::write(&file, lines.join("\n") + "\n")?;
        self.release(name, wait).await?;

        let channel = cellmesh_proto::tls::endpoint(leader)?.dial().await?;
        let mut api = pb::routing_client::RoutingClient::new(channel);
        let secret = self.secret();
        fn call<T>(body: T, secret: &ClusterSecret, wait: Duration) -> tonic::Request<T> {
            let mut request = tonic::Request::new(body);
            request.set_timeout(wait);
            secret.attach(&mut request);
            request
        }
        let node = pb::RouterNode {
            node_id: new_id,
            region: me.region,
            raft_address: format!("http://{}", me.raft_listen),
            api_address: format!("http://{}", me.api_listen),
        };
        api.add_learner(call(
            pb::AddLearnerRequest { node: Some(node) },
            &secret,
            wait,
        ))
        .await
        .map_err(|e| anyhow::anyhow!("adding node {new_id} as a learner: {}", e.message()))?;
        let voters: Vec<u64> = (status.voters.iter())
            .map(|n| n.node_id)
            .filter(|id| *id != me.node_id)
            .chain([new_id])
            .collect();
        api.change_membership(call(pb::ChangeMembershipRequest { voters }, &secret, wait))
            .await
            .map_err(|e| anyhow::anyhow!("voters with node {new_id}: {}", e.message()))?;
        Ok((me.node_id, new_id))
    }

    /// The route table's Raft leader: its API endpoint and status.
    pub async fn router_leader(
        &self,
    ) -> anyhow::Result<(String, cellmesh_proto::v1::RouterStatus)> {
        let secret = self.secret();
        for endpoint in &self.routers {
            if let Ok(s) = cellmesh_control_plane::status::router_status(endpoint, &secret).await
                && s.role == "Leader"
            {
                return Ok((endpoint.clone(), s));
            }
        }
        bail!("no router reports itself leader")
    }
}
