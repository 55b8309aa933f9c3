//! Harness for cellmesh's cross-crate tests: cells started in-process on
//! port 0 over temp dirs, cells started as real `cellmesh` processes (for
//! crash tests), and small request helpers.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellmesh_cell::clock::{Clock, SystemClock};
use cellmesh_cell::ownership::OwnAll;
use cellmesh_cell::{CellConfig, RunningCell};
use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::{
    Caller, ConversationKind, CreateConversationRequest, Direction, ErrorCode, Message,
    MessageType, PullRequest, SendRequest, SendResponse,
};
use tempfile::TempDir;
use tonic::transport::Channel;

pub type Client = MessagingClient<Channel>;

/// A cell running inside the test process.
pub struct TestCell {
    pub cell: RunningCell,
    pub endpoint: String,
    pub dir: TempDir,
}

/// A config for tests: port 0 under `dir`, generous rate limits, no
/// background tiering pass, and an instance id of its own (message ids are
/// unique across cells only when their instance ids differ, as in a
/// deployment).
pub fn test_config(dir: &Path) -> CellConfig {
    static NEXT_INSTANCE: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let n = NEXT_INSTANCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut config = CellConfig {
        listen: "127.0.0.1:0".parse().expect("static address"),
        data_dir: dir.to_path_buf(),
        instance_id: n % 1023 + 1,
        ..CellConfig::default()
    };
    config.storage.block_cache_mb = 16;
    config.storage.write_buffer_mb = 8;
    config.rate_limit.user_per_sec = 100_000;
    config.rate_limit.user_burst = 100_000;
    config.rate_limit.conversation_per_sec = 100_000;
    config.rate_limit.conversation_burst = 100_000;
    config.rate_limit.user_calls_per_sec = 100_000;
    config.rate_limit.user_calls_burst = 100_000;
    config.rate_limit.user_uploads_per_minute = 100_000;
    // History moves to the cold tier only when a test asks (`tier_once`),
    // not at whatever moment a background pass comes round: a test that
    // reads a copy through the export sees all of it hot.
    config.tiering.interval_ms = 3_600_000;
    // Backups beside the data dir would be shared by every test's cell.
    config.backup.local_dir = dir.join("backups");
    config
}

impl TestCell {
    pub async fn start() -> Self {
        Self::start_with(|_| {}, Arc::new(SystemClock)).await
    }

    pub async fn start_with(tune: impl FnOnce(&mut CellConfig), clock: Arc<dyn Clock>) -> Self {
        Self::start_in(tempfile::tempdir().expect("temp dir"), tune, clock).await
    }

    /// A cell on `dir` (a restart, when it holds a cell's data).
    pub async fn start_in(
        dir: TempDir,
        tune: impl FnOnce(&mut CellConfig),
        clock: Arc<dyn Clock>,
    ) -> Self {
        let mut config = test_config(dir.path());
        tune(&mut config);
        let cell = cellmesh_cell::start(config, Arc::new(OwnAll), clock)
            .await
            .expect("cell starts");
        let endpoint = format!("http://{}", cell.addr);
        Self {
            cell,
            endpoint,
            dir,
        }
    }

    /// A cell that follows the route table of `routers` as `cell_id`,
    /// requiring the test cluster secret.
    pub async fn start_routed(cell_id: &str, routers: Vec<String>) -> Self {
        Self::start_routed_in(cell_id, routers, tempfile::tempdir().expect("temp dir")).await
    }

    /// A routed cell on an existing data dir (a restart).
    pub async fn start_routed_in(cell_id: &str, routers: Vec<String>, dir: TempDir) -> Self {
        Self::start_routed_with(cell_id, routers, dir, |_| {}).await
    }

    /// A routed cell whose test config `tweak` adjusts first.
    pub async fn start_routed_with(
        cell_id: &str,
        routers: Vec<String>,
        dir: TempDir,
        tweak: impl FnOnce(&mut CellConfig),
    ) -> Self {
        Self::start_routed_clocked(cell_id, routers, dir, tweak, Arc::new(SystemClock)).await
    }

    /// [`start_routed_with`](Self::start_routed_with) on `clock`.
    pub async fn start_routed_clocked(
        cell_id: &str,
        routers: Vec<String>,
        dir: TempDir,
        tweak: impl FnOnce(&mut CellConfig),
        clock: Arc<dyn Clock>,
    ) -> Self {
        let mut config = test_config(dir.path());
        config.cell_id = cell_id.to_string();
        config.routing.routers = routers;
        config.routing.cluster_secret = router::SECRET.to_string();
        tweak(&mut config);
        let placement = cellmesh_cell::Placement::routed(&config)
            .await
            .expect("route table reachable");
        let cell = cellmesh_cell::start_placed(config, placement, clock)
            .await
            .expect("routed cell starts");
        let endpoint = format!("http://{}", cell.addr);
        Self {
            cell,
            endpoint,
            dir,
        }
    }

    pub async fn client(&self) -> Client {
        connect(&self.endpoint).await
    }

