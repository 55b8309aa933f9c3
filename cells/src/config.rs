//! The cell's configuration: one TOML file with documented defaults, checked
//! by [`CellConfig::validate`] at start so that a bad value fails with a
//! message naming the field instead of misbehaving later.

use cellmesh_proto::ids::TenantId;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use cellmesh_route_client::peers::Peers;

use serde::{Deserialize, Serialize};

pub use cellmesh_proto::config::ConfigError;
use cellmesh_proto::config::{check, check_grpc_urls, check_listen, check_range};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CellConfig {
    /// `region/name`, e.g. `eu-west/c1`.
    pub cell_id: String,
    /// Address the gRPC server binds; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Where RocksDB and the cell's files live.
    pub data_dir: PathBuf,
    /// Distinguishes this cell instance inside message ids (0..=1023); must be
    /// unique among the cell instances of a deployment.
    pub instance_id: u16,
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
    pub limits: LimitsConfig,
    pub rate_limit: RateLimitConfig,
    pub idempotency: IdempotencyConfig,
    pub storage: StorageConfig,
    pub queue: QueueConfig,
    pub fanout: FanoutConfig,
    pub sync: SyncConfig,
    pub notifications: NotificationsConfig,
    pub homes: HomesConfig,
    pub routing: RoutingConfig,
    pub replication: ReplicationConfig,
    /// When history leaves RocksDB for the cold tier, and where that is.
    pub tiering: crate::cold::TieringConfig,
    /// Files and images: where they live, their limits.
    pub attachments: crate::attachments::AttachmentsConfig,
    /// Full-text search: the tenants' indexes and their languages.
    pub search: crate::search::SearchConfig,
    /// Where this cell's backups go and how fast they may run.
    pub backup: crate::backup::BackupConfig,
}

/// When a write is acknowledged relative to this cell's standbys (the cells
/// the route table fails its conversations over to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplicationMode {
    /// Once durable here. Answers and high-water marks reach the standbys
    /// through the forward queue (the replication window); after a
    /// failover, history below the floor waits for the backfill.
    #[default]
    Async,
    /// Once durable here and stored on every standby (RPO 0): a failover
    /// promotes a standby that holds the history and every answer.
    Sync,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplicationConfig {
    /// The mode of every tenant not named in `tenants`.
    pub mode: ReplicationMode,
    /// Tenant id (as a string) → its mode.
    pub tenants: std::collections::BTreeMap<String, ReplicationMode>,
    /// How long a `sync` write waits for its standbys; it then fails with
    /// `UNAVAILABLE / STANDBY_UNREACHABLE`, and a retry with the same
    /// request id is answered once a standby has it.
    pub timeout_ms: u64,
    /// With no standby up (the other cells failed or not yet registered),
    /// `sync` writes fail with `STANDBY_UNREACHABLE` instead of being
    /// acknowledged unreplicated. Off by default: after its standby fails
    /// over to it, a cell keeps serving (logged as degraded).
    pub require_standby: bool,
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        Self {
            mode: ReplicationMode::Async,
            tenants: Default::default(),
            timeout_ms: 1000,
            require_standby: false,
        }
    }
}

impl ReplicationConfig {
    /// The mode of `tenant`'s writes.
    pub fn mode_of(&self, tenant: TenantId) -> ReplicationMode {
        self.tenants
            .get(&tenant.to_string())
            .copied()
            .unwrap_or(self.mode)
    }
}

