//! A RoutingService cluster inside the test process: replicas on port 0 over
//! temp dirs, stopped and restarted on the same addresses and data, with
//! helpers that wait on observed Raft state.

use std::collections::BTreeMap;
use std::time::Duration;

use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::routing_client::RoutingClient;
use cellmesh_route_client::client::RouteClient;
use cellmesh_router::config::RouterConfig;
use cellmesh_router::node::{RunningRouter, start};
use cellmesh_router::types::RouterNode;
use tempfile::TempDir;
use tonic::transport::Channel;

use crate::eventually;

pub const SECRET: &str = "test-cluster-secret";

/// `message` with the deployment secret, as one cell calls another.
pub fn with_secret<T>(message: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    ClusterSecret::new(SECRET).attach(&mut r);
    r
}

pub struct Replica {
    pub config: RouterConfig,
    pub running: Option<RunningRouter>,
    pub dir: TempDir,
}

pub struct RouterCluster {
    pub replicas: Vec<Replica>,
}

/// Fast elections for tests.
pub fn router_config(node_id: u64, region: &str, dir: &std::path::Path) -> RouterConfig {
    let mut c = RouterConfig {
        node_id,
        region: region.into(),
        data_dir: dir.to_path_buf(),
        api_listen: "127.0.0.1:0".parse().expect("static"),
        raft_listen: "127.0.0.1:0".parse().expect("static"),
        cluster_secret: SECRET.into(),
        ..RouterConfig::default()
    };
    c.raft.heartbeat_ms = 50;
    c.raft.election_timeout_min_ms = 300;
    c.raft.election_timeout_max_ms = 600;
    c
}

pub const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];

impl RouterCluster {
    /// `n` voters, one per region, initialized through replica 1.
    pub async fn start(n: usize, tune: impl Fn(&mut RouterConfig)) -> Self {
        let mut replicas = Vec::new();
        for i in 0..n {
            let dir = tempfile::tempdir().expect("temp dir");
            let mut config = router_config(i as u64 + 1, REGIONS[i % REGIONS.len()], dir.path());
            tune(&mut config);
            let running = start(config.clone()).await.expect("router starts");
            // Restarts reuse the bound ports.
            config.api_listen = running.api_addr;
            config.raft_listen = running.raft_addr;
            replicas.push(Replica {
                config,
                running: Some(running),
                dir,
            });
        }
        let members: BTreeMap<u64, RouterNode> = replicas
            .iter()
            .map(|r| {
                let running = r.running.as_ref().expect("running");
                (running.node_id, running.node.clone())
            })
            .collect();
        replicas[0]
            .running
            .as_ref()
            .expect("running")
            .initialize(members)
            .await
            .expect("cluster initializes");
        let cluster = Self { replicas };
        cluster.leader().await;
        cluster
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.replicas
            .iter()
            .map(|r| format!("http://{}", r.config.api_listen))
            .collect()
    }

    pub fn endpoint(&self, i: usize) -> String {
        format!("http://{}", self.replicas[i].config.api_listen)
    }

    pub fn running(&self, i: usize) -> &RunningRouter {
        self.replicas[i]
            .running
            .as_ref()
            .expect("replica is running")
    }

    /// Index of the replica that is leader, once one is (running replicas only).
    pub async fn leader(&self) -> usize {
        let mut found = None;
        let ok = eventually(Duration::from_secs(20), || {
            let leader = self.replicas.iter().enumerate().find_map(|(i, r)| {
                let running = r.running.as_ref()?;
                let m = running.raft.metrics().borrow().clone();
                (m.current_leader == Some(running.node_id)).then_some(i)
            });
            found = leader;
            async move { leader.is_some() }
        })
        .await;
        assert!(ok, "no leader elected");
        found.expect("leader")
    }

    pub async fn stop(&mut self, i: usize) {
        if let Some(r) = self.replicas[i].running.take() {
            r.stop().await;
        }
    }

    /// Restarts replica `i` on its old addresses and data.
    pub async fn restart(&mut self, i: usize) {
        let config = self.replicas[i].config.clone();
        let mut last = None;
        for _ in 0..100 {
            match start(config.clone()).await {
                Ok(r) => {
                    self.replicas[i].running = Some(r);
                    return;
                }
                // The previous instance may still hold the RocksDB lock.
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("replica {i} does not restart: {last:?}");
    }

    pub async fn client(&self) -> RouteClient {
        RouteClient::connect(self.endpoints(), ClusterSecret::new(SECRET))
            .await
            .expect("route client connects")
    }

    /// A raw Routing API client of replica `i`, with the cluster secret.
    pub async fn api(
        &self,
        i: usize,
    ) -> RoutingClient<tonic::service::interceptor::InterceptedService<Channel, SecretInterceptor>>
    {
        let channel = Channel::from_shared(self.endpoint(i))
            .expect("endpoint")
            .connect()
            .await
            .expect("connects");
        RoutingClient::with_interceptor(channel, SecretInterceptor(ClusterSecret::new(SECRET)))
    }
}

#[derive(Clone)]
pub struct SecretInterceptor(pub ClusterSecret);

impl tonic::service::Interceptor for SecretInterceptor {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        self.0.attach(&mut request);
        Ok(request)
    }
}