    /// Sets fail point `point` to `action` through the cell's fail point
    /// file, and waits (up to 5 s) until the cell has taken it up.
    pub async fn arm_failpoint(&self, point: &str, action: &str) {
        let file = self.dir.path().join("failpoints");
        std::fs::write(file, format!("{point}={action}\n")).unwrap();
        let store = self.cell.service.store().clone();
        let armed = eventually(Duration::from_secs(5), || async {
            store.failpoints().hit(point).is_some()
        })
        .await;
        assert!(armed, "the cell took up fail point {point}");
    }

    pub async fn stop(self) -> TempDir {
        self.cell.shutdown().await.expect("clean shutdown");
        self.dir
    }
}

pub async fn connect(endpoint: &str) -> Client {
    let channel = Channel::from_shared(endpoint.to_string())
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    MessagingClient::new(channel).max_decoding_message_size(64 * 1024 * 1024)
}

pub fn caller(tenant: u64, user: u64) -> Option<Caller> {
    Some(Caller {
        tenant_id: tenant,
        user_id: user,
        device_id: String::new(),
    })
}

/// Creates a group of `creator` and `members` in `tenant`; returns its id.
pub async fn create_group(client: &mut Client, tenant: u64, creator: u64, members: &[u64]) -> u64 {
    client
        .create_conversation(CreateConversationRequest {
            caller: caller(tenant, creator),
            kind: ConversationKind::Group as i32,
            title: "test".into(),
            member_ids: members.to_vec(),
            client_req_id: String::new(),
        })
        .await
        .expect("create group")
        .into_inner()
        .conversation
        .expect("conversation")
        .conversation_id
}

pub fn text(tenant: u64, user: u64, conversation: u64, req_id: &str, body: &str) -> SendRequest {
    SendRequest {
        caller: caller(tenant, user),
        conversation_id: conversation,
        client_req_id: req_id.to_string(),
        r#type: MessageType::Text as i32,
        body: body.as_bytes().to_vec(),
        route_epoch: 0,
        visible_to: Vec::new(),
        attachment_ids: Vec::new(),
    }
}