/// Where the route table lives. With no routers the cell is standalone: it
/// owns every conversation and homes every user not in `homes.remote`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoutingConfig {
    /// Routing API endpoints of the router replicas (`http://host:port`).
    pub routers: Vec<String>,
    /// The address other components reach this cell at; default
    /// `http://` + the bound listen address.
    pub advertise: String,
    /// The deployment's shared secret: required on every call to this cell
    /// and sent on every call it makes (empty: no check, standalone use).
    pub cluster_secret: String,
    /// How often conversation high-water marks are checkpointed to the
    /// route table (bounds the failover seq floor margin).
    pub checkpoint_interval_ms: u64,
    /// How long a confirmation from the route table's leader lets this
    /// cell write what it owns (0: no lease). A cell cut off from the table
    /// stops writing this long after its last confirmation; the control
    /// plane waits at least as long before failing it over.
    pub owner_lease_ms: u64,
    /// etcd endpoints: when set, the cell registers itself there under a
    /// lease it keeps alive; the control plane fails it over when it expires.
    pub etcd_endpoints: Vec<String>,
    pub lease_ttl_ms: u64,
    /// Without etcd: the host-local coordination directory the control
    /// plane uses (`cellmesh dev`), where the cell records what it does on
    /// its own that an operator audits (retention's deletions). Empty and
    /// no etcd: such deletions are only logged.
    pub coordination_dir: String,
    /// Another cell's address → the address this cell dials instead (a
    /// proxy on the path to another region).
    pub links: std::collections::BTreeMap<String, String>,
    /// How long this cell keeps its copy of a conversation or user home
    /// that moved to another cell, counted from the move's seal (0: keep
    /// it). The copy serves nothing (the cell answers `WRONG_CELL`); it is
    /// there to roll back by hand.
    pub cleanup_grace_secs: u64,
    /// The channels to other cells through `links`, made on first use and
    /// shared by every clone of this config.
    #[serde(skip)]
    peers: Arc<OnceLock<Peers>>,
}

impl RoutingConfig {
    /// How this cell dials others: one pool of channels through `links`
    /// for all its callers.
    pub fn peers(&self) -> Peers {
        (self.peers)
            .get_or_init(|| Peers::new(self.links.clone()))
            .clone()
    }
}

impl Default for RoutingConfig {
    fn default() -> Self {
        Self {
            routers: Vec::new(),
            advertise: String::new(),
            cluster_secret: String::new(),
            checkpoint_interval_ms: 1000,
            owner_lease_ms: 1500,
            etcd_endpoints: Vec::new(),
            lease_ttl_ms: 3000,
            coordination_dir: String::new(),
            links: Default::default(),
            cleanup_grace_secs: 86_400,
            peers: Arc::default(),
        }
    }
}

/// Users whose home is another cell. Until the route table serves user
/// homes, this static map names them; everyone else is homed here.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HomesConfig {
    /// `"TENANT/USER"` → gRPC endpoint of the user's home cell (user ids
    /// are per tenant).
    pub remote: std::collections::BTreeMap<String, String>,
}

