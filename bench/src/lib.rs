//! `cellmesh bench`: load generators. Each scenario prints a summary and
//! can write the same figures as JSON (`--json FILE`) with the keys
//! `scenario`, `acked`, `errors`, `throughput_per_s`, `latency_ms.{p50,p99,p999}`.

mod attachments;
mod backup;
mod failover;
mod first_screen;
mod group;
mod migrate;
mod paced;
mod pull;
mod push;
mod push_ceiling;
mod report;
mod router;
mod search;
mod send;
mod storage;
mod tenant_files;
mod tenant_move;

use std::collections::BTreeMap;

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::status::error_code;
use cellmesh_proto::v1::{
    Caller, ConversationKind, CreateConversationRequest, MessageType, SendRequest, SubscribeRequest,
};
use clap::{Args, Subcommand};

pub use report::Report;

use cellmesh_client::connect::caller;

/// A send as the benchmarks issue it: one unique request id each.
pub fn send_request(
    tenant: u64,
    user: u64,
    conversation: u64,
    client_req_id: String,
    kind: MessageType,
    body: Vec<u8>,
) -> SendRequest {
    SendRequest {
        caller: caller(tenant, user),
        conversation_id: conversation,
        client_req_id,
        r#type: kind as i32,
        body,
        route_epoch: 0,
        visible_to: Vec::new(),
        attachment_ids: Vec::new(),
    }
}

/// The settings of bucket `bucket` on the S3 API at `endpoint` (e.g. a
/// local moto_server), with moto's test credentials when the environment
/// names none.
pub fn s3_bucket(endpoint: &str, bucket: &str) -> cellmesh_cell::cold::S3Config {
    let mut s3 = cellmesh_cell::cold::S3Config {
        endpoint: endpoint.to_string(),
        bucket: bucket.to_string(),
        region: "us-east-1".into(),
        allow_http: endpoint.starts_with("http://"),
        ..Default::default()
    };
    if std::env::var("AWS_ACCESS_KEY_ID").is_err() {
        s3.access_key_id = "testing".into();
        s3.secret_access_key = "testing".into();
    }
    s3
}

/// A cell of the benchmark's own, owning everything, on the system clock.
pub async fn own_cell(
    config: cellmesh_cell::CellConfig,
) -> anyhow::Result<cellmesh_cell::RunningCell> {
    Ok(cellmesh_cell::start(
        config,
        std::sync::Arc::new(cellmesh_cell::ownership::OwnAll),
        std::sync::Arc::new(cellmesh_cell::clock::SystemClock),
    )
    .await?)
}

/// A cell of the benchmark's own ([`own_cell`]) on a tokio runtime of its
/// own, as if in a process of its own: the benchmark's devices and senders,
/// which stand for remote clients, do not run on the cell's workers (the
/// two still share the machine's cores).
pub struct CellApart {
    pub addr: std::net::SocketAddr,
    cell: Option<cellmesh_cell::RunningCell>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl CellApart {
    pub async fn start(config: cellmesh_cell::CellConfig) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .thread_name("cell")
            .enable_all()
            .build()?;
        let cell = runtime.spawn(own_cell(config)).await??;
        Ok(Self {
            addr: cell.addr,
            cell: Some(cell),
            runtime: Some(runtime),
        })
    }
}

impl Drop for CellApart {
    fn drop(&mut self) {
        let (Some(cell), Some(runtime)) = (self.cell.take(), self.runtime.take()) else {
            return;
        };
        // Stopped on its own runtime; this may be inside another one.
        let stopped = runtime.spawn(async move { cell.shutdown().await });
        let _ = std::thread::spawn(move || {
            let _ = runtime.block_on(stopped);
            runtime.shutdown_timeout(std::time::Duration::from_secs(5));
        })
        .join();
    }
}

