//! A small deployment inside the test process: a router group, two cells
//! that follow it (eu-west/c1, us-east/c1), tenant 1 on the first, and an
//! edge — optionally reaching the routers through a slow link — plus client
//! token helpers.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellmesh_chaos::check_all;
use cellmesh_chaos::history::{History, Outcome, SendOp, Skipped, Stored};
use cellmesh_chaos::proxy::FaultProxy;
use cellmesh_control_plane::server::{
    ControlPlaneConfig, Event, FailoverConfig, RunningControlPlane,
};
use cellmesh_edge::auth::{Claims, TokenKey, now_secs};
use cellmesh_edge::{EdgeConfig, RunningEdge};
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1::messaging_client::MessagingClient;
use cellmesh_proto::v1::{
    ConversationKind, CreateConversationRequest, Direction, ErrorCode, Message, MessageType,
    PullRequest, PullResponse, SendRequest,
};
use cellmesh_route_client::client::RouteClient;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

use crate::TestCell;
use crate::router::{RouterCluster, SECRET};

pub const TOKEN_SECRET: &str = "edge-test-token-secret";

pub struct Deployment {
    pub cluster: RouterCluster,
    pub cells: Vec<TestCell>,
    pub edge: RunningEdge,
    pub edge_link: Option<FaultProxy>,
}

pub async fn deploy(edge_router_latency: Option<Duration>) -> Deployment {
    deploy_with(edge_router_latency, |_| {}).await
}

/// [`deploy`] with both cells' configs adjusted by `tweak`.
pub async fn deploy_with(
    edge_router_latency: Option<Duration>,
    tweak: impl Fn(&mut cellmesh_cell::CellConfig),
) -> Deployment {
    let cluster = RouterCluster::start(1, |_| {}).await;
    let routers = cluster.endpoints();
    let mut cells = Vec::new();
    for id in ["eu-west/c1", "us-east/c1"] {
        let dir = tempfile::tempdir().expect("temp dir");
        cells.push(TestCell::start_routed_with(id, routers.clone(), dir, &tweak).await);
    }
    let client = cluster.client().await;
    client
        .place_tenant(TenantId(1), "eu-west/c1")
        .await
        .unwrap();
    // The edge reaches the route table through a link with added latency.
    let (edge_routers, link) = match edge_router_latency {
        Some(latency) => {
            let upstream = cluster.replicas[0].config.api_listen;
            let link = FaultProxy::start("127.0.0.1:0".parse().unwrap(), upstream)
                .await
                .unwrap();
            link.set_latency(latency, Duration::ZERO);
            (vec![format!("http://{}", link.addr())], Some(link))
        }
        None => (routers, None),
    };
    let edge = start_edge(edge_routers).await;
    Deployment {
        cluster,
        cells,
        edge,
        edge_link: link,
    }
}

/// An edge on port 0 following `routers`.
pub async fn start_edge(routers: Vec<String>) -> RunningEdge {
    cellmesh_edge::start(EdgeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        routers,
        cluster_secret: SECRET.into(),
        token_secret: TOKEN_SECRET.into(),
        ..EdgeConfig::default()
    })
    .await
    .expect("edge starts")
}

/// Sends through the edge until `stop`, one request id per message
/// (`u{sender}-{n}`), recording every outcome: a timeout or a retry-later,
/// unavailable or internal answer may have happened (unknown).
pub async fn sender(
    edge: String,
    token: String,
    conversation: u64,
    sender: u64,
    stop: Arc<AtomicBool>,
    epoch: Instant,
    ops: Arc<Mutex<Vec<SendOp>>>,
) {
    let channel = Channel::from_shared(edge).unwrap().connect().await.unwrap();
    let mut client = MessagingClient::new(channel);
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let tag = format!("u{sender}-{n}");
        let invoked_ms = epoch.elapsed().as_millis() as u64;
        let answer = tokio::time::timeout(
            Duration::from_secs(10),
            client.send(authed(text(conversation, &tag), &token)),
        )
        .await;
        let outcome = match &answer {
            Ok(answer) => Outcome::of_send(answer.as_ref().map(|r| r.get_ref())),
            Err(_) => Outcome::Unknown,
        };
        match (&answer, &outcome) {
            (Ok(Err(e)), Outcome::Unknown) => {
                eprintln!("{tag} at {invoked_ms} ms: outcome unknown: {e:?}")
            }
            (Err(_), _) => eprintln!("{tag} at {invoked_ms} ms: no answer in 10 s"),
            _ => {}
        }
        ops.lock().unwrap().push(SendOp {
            conversation,
            sender,
            client_req_id: tag,
            invoked_ms,
            completed_ms: epoch.elapsed().as_millis() as u64,
            outcome,
        });
    }
}