/// The embedded queue's format (see `queue::embedded` and
/// `queue::partitioned`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EmbeddedLog {
    #[default]
    Auto,
    Outbox,
    Partitioned,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueBackend {
    /// A durable log inside the cell's RocksDB.
    Embedded,
    /// A Kafka topic per cell; processors form a consumer group.
    Kafka,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueConfig {
    pub backend: QueueBackend,
    /// How the embedded queue keeps events: `auto` (the outbox read in
    /// place once the cluster version allows it, else the partitioned log
    /// of earlier releases), `outbox` or `partitioned` (pinned).
    pub embedded_log: EmbeddedLog,
    /// Partitions of the Kafka topic when the cell creates it (the embedded
    /// log is the outbox, read in order as one partition).
    pub partitions: u32,
    pub kafka: KafkaConfig,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaConfig {
    /// `host:port[,host:port…]`.
    pub brokers: String,
    /// Topic of this cell's events; empty = `cellmesh.<region>.<name>`.
    pub topic: String,
    /// Consumer group of this cell's processors.
    pub group: String,
    pub session_timeout_ms: u32,
    /// How long a client waits for a broker's answer: the producer then
    /// sends the request again (safe: it is idempotent), a consumer gives up
    /// on a heartbeat or offset commit. Kept well below the publish timeout
    /// and librdkafka's 60 s: a request lost with a broker connection would
    /// otherwise hold the relay, or a consumer's rejoin, that long.
    pub request_timeout_ms: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FanoutConfig {
    /// Conversations with more members than this use read diffusion: the
    /// message is stored once and members get only a hint.
    pub large_group_threshold: u32,
    /// A large group's hints about one conversation go at most once per
    /// this many ms (merged to the newest: see `sync::hints`); 0 sends
    /// every hint as it comes.
    pub hint_interval_ms: u64,
    /// Most queue events applied in one batch.
    pub batch: usize,
    /// How long a graceful stop waits, at most, for everything already
    /// acknowledged to be fanned out, pushed to online devices and
    /// forwarded to other cells before the cell's streams close (it gives
    /// up sooner once nothing progresses for a second); 0 stops at once.
    pub drain_on_stop_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SyncConfig {
    /// A subscriber further behind than this many events gets a Rebase.
    pub rebase_threshold: u64,
    /// A device is online for this long after a heartbeat.
    pub presence_window_secs: u64,
    /// Devices of one user streaming at a time (a device streams once: its
    /// new stream supersedes the older).
    pub max_streams_per_user: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NotificationsConfig {
    /// POST each notification as JSON here (http:// only); none = log them.
    pub webhook_url: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest message body accepted.
    pub max_body_bytes: usize,
    /// Largest group.
    pub max_group_members: u32,
    /// Most member ids one create / add / remove request may carry.
    pub max_members_per_request: usize,
    /// Largest page `Pull` returns.
    pub max_pull_limit: u32,
    /// Longest `client_req_id`.
    pub max_client_req_id_bytes: usize,
    /// Longest conversation title.
    pub max_title_bytes: usize,
    /// How long after sending a message its sender may recall or edit it.
    pub edit_window_secs: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Sends per second one user may make (sustained).
    pub user_per_sec: u32,
    pub user_burst: u32,
    /// Sends per second one conversation accepts (sustained). This bounds how
    /// far a conversation's seq can move between two checkpoints.
    pub conversation_per_sec: u32,
    pub conversation_burst: u32,
    /// Other calls that change something (create, members, edit, recall,
    /// delete, read marks, mute, typing, heartbeat) per second one user may
    /// make, and the burst above it.
    pub user_calls_per_sec: u32,
    pub user_calls_burst: u32,
    /// Uploads (`CreateUpload`) one user may reserve per minute.
    pub user_uploads_per_minute: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IdempotencyConfig {
    /// How long a `client_req_id` is remembered.
    pub ttl_secs: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// fsync the WAL before acknowledging. Only benchmarks of the non-durable
    /// path turn this off.
    pub sync_wal: bool,
    /// Most mutations written in one group-commit batch.
    pub group_commit_max_batch: usize,
    /// Mutations that may wait for the committer before writers block.
    pub commit_queue_depth: usize,
    pub block_cache_mb: usize,
    pub write_buffer_mb: usize,
    /// Most write-ahead log (MiB) kept before the families holding its
    /// oldest file are flushed, however rarely they are written: what a
    /// restart after a crash replays.
    pub max_wal_mb: usize,
    /// The nice of the fan-out's two threads (its commit lane and the
    /// processor), -20 to 19; 0 leaves them at the process's. Below the rest
    /// of the cell's threads, so that a burst of pushes does not hold them
    /// off a core (see `priority`); lowering it takes `CAP_SYS_NICE` or
    /// `RLIMIT_NICE`, without which it is logged and left.
    pub fanout_nice: i32,
}

impl Default for CellConfig {
    fn default() -> Self {
        Self {
            cell_id: "local/c1".into(),
            listen: "127.0.0.1:7400".parse().expect("static address"),
            data_dir: PathBuf::from("data/cell"),
            instance_id: 1,
            metrics_listen: String::new(),
            telemetry: Default::default(),
            tls: Default::default(),
            // Configs built in code (tests, `cellmesh dev`) say what they
            // want; a file that does not say it gets `false`.
            insecure_plaintext: true,
            limits: LimitsConfig::default(),
            rate_limit: RateLimitConfig::default(),
            idempotency: IdempotencyConfig::default(),
            storage: StorageConfig::default(),
            queue: QueueConfig::default(),
            fanout: FanoutConfig::default(),
            sync: SyncConfig::default(),
            notifications: NotificationsConfig::default(),
            homes: HomesConfig::default(),
            routing: RoutingConfig::default(),
            replication: ReplicationConfig::default(),
            tiering: Default::default(),
            attachments: Default::default(),
            search: Default::default(),
            backup: Default::default(),
        }
    }
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            backend: QueueBackend::Embedded,
            embedded_log: EmbeddedLog::Auto,
            partitions: 4,
            kafka: KafkaConfig::default(),
        }
    }
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            brokers: String::new(),
            topic: String::new(),
            group: "cellmesh-processor".into(),
            session_timeout_ms: 10_000,
            request_timeout_ms: 5_000,
        }
    }
}

impl Default for FanoutConfig {
    fn default() -> Self {
        Self {
            large_group_threshold: 500,
            hint_interval_ms: 50,
            batch: 512,
            drain_on_stop_ms: 5000,
        }
    }
}

impl Default for SyncConfig {
    fn default() -> Self {
        Self {
            rebase_threshold: 1_000,
            presence_window_secs: 60,
            max_streams_per_user: 16,
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 64 * 1024,
            max_group_members: 100_000,
            max_members_per_request: 1_000,
            max_pull_limit: 1_000,
            max_client_req_id_bytes: 128,
            max_title_bytes: 256,
            edit_window_secs: 24 * 3600,
        }
    }
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            user_per_sec: 100,
            user_burst: 200,
            conversation_per_sec: 2_000,
            conversation_burst: 4_000,
            user_calls_per_sec: 100,
            user_calls_burst: 500,
            user_uploads_per_minute: 60,
        }
    }
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        Self {
            ttl_secs: 24 * 3600,
        }
    }
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            sync_wal: true,
            group_commit_max_batch: 1_024,
            commit_queue_depth: 8_192,
            block_cache_mb: 256,
            write_buffer_mb: 64,
            max_wal_mb: 512,
            fanout_nice: -19,
        }
    }
}