/// A config for a cell a benchmark starts itself, over `data_dir` on a
/// free port, with rate limits out of the way.
pub fn unlimited_cell(data_dir: std::path::PathBuf) -> cellmesh_cell::CellConfig {
    let mut config = cellmesh_cell::CellConfig {
        listen: "127.0.0.1:0".parse().expect("static address"),
        data_dir,
        ..Default::default()
    };
    let r = &mut config.rate_limit;
    (r.user_per_sec, r.user_burst) = (1_000_000, 1_000_000);
    (r.conversation_per_sec, r.conversation_burst) = (1_000_000, 1_000_000);
    (r.user_calls_per_sec, r.user_calls_burst) = (1_000_000, 1_000_000);
    config
}

/// `n` groups of user 1 of `tenant` with users 2 and 3, named `bench {i}`.
pub async fn create_groups(endpoint: &str, tenant: u64, n: u64) -> anyhow::Result<Vec<u64>> {
    let mut client = cellmesh_client::connect::connect(endpoint).await?;
    let mut out = Vec::new();
    for i in 0..n {
        let group = Create::group(vec![2, 3], format!("create-{i}"));
        let created = create(&mut client, TenantId(tenant), UserId(1), group).await?;
        out.push(created.get());
    }
    Ok(out)
}

/// A conversation to create: its kind, the members besides its creator,
/// and its request id (also its title).
pub struct Create {
    kind: ConversationKind,
    members: Vec<u64>,
    req_id: String,
}

impl Create {
    pub fn group(members: Vec<u64>, req_id: String) -> Self {
        let kind = ConversationKind::Group;
        Self {
            kind,
            members,
            req_id,
        }
    }

    pub fn direct(with: UserId, req_id: String) -> Self {
        let kind = ConversationKind::Direct;
        Self {
            kind,
            members: vec![with.get()],
            req_id,
        }
    }
}

/// Creates `conversation` in `tenant` as `creator`; its id.
pub async fn create(
    client: &mut send::Client,
    tenant: TenantId,
    creator: UserId,
    conversation: Create,
) -> anyhow::Result<ConversationId> {
    let created = client
        .create_conversation(CreateConversationRequest {
            caller: caller(tenant.get(), creator.get()),
            kind: conversation.kind as i32,
            member_ids: conversation.members,
            title: conversation.req_id.clone(),
            client_req_id: conversation.req_id,
        })
        .await
        .map_err(cellmesh_client::connect::call_error)?
        .into_inner();
    let id = created.conversation.map(|c| c.conversation_id);
    Ok(ConversationId(id.ok_or_else(|| {
        anyhow::anyhow!("created, without an id")
    })?))
}

/// What a bench device sends to follow `user`'s sync queue from the start.
pub fn device_subscription(tenant: u64, user: u64) -> SubscribeRequest {
    SubscribeRequest {
        caller: Some(Caller {
            tenant_id: tenant,
            user_id: user,
            device_id: format!("bench-{user}"),
        }),
        from_pts: 0,
        queue_id: 0,
    }
}

/// A latency histogram in µs, up to 10 minutes.
pub fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("histogram bounds")
}