/// Sends `request` straight to a cell with the cluster secret, as a
/// component of the deployment would: a `RETRY_LATER` answer (a lease
/// renewal late under load, a frozen route) is retried with the same
/// request id after its `retry_after`, for up to 30 s.
pub async fn send_direct(client: &mut Client, request: SendRequest) -> SendResponse {
    use cellmesh_proto::status::error_detail;
    let started = Instant::now();
    loop {
        let mut r = tonic::Request::new(request.clone());
        cellmesh_proto::secret::ClusterSecret::new(router::SECRET).attach(&mut r);
        match client.send(r).await {
            Ok(reply) => return reply.into_inner(),
            Err(e)
                if error_detail(&e).code == ErrorCode::RetryLater as i32
                    && started.elapsed() < Duration::from_secs(30) =>
            {
                let wait = error_detail(&e).retry_after_ms.clamp(10, 500);
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
            Err(e) => panic!("send {:?}: {e:?}", request.client_req_id),
        }
    }
}

/// Every message of a conversation as `user` sees it, paging forward.
pub async fn pull_all(
    client: &mut Client,
    tenant: u64,
    user: u64,
    conversation: u64,
) -> Vec<Message> {
    pull_pages(client, tenant, user, conversation, Direction::Forward, 500).await
}

/// Pages through a conversation in `direction` with pages of `limit`.
pub async fn pull_pages(
    client: &mut Client,
    tenant: u64,
    user: u64,
    conversation: u64,
    direction: Direction,
    limit: u32,
) -> Vec<Message> {
    let mut out = Vec::new();
    let mut since = 0;
    loop {
        let page = client
            .pull(PullRequest {
                caller: caller(tenant, user),
                conversation_id: conversation,
                since_seq: since,
                direction: direction as i32,
                limit,
            })
            .await
            .expect("pull")
            .into_inner();
        out.extend(page.messages);
        if !page.has_more {
            return out;
        }
        since = page.next_seq;
    }
}

/// Polls `check` until it holds or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

pub use ports::free_port;

/// The `cellmesh` binary: `$CELLMESH_BIN`, or the one built next to this
/// test executable (`cargo build --bins` builds it).
pub fn cellmesh_bin() -> PathBuf {
    if let Ok(path) = std::env::var("CELLMESH_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target profile dir");
    let bin = profile_dir.join("cellmesh");
    assert!(
        bin.exists(),
        "{} not found: build it first (cargo build --bins) or set CELLMESH_BIN",
        bin.display()
    );
    bin
}

/// Runs the `cellmesh` binary with `args`; what it printed on stdout. It
/// must succeed (its stderr is the failure's message).
pub fn cellmesh_ok<I, S>(args: I) -> Vec<u8>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let out = std::process::Command::new(cellmesh_bin())
        .args(args)
        .output()
        .expect("cellmesh runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

pub mod process;
pub use process::{CellProcess, ControlPlaneProcess};

pub mod browser;
pub mod deploy;
pub mod dev;
pub mod etcd;
pub mod homes;
pub mod http;
pub mod moto;
pub mod ports;
pub mod router;
pub mod web;

pub mod sync {
    //! Helpers for the sync API: subscribing devices and reading what they
    //! are pushed.

    use std::time::Duration;

    use cellmesh_proto::v1::sync_client::SyncClient;
    use cellmesh_proto::v1::{
        Caller, SubscribeRequest, SyncEvent, SyncEventKind, SyncPush, sync_push,
    };
    use tonic::Streaming;
    use tonic::transport::Channel;

    pub type Sync = SyncClient<Channel>;

    pub async fn connect_sync(endpoint: &str) -> Sync {
        SyncClient::connect(endpoint.to_string())
            .await
            .expect("connect sync")
            .max_decoding_message_size(64 * 1024 * 1024)
    }

    pub fn device(tenant: u64, user: u64, device: &str) -> Option<Caller> {
        Some(Caller {
            tenant_id: tenant,
            user_id: user,
            device_id: device.to_string(),
        })
    }

    pub async fn subscribe(
        sync: &mut Sync,
        tenant: u64,
        user: u64,
        name: &str,
        from_pts: u64,
    ) -> Streaming<SyncPush> {
        sync.subscribe(SubscribeRequest {
            caller: device(tenant, user, name),
            from_pts,
            queue_id: 0,
        })
        .await
        .expect("subscribe")
        .into_inner()
    }

    /// The next push, or None if nothing arrives within `wait`.
    pub async fn next_push(stream: &mut Streaming<SyncPush>, wait: Duration) -> Option<SyncPush> {
        match tokio::time::timeout(wait, stream.message()).await {
            Ok(Ok(Some(push))) => Some(push),
            Ok(Ok(None)) => None,
            Ok(Err(status)) => panic!("stream failed: {status}"),
            Err(_) => None,
        }
    }

    /// Reads pushes until `n` message events arrived (panics after `wait`);
    /// returns every sync event seen, in order.
    pub async fn messages(
        stream: &mut Streaming<SyncPush>,
        n: usize,
        wait: Duration,
    ) -> Vec<SyncEvent> {
        let is_message = |e: &SyncEvent| e.kind == SyncEventKind::Message as i32;
        read_events(stream, n, wait, "messages", is_message).await
    }

    /// The next `n` sync events of any kind (panics after `wait`).
    pub async fn events(
        stream: &mut Streaming<SyncPush>,
        n: usize,
        wait: Duration,
    ) -> Vec<SyncEvent> {
        read_events(stream, n, wait, "events", |_| true).await
    }

    /// Sync events until `n` of those `counted` arrived (panics after
    /// `wait`, naming them `what`).
    async fn read_events(
        stream: &mut Streaming<SyncPush>,
        n: usize,
        wait: Duration,
        what: &str,
        counted: impl Fn(&SyncEvent) -> bool,
    ) -> Vec<SyncEvent> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut events = Vec::new();
        let mut got = 0;
        while got < n {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let push = next_push(stream, left)
                .await
                .unwrap_or_else(|| panic!("only {got} of {n} {what} arrived"));
            if let Some(sync_push::Push::Event(e)) = push.push {
                got += usize::from(counted(&e));
                events.push(e);
            }
        }
        events
    }

    /// The seqs of the message events among `events`.
    pub fn message_seqs(events: &[SyncEvent]) -> Vec<u64> {
        events
            .iter()
            .filter(|e| e.kind == SyncEventKind::Message as i32)
            .map(|e| e.seq)
            .collect()
    }
}

pub mod backends {
    //! Running the same test against each queue backend.

    use cellmesh_cell::CellConfig;
    use cellmesh_cell::config::QueueBackend;
    use rdkafka::mocking::MockCluster;

    /// A Kafka mock cluster (librdkafka's, in-process, real protocol).
    pub struct Kafka {
        pub cluster: MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    }

    impl Kafka {
        pub fn start(brokers: i32) -> Self {
            Self {
                cluster: MockCluster::new(brokers).expect("mock kafka cluster"),
            }
        }

        /// Points `config` at this cluster with a fresh topic.
        pub fn configure(&self, config: &mut CellConfig) {
            config.queue.backend = QueueBackend::Kafka;
            config.queue.kafka.brokers = self.cluster.bootstrap_servers();
            config.queue.kafka.topic = format!("cellmesh-test-{}", rand_suffix());
            config.queue.kafka.session_timeout_ms = 6_000;
            self.cluster
                .create_topic(&config.queue.kafka.topic, config.queue.partitions as i32, 1)
                .expect("create topic");
        }
    }

    fn rand_suffix() -> u64 {
        use std::time::{SystemTime, UNIX_EPOCH};
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    }
}

/// A fault proxy in front of the process at `endpoint` (`http://host:port`),
/// and the `http://` address that reaches it through the proxy.
pub async fn link_to(endpoint: &str) -> (cellmesh_chaos::proxy::FaultProxy, String) {
    let upstream = endpoint
        .trim_start_matches("http://")
        .parse()
        .expect("host:port");
    let link = cellmesh_chaos::proxy::FaultProxy::start("127.0.0.1:0".parse().unwrap(), upstream)
        .await
        .expect("a fault proxy on loopback");
    let via = format!("http://{}", link.addr());
    (link, via)
}