/// The gRPC message size limit is the body limit plus this much for the rest
/// of the request, so an oversize body still reaches validation and gets a
/// precise error.
pub const REQUEST_OVERHEAD_BYTES: usize = 64 * 1024;

/// The region a store lies in: `configured` (a `region` setting of
/// `[backup]`, `[tiering]` or `[attachments]`), or else the cell's own.
pub fn store_region<'a>(configured: &'a str, cell_id: &'a str) -> &'a str {
    match configured {
        "" => region_of(cell_id),
        region => region,
    }
}

/// A cell's region: the part of its id before `/` (a standalone cell,
/// with no region in its id, is "local").
pub fn region_of(cell_id: &str) -> &str {
    match cell_id.split_once('/') {
        Some((region, _)) if !region.is_empty() => region,
        _ => "local",
    }
}

impl CellConfig {
    /// The Kafka topic of this cell's events.
    pub fn kafka_topic(&self) -> String {
        if self.queue.kafka.topic.is_empty() {
            format!("cellmesh.{}", self.cell_id.replace('/', "."))
        } else {
            self.queue.kafka.topic.clone()
        }
    }

    /// The consumer group of this cell's fan-out processors.
    pub fn processor_group(&self) -> String {
        match self.queue.backend {
            QueueBackend::Embedded => "processor".into(),
            QueueBackend::Kafka => format!(
                "{}.{}",
                self.queue.kafka.group,
                self.cell_id.replace('/', ".")
            ),
        }
    }