/// One [`sender`] per user of tenant 1, all writing into `conversation`
/// through `edge` until [`Senders::finish`].
pub struct Senders {
    /// Operation times are milliseconds since this.
    pub epoch: Instant,
    stop: Arc<AtomicBool>,
    ops: Arc<Mutex<Vec<SendOp>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Senders {
    pub fn start(edge: &RunningEdge, conversation: u64, users: &[u64]) -> Self {
        let epoch = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let ops = Arc::new(Mutex::new(Vec::new()));
        let tasks = users
            .iter()
            .map(|&user| {
                tokio::spawn(sender(
                    edge.endpoint(),
                    token(1, user),
                    conversation,
                    user,
                    stop.clone(),
                    epoch,
                    ops.clone(),
                ))
            })
            .collect();
        Self {
            epoch,
            stop,
            ops,
            tasks,
        }
    }

    /// Milliseconds since [`Self::epoch`].
    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Sends acknowledged so far.
    pub fn acked(&self) -> usize {
        let ops = self.ops.lock().unwrap();
        ops.iter()
            .filter(|o| matches!(o.outcome, Outcome::Ok { .. }))
            .count()
    }

    /// The highest seq acknowledged so far.
    pub fn latest_acked_seq(&self) -> u64 {
        let ops = self.ops.lock().unwrap();
        ops.iter()
            .filter_map(|o| match o.outcome {
                Outcome::Ok { seq, .. } => Some(seq),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// Waits until `n` sends are acknowledged (load is flowing).
    pub async fn until_acked(&self, n: usize, within: Duration) {
        let flowing = crate::eventually(within, || async { self.acked() >= n }).await;
        assert!(
            flowing,
            "{} of {n} sends acknowledged in {within:?}",
            self.acked()
        );
    }

    /// Lets them send for `more`, stops them, and returns every operation.
    pub async fn finish(self, more: Duration) -> Vec<SendOp> {
        tokio::time::sleep(more).await;
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
        std::mem::take(&mut *self.ops.lock().unwrap())
    }
}

pub fn token(tenant: u64, user: u64) -> String {
    TokenKey::new(TOKEN_SECRET).issue(&Claims {
        tenant: TenantId(tenant),
        user: UserId(user),
        device: "phone".into(),
        exp: now_secs() + 3600,
        ..Default::default()
    })
}

pub fn authed<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.metadata_mut().insert(
        "authorization",
        MetadataValue::try_from(format!("Bearer {token}")).unwrap(),
    );
    r
}

/// A text message whose body is its request id (the history checker's tag).
pub fn text(conversation: u64, tag: &str) -> SendRequest {
    SendRequest {
        conversation_id: conversation,
        client_req_id: tag.into(),
        r#type: MessageType::Text as i32,
        body: tag.as_bytes().to_vec(),
        ..Default::default()
    }
}

pub async fn messaging(edge: &RunningEdge) -> MessagingClient<Channel> {
    let channel = Channel::from_shared(edge.endpoint())
        .expect("edge endpoint")
        .connect()
        .await
        .expect("edge reachable");
    MessagingClient::new(channel)
}

/// A group of the token's user and `members`, created through the edge.
/// `count` group conversations of `token`'s user with user 11, each with
/// `messages` texts tagged `seed-{i}` (the first) and `seed-{i}-{n}`.
pub async fn create_seeded(
    m: &mut MessagingClient<Channel>,
    token: &str,
    count: usize,
    messages: usize,
) -> Vec<u64> {
    let mut conversations = Vec::new();
    for i in 0..count {
        let c = create_via_edge(m, token, vec![11]).await;
        for n in 0..messages {
            let tag = match n {
                0 => format!("seed-{i}"),
                n => format!("seed-{i}-{n}"),
            };
            m.send(authed(text(c, &tag), token))
                .await
                .expect("a seed message is acknowledged");
        }
        conversations.push(c);
    }
    conversations
}

pub async fn create_via_edge(
    m: &mut MessagingClient<Channel>,
    token: &str,
    members: Vec<u64>,
) -> u64 {
    m.create_conversation(authed(
        CreateConversationRequest {
            kind: ConversationKind::Group as i32,
            title: "test".into(),
            member_ids: members,
            ..Default::default()
        },
        token,
    ))
    .await
    .expect("create through the edge")
    .into_inner()
    .conversation
    .expect("conversation")
    .conversation_id
}

/// The page of a conversation after `since`, oldest first, through the edge.
async fn page_via_edge(
    m: &mut MessagingClient<Channel>,
    token: &str,
    conversation: u64,
    since: u64,
) -> PullResponse {
    m.pull(authed(
        PullRequest {
            conversation_id: conversation,
            since_seq: since,
            direction: Direction::Forward as i32,
            limit: 100,
            ..Default::default()
        },
        token,
    ))
    .await
    .expect("pull through the edge")
    .into_inner()
}

/// The first page of a conversation, oldest first, through the edge.
pub async fn pull_via_edge(
    m: &mut MessagingClient<Channel>,
    token: &str,
    conversation: u64,
) -> PullResponse {
    page_via_edge(m, token, conversation, 0).await
}

/// A conversation's whole history, page by page, through the edge.
pub async fn history_via_edge(
    m: &mut MessagingClient<Channel>,
    token: &str,
    conversation: u64,
) -> Vec<Stored> {
    let mut out = Vec::new();
    let mut since = 0;
    loop {
        let page = page_via_edge(m, token, conversation, since).await;
        out.extend(stored(&page.messages));
        if !page.has_more {
            return out;
        }
        since = page.next_seq;
    }
}

/// Reads a conversation back through the edge into `history`: its
/// messages, and the seq ranges its owners reported skipped (floor jumps),
/// which explain its gaps.
pub async fn read_back_via_edge(
    m: &mut MessagingClient<Channel>,
    token: &str,
    conversation: u64,
    history: &mut History,
) {
    let mut out = Vec::new();
    let mut since = 0;
    loop {
        let page = page_via_edge(m, token, conversation, since).await;
        out.extend(stored(&page.messages));
        for s in &page.skipped {
            let skipped = Skipped {
                conversation,
                first: s.first,
                last: s.last,
            };
            if !history.skipped.contains(&skipped) {
                history.skipped.push(skipped);
            }
        }
        if !page.has_more {
            break;
        }
        since = page.next_seq;
    }
    history.conversations.insert(conversation, out);
}

/// Asserts `e` carries the stable `code` and `reason` (and the gRPC code
/// that code travels under); its detail.
pub fn assert_reason(
    e: &tonic::Status,
    code: ErrorCode,
    reason: &str,
) -> cellmesh_proto::v1::ErrorDetail {
    assert_eq!(e.code(), code.grpc_code(), "{e}");
    let detail = error_detail(e);
    assert_eq!(
        (
            ErrorCode::try_from(detail.code).ok(),
            detail.reason.as_str()
        ),
        (Some(code), reason),
        "{e}"
    );
    detail
}

/// Fails the test with the counterexamples of every invariant `history`
/// breaks.
pub fn assert_every_invariant(history: &History) {
    for verdict in check_all(history) {
        assert!(
            verdict.holds,
            "{}: {:?}",
            verdict.invariant, verdict.counterexamples
        );
    }
}

/// A control plane on `routers` that probes every 100 ms and fails a cell
/// over after 3 failed probes (and the 2 s owner lease); failover floors
/// assume 100 sends/s per conversation and 1 s checkpoints.
pub async fn fast_control_plane(routers: Vec<String>) -> RunningControlPlane {
    control_plane_with(routers, fast_failover()).await
}

/// The failover settings of [`fast_control_plane`].
pub fn fast_failover() -> FailoverConfig {
    FailoverConfig {
        conversation_per_sec: 100,
        conversation_burst: 100,
        checkpoint_interval_ms: 1000,
        owner_lease_ms: 2000,
    }
}

/// As [`fast_control_plane`], with these failover settings.
pub async fn control_plane_with(
    routers: Vec<String>,
    failover: FailoverConfig,
) -> RunningControlPlane {
    cellmesh_control_plane::server::start(fast_config(routers, failover))
        .await
        .expect("control plane starts")
}

/// The config [`control_plane_with`] starts: probes every 100 ms, a cell
/// failed after three failed ones.
pub fn fast_config(routers: Vec<String>, failover: FailoverConfig) -> ControlPlaneConfig {
    ControlPlaneConfig {
        routers,
        cluster_secret: SECRET.into(),
        probe_interval_ms: 100,
        probe_timeout_ms: 200,
        down_after: 3,
        up_after: 3,
        failover,
        console_listen: String::new(),
        admin_listen: "127.0.0.1:0".into(),
        ..ControlPlaneConfig::default()
    }
}

/// The config of a routed cell process in `dir` whose failover the
/// [`busy_control_plane`] tracks: 200 ms checkpoints, 1,000 sends/s per
/// conversation, replication `mode`.
pub fn busy_cell_config(
    dir: &std::path::Path,
    cell_id: &str,
    routers: &[String],
    mode: cellmesh_cell::config::ReplicationMode,
) -> cellmesh_cell::CellConfig {
    let mut config = crate::test_config(dir);
    config.cell_id = cell_id.into();
    config.routing.routers = routers.to_vec();
    config.routing.cluster_secret = SECRET.into();
    config.routing.checkpoint_interval_ms = 200;
    config.rate_limit.conversation_per_sec = 1_000;
    config.rate_limit.conversation_burst = 1_000;
    config.replication.mode = mode;
    config
}

/// A control plane whose failover floors fit [`busy_cell_config`] cells.
pub async fn busy_control_plane(routers: Vec<String>) -> RunningControlPlane {
    control_plane_with(
        routers,
        FailoverConfig {
            conversation_per_sec: 1_000,
            conversation_burst: 1_000,
            checkpoint_interval_ms: 200,
            owner_lease_ms: 2_000,
        },
    )
    .await
}

/// Fails `cell` over as the control plane would, with floor `margin`, and
/// returns the cell its routes went to.
pub async fn fail_over(routes: &RouteClient, cell: &str, margin: u64) -> String {
    // No fence: the cell is marked Down and its routes move at once
    // (planned again when its entry changed in between, as the control
    // plane does).
    let plan =
        cellmesh_control_plane::failover::fail_fenced(routes, cell, margin, Duration::ZERO, |_| {})
            .await;
    plan.unwrap_or_else(|e| panic!("failover of {cell}: {e}"))
        .fallback
}

/// Waits until every cell the route table lists as holding the owner's
/// high-water marks (at least one) holds a mark of `conversation` of tenant
/// 1 at `hwm` or above: a failover now puts its floor above that.
pub async fn wait_for_checkpoint(
    routes: &RouteClient,
    conversation: u64,
    hwm: u64,
    within: Duration,
) {
    let reached = crate::eventually(within, || {
        let routes = routes.clone();
        async move {
            let holders = holder_addresses(&routes, conversation);
            if holders.is_empty() {
                return false;
            }
            for address in holders {
                if held_mark(&address, 1, conversation).await < hwm {
                    return false;
                }
            }
            true
        }
    })
    .await;
    assert!(reached, "conversation {conversation} checkpointed at {hwm}");
}

/// The seq floor of `conversation` of tenant 1 as its owner sees it (a
/// failover's: the mark the owner holds plus the route's margin).
pub async fn floor_of(routes: &RouteClient, conversation: u64) -> u64 {
    cellmesh_chaos::floors::failover_floors(routes, &ClusterSecret::new(SECRET), 1, &[conversation])
        .await
        .get(&conversation)
        .copied()
        .unwrap_or(0)
}

/// The addresses of the cells holding the marks of `conversation`'s owner.
pub fn holder_addresses(routes: &RouteClient, conversation: u64) -> Vec<String> {
    routes.read(|t| {
        let Some(owner) = t.resolve(&cellmesh_route_client::table::Key::conversation(
            TenantId(1),
            ConversationId(conversation),
        )) else {
            return Vec::new();
        };
        t.cell(&owner.entry.cell)
            .map(|c| {
                c.mark_holders
                    .iter()
                    .filter_map(|h| t.cell(h).map(|h| h.address.clone()))
                    .collect()
            })
            .unwrap_or_default()
    })
}

/// A migrator over `routes` with the default options.
pub fn migrator(routes: &RouteClient) -> cellmesh_control_plane::migration::Migrator {
    cellmesh_control_plane::migration::Migrator::new(
        routes.clone(),
        ClusterSecret::new(SECRET),
        cellmesh_control_plane::migration::MigrationOptions::default(),
    )
}

/// The high-water mark the cell at `address` holds for a conversation (0
/// when it holds none or does not answer).
pub async fn held_mark(address: &str, tenant: u64, conversation: u64) -> u64 {
    let Ok(mut peer) =
        cellmesh_proto::v1::cell_peer_client::CellPeerClient::connect(address.to_string()).await
    else {
        return 0;
    };
    let mut request = tonic::Request::new(cellmesh_proto::v1::GetHighWaterMarksRequest {
        tenant_id: tenant,
        conversation_ids: vec![conversation],
    });
    ClusterSecret::new(SECRET).attach(&mut request);
    match peer.get_high_water_marks(request).await {
        Ok(r) => r.into_inner().marks.first().map_or(0, |m| m.hwm),
        Err(_) => 0,
    }
}

/// Waits until the control plane reports `cell`'s history backfilled into
/// the current owners.
pub async fn wait_for_backfill(cp: &RunningControlPlane, cell: &str, within: Duration) {
    let done = crate::eventually(within, || {
        let done = cp.events().iter().any(|e| {
            matches!(e, Event::Backfilled { cell: c, done }
                if c == cell && done.conversations >= 1)
        });
        async move { done }
    })
    .await;
    assert!(done, "backfill of {cell} ran: {:?}", cp.events());
}

/// Messages as the history checker records them: the body is the tag of
/// the send that wrote it; a tombstone (a reconciled duplicate) has none.
pub fn stored(messages: &[Message]) -> Vec<Stored> {
    messages
        .iter()
        .map(|m| Stored {
            seq: m.seq,
            msg_id: m.msg_id,
            tag: if m.state == cellmesh_proto::v1::MessageState::Recalled as i32 {
                format!("tombstone-{}", m.seq)
            } else {
                String::from_utf8_lossy(&m.body).into_owned()
            },
        })
        .collect()
}

/// Binds `tenant` to `regions` (empty: unbinds it) once the cluster has
/// written its version (binding is gated on it), and gives the cells and
/// edges a moment to follow the table's watch.
pub async fn bind_regions(routes: &RouteClient, tenant: TenantId, regions: &[&str]) {
    assert!(
        !routes
            .cluster_version(Duration::from_secs(10))
            .await
            .is_empty()
    );
    let regions: Vec<String> = regions.iter().map(|r| r.to_string()).collect();
    routes.bind_regions(tenant, &regions).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
}