/// Bytes of the files under `dir`.
pub fn du(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => du(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Counts a failed call under its stable code.
/// The request, with a token for `user` when sending through a dev edge.
pub fn authed<T>(
    dev: Option<&cellmesh_chaos::target::DevTarget>,
    user: u64,
    message: T,
) -> tonic::Request<T> {
    match dev {
        Some(d) => authed_in(Some(d), d.tenant, user, message),
        None => tonic::Request::new(message),
    }
}

/// [`authed`] as a user of `tenant`.
pub fn authed_in<T>(
    dev: Option<&cellmesh_chaos::target::DevTarget>,
    tenant: u64,
    user: u64,
    message: T,
) -> tonic::Request<T> {
    match dev {
        Some(d) => d.request_in(tenant, message, user, "tool"),
        None => tonic::Request::new(message),
    }
}

pub fn count_error(errors: &mut BTreeMap<String, u64>, status: &tonic::Status) {
    let code = error_code(status).as_str_name().to_string();
    *errors.entry(code).or_insert(0) += 1;
}

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand)]
enum Scenario {
    /// Concurrent idempotent sends into many conversations; measures acked
    /// sends per second and ack latency.
    Send(send::SendArgs),
    /// The ceiling of a send on this machine: a send's and its fan-out's
    /// records written straight through the cell's store (same column
    /// families, options, group commit and fsync), no gRPC, no queue reads,
    /// no processor.
    Storage(storage::StorageArgs),
    /// Online devices receive pushes while senders send into 1:1 and group
    /// conversations; measures send→push latency and deliveries per second.
    Push(push::PushArgs),
    /// One group of 100,000 members, 1,000 online: send and hint latency,
    /// `ListConversations` for a member of 500 groups (unread checked),
    /// and the p99 of other conversations on the cell with and without it.
    Group(group::GroupArgs),
    /// History pages from the hot or the cold tier of a cell it starts:
    /// page latency and the cell's disk before and after tiering.
    Pull(pull::PullArgs),
    /// Full-text search on a cell it starts: indexing against the send
    /// rate, index size, member-scoped query latency, ack to searchable.
    Search(search::SearchArgs),
    /// Files through a cell it starts (local directory or S3): download
    /// URL latency, upload and download MB/s per file size.
    Attachments(attachments::AttachmentsArgs),
    /// Backups of a cell it fills: backup MB/s and send latency during
    /// one, an incremental backup after a little more history, restore
    /// MB/s.
    Backup(backup::BackupArgs),
    /// Route writes and lookups against the RoutingService, or the same
    /// workload against etcd for comparison.
    Router(router::RouterArgs),
    /// Live conversation moves on a running `cellmesh dev`: messages copied
    /// per second and the freeze window.
    Migrate(migrate::MigrateArgs),
    /// Fills a fresh tenant and moves it whole while senders write to it:
    /// conversations and messages per second, freeze window, route writes,
    /// router memory.
    TenantMove(tenant_move::TenantMoveArgs),
    /// Hangs the cell owning the demo conversation of a running `cellmesh
    /// dev` and measures the time to the first accepted send.
    Failover(failover::FailoverArgs),
    /// An OTLP/gRPC trace receiver that keeps the last traces in memory
    /// and reports how many spans it took: the collector of the trace-cost
    /// bench (`scripts/bench-telemetry.sh`).
    OtlpSink(OtlpSinkArgs),
}

#[derive(Args)]
pub struct OtlpSinkArgs {
    /// Where to take OTLP exports.
    #[arg(long, default_value = "127.0.0.1:4317")]
    listen: std::net::SocketAddr,
}

/// Receives spans until Ctrl-C, printing the count every 10 s.
async fn otlp_sink(args: OtlpSinkArgs) -> anyhow::Result<()> {
    let receiver = cellmesh_telemetry::trace::receiver::Receiver::new(1_000);
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let server = receiver.serve(listener);
    println!("OTLP receiver on {}", args.listen);
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(10));
    let shutdown = cellmesh_proto::server::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tick.tick() => println!("{} traces held", receiver.summaries().len()),
        }
    }
    server.abort();
    Ok(())
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.scenario {
        Scenario::Send(args) => send::run(args).await,
        Scenario::Storage(args) => storage::run(args).await,
        Scenario::OtlpSink(args) => otlp_sink(args).await,
        Scenario::Push(args) => push::run(args).await,
        Scenario::Pull(args) => pull::run(args).await,
        Scenario::Search(args) => search::run(args).await,
        Scenario::Group(args) => group::run(args).await,
        Scenario::Attachments(args) => attachments::run(args).await,
        Scenario::Router(args) => router::run(args).await,
        Scenario::Backup(args) => backup::run(args).await,
        Scenario::Migrate(args) => migrate::run(args).await,
        Scenario::Failover(args) => failover::run(args).await,
        Scenario::TenantMove(args) => tenant_move::run(args).await,
    }
}