    /// Reads and validates a TOML file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        cellmesh_proto::config::load_toml(path, Self::validate)
    }

    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let config: Self = cellmesh_proto::config::parse_toml(text)?;
        config.validate()?;
        Ok(config)
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
            cellmesh_proto::tls::Role::Cell,
            Some(&self.cell_id),
        )?;
        cellmesh_proto::config::check_etcd(
            "routing.etcd_endpoints",
            &self.routing.etcd_endpoints,
            &self.tls,
        )?;
        validate_cell_id(&self.cell_id)?;
        check(
            "instance_id",
            self.instance_id <= 1023,
            "must be at most 1023",
        )?;
        check_listen("metrics_listen", &self.metrics_listen)?;
        self.telemetry.validate()?;
        self.tiering.validate()?;
        self.attachments.validate()?;
        self.backup.validate()?;
        self.search.validate()?;
        self.limits.validate()?;
        self.rate_limit.validate()?;
        check_range(
            "idempotency.ttl_secs",
            self.idempotency.ttl_secs,
            1,
            30 * DAY_S,
        )?;
        self.storage.validate()?;
        self.queue.validate()?;
        check_range("fanout.batch", self.fanout.batch, 1, 65_536)?;
        check_range(
            "fanout.hint_interval_ms",
            self.fanout.hint_interval_ms,
            0,
            10_000,
        )?;
        check_range(
            "fanout.large_group_threshold",
            self.fanout.large_group_threshold,
            1,
            10_000_000,
        )?;
        check_range(
            "sync.rebase_threshold",
            self.sync.rebase_threshold,
            1,
            10_000_000,
        )?;
        check_range(
            "sync.presence_window_secs",
            self.sync.presence_window_secs,
            1,
            DAY_S,
        )?;
        check_range(
            "sync.max_streams_per_user",
            self.sync.max_streams_per_user,
            1,
            1_024,
        )?;
        self.routing.validate()?;
        for (user, endpoint) in &self.homes.remote {
            check(
                "homes.remote",
                crate::user::UserKey::parse(user).is_some() && endpoint.starts_with("http://"),
                &format!(
                    "maps \"TENANT/USER\" to http:// endpoints; {user:?} = {endpoint:?} is not one"
                ),
            )?;
        }
        for tenant in self.replication.tenants.keys() {
            check(
                "replication.tenants",
                tenant.parse::<u64>().is_ok_and(|t| t > 0) && !tenant.starts_with('0'),
                &format!("keys are tenant ids; {tenant:?} is not one"),
            )?;
        }
        check(
            "replication.timeout_ms",
            (10..=60_000).contains(&self.replication.timeout_ms),
            "must be between 10 and 60000",
        )?;
        if let Some(url) = &self.notifications.webhook_url {
            check(
                "notifications.webhook_url",
                url.starts_with("http://"),
                "must be an http:// URL",
            )?;
        }
        Ok(())
    }
}

/// A day, for ranges of seconds.
const DAY_S: u64 = 86_400;

impl LimitsConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        check_range("limits.max_body_bytes", self.max_body_bytes, 1, 4 << 20)?;
        check_range(
            "limits.max_group_members",
            self.max_group_members,
            2,
            1_000_000,
        )?;
        check_range(
            "limits.max_members_per_request",
            self.max_members_per_request,
            1,
            100_000,
        )?;
        check_range("limits.max_pull_limit", self.max_pull_limit, 1, 100_000)?;
        check_range(
            "limits.max_client_req_id_bytes",
            self.max_client_req_id_bytes,
            1,
            1024,
        )?;
        check_range("limits.max_title_bytes", self.max_title_bytes, 1, 65_536)?;
        check_range(
            "limits.edit_window_secs",
            self.edit_window_secs,
            0,
            365 * DAY_S,
        )?;
        Ok(())
    }
}

impl RateLimitConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        for (field, value) in [
            ("rate_limit.user_per_sec", self.user_per_sec),
            ("rate_limit.user_burst", self.user_burst),
            ("rate_limit.conversation_per_sec", self.conversation_per_sec),
            ("rate_limit.conversation_burst", self.conversation_burst),
            ("rate_limit.user_calls_per_sec", self.user_calls_per_sec),
            ("rate_limit.user_calls_burst", self.user_calls_burst),
        ] {
            check_range(field, value, 1, 1_000_000)?;
        }
        Ok(())
    }
}

impl StorageConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        check_range(
            "storage.group_commit_max_batch",
            self.group_commit_max_batch,
            1,
            65_536,
        )?;
        check_range(
            "storage.commit_queue_depth",
            self.commit_queue_depth,
            1,
            1 << 20,
        )?;
        check_range("storage.block_cache_mb", self.block_cache_mb, 1, 1 << 20)?;
        check_range("storage.write_buffer_mb", self.write_buffer_mb, 1, 65_536)?;
        check_range("storage.max_wal_mb", self.max_wal_mb, 1, 1 << 20)?;
        check(
            "storage.max_wal_mb",
            self.max_wal_mb >= self.write_buffer_mb,
            "must be at least storage.write_buffer_mb: a smaller bound flushes every column family before its memtable fills",
        )?;
        check_range("storage.fanout_nice", self.fanout_nice, -20, 19)?;
        Ok(())
    }
}

impl QueueConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        check(
            "queue.partitions",
            (1..=1024).contains(&self.partitions),
            "must be between 1 and 1024",
        )?;
        check(
            "queue.kafka.brokers",
            self.backend != QueueBackend::Kafka || !self.kafka.brokers.is_empty(),
            "is required when queue.backend = \"kafka\"",
        )?;
        check(
            "queue.kafka.request_timeout_ms",
            (1_000..=30_000).contains(&self.kafka.request_timeout_ms),
            "must be between 1000 (above the consumer's fetch wait) and 30000 (the publish timeout)",
        )?;
        check_range(
            "queue.kafka.session_timeout_ms",
            self.kafka.session_timeout_ms,
            1_000,
            300_000,
        )?;
        Ok(())
    }
}

impl RoutingConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        check_range("routing.lease_ttl_ms", self.lease_ttl_ms, 1_000, 600_000)?;
        check_range(
            "routing.checkpoint_interval_ms",
            self.checkpoint_interval_ms,
            10,
            600_000,
        )?;
        check_range("routing.owner_lease_ms", self.owner_lease_ms, 0, 600_000)?;
        check_range(
            "routing.cleanup_grace_secs",
            self.cleanup_grace_secs,
            0,
            365 * DAY_S,
        )?;
        check_grpc_urls("routing.routers", &self.routers)?;
        if !self.advertise.is_empty() {
            check_grpc_urls("routing.advertise", [&self.advertise])?;
        }
        Ok(())
    }
}

fn validate_cell_id(id: &str) -> Result<(), ConfigError> {
    let valid_part = |p: &str| {
        !p.is_empty()
            && p.len() <= 63
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    let ok = matches!(id.split_once('/'), Some((region, name)) if valid_part(region) && valid_part(name));
    check(
        "cell_id",
        ok,
        &format!("must look like `region/name` (lowercase letters, digits, '-'), got {id:?}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_config_file_states_the_defaults() {
        let documented = CellConfig::from_toml(include_str!("../../config/cell.toml")).unwrap();
        let as_toml = |c: &CellConfig| toml::to_string(c).unwrap();
        assert_eq!(as_toml(&documented), as_toml(&CellConfig::default()));
    }

    #[test]
    fn a_lean_config_leaves_out_defaults_and_reads_back_the_same() {
        let mut config = CellConfig {
            cell_id: "eu-west/c1".into(),
            ..CellConfig::default()
        };
        config.attachments.quota_sync_secs = 30;
        let text = cellmesh_proto::config::to_toml_lean(&config).unwrap();
        let back: CellConfig = toml::from_str(&text).unwrap();
        assert_eq!(
            toml::to_string(&back).unwrap(),
            toml::to_string(&config).unwrap()
        );
        // Settings at their defaults, which an earlier release may not
        // know, are left out; those set are written, and so is one whose
        // absence reads otherwise (a file must say it runs without TLS).
        assert!(text.contains("insecure_plaintext = true"), "{text}");
        assert!(!text.contains("[backup]"), "{text}");
        assert!(text.contains("cell_id = \"eu-west/c1\""), "{text}");
        assert!(text.contains("quota_sync_secs = 30"), "{text}");
        config.attachments.quota_sync_secs =
            crate::attachments::AttachmentsConfig::default().quota_sync_secs;
        let text = cellmesh_proto::config::to_toml_lean(&config).unwrap();
        assert!(!text.contains("quota_sync_secs"), "{text}");
    }

    #[test]
    fn defaults_are_valid() {
        CellConfig::default().validate().unwrap();
        let parsed = CellConfig::from_toml("insecure_plaintext = true\n").unwrap();
        assert_eq!(parsed.limits.max_body_bytes, 64 * 1024);
        // A file must say it runs without TLS.
        let ConfigError::Invalid { field, .. } = CellConfig::from_toml("").unwrap_err() else {
            panic!("a config error");
        };
        assert_eq!(field, "insecure_plaintext");
    }

    #[test]
    fn invalid_values_name_their_field() {
        let cases = [
            ("cell_id = \"nocell\"", "cell_id"),
            ("cell_id = \"EU/c1\"", "cell_id"),
            ("instance_id = 2000", "instance_id"),
            ("[limits]\nmax_body_bytes = 0", "limits.max_body_bytes"),
            ("[rate_limit]\nuser_per_sec = 0", "rate_limit.user_per_sec"),
            (
                "[storage]\ngroup_commit_max_batch = 0",
                "storage.group_commit_max_batch",
            ),
            ("[queue]\nbackend = \"kafka\"", "queue.kafka.brokers"),
            (
                "[queue.kafka]\nrequest_timeout_ms = 60000",
                "queue.kafka.request_timeout_ms",
            ),
            (
                "[replication.tenants]\nx7 = \"sync\"",
                "replication.tenants",
            ),
            ("[replication]\ntimeout_ms = 0", "replication.timeout_ms"),
            (
                "[routing]\netcd_endpoints = [\"https://etcd-1:2379\"]",
                "routing.etcd_endpoints",
            ),
            // Sizes that would overflow once scaled, or size a channel or a
            // buffer beyond reason, are refused, not a panic later.
            (
                "[idempotency]\nttl_secs = 18446744073709551615",
                "idempotency.ttl_secs",
            ),
            (
                "[limits]\nedit_window_secs = 18446744073709551615",
                "limits.edit_window_secs",
            ),
            (
                "[storage]\ncommit_queue_depth = 18446744073709551615",
                "storage.commit_queue_depth",
            ),
            (
                "[storage]\nblock_cache_mb = 18446744073709551615",
                "storage.block_cache_mb",
            ),
            ("[fanout]\nbatch = 100000000", "fanout.batch"),
            // A log bound below a memtable would flush every family early.
            (
                "[storage]\nwrite_buffer_mb = 64\nmax_wal_mb = 32",
                "storage.max_wal_mb",
            ),
            (
                "[routing]\ncleanup_grace_secs = 18446744073709551615",
                "routing.cleanup_grace_secs",
            ),
            (
                "[routing]\nowner_lease_ms = 18446744073709551615",
                "routing.owner_lease_ms",
            ),
            (
                "[sync]\npresence_window_secs = 0",
                "sync.presence_window_secs",
            ),
            (
                "[notifications]\nwebhook_url = \"ftp://x\"",
                "notifications.webhook_url",
            ),
        ];
        for (text, field) in cases {
            let err = CellConfig::from_toml(text).unwrap_err().to_string();
            assert!(err.contains(field), "{text:?} -> {err}");
        }
    }

    #[test]
    fn unknown_and_mistyped_fields_are_rejected() {
        let err = CellConfig::from_toml("listne = \"x\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("listne"), "{err}");
        let err = CellConfig::from_toml("listen = 5").unwrap_err().to_string();
        assert!(err.contains("listen"), "{err}");
    }
}
