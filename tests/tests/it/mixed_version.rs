//! This release beside the previous one (its `cellmesh` binary, built from
//! the commit in `scripts/previous-release` by `scripts/build-previous.sh`):
//! a router group the previous release formed, with two replicas of this
//! one; a cell of each release; this release's edge in front. Sends and
//! pulls go through the edge; a conversation moves from the old cell to the
//! new one (this release's migrator copying from the old cell); its
//! members' events go back to their homes on the old cell; `ctl upgrade finalize` is refused
//! while the old release runs; the old cell is upgraded in place (same
//! data, this binary), rolled back to the previous release and upgraded
//! again, its users' events pushed each time; the old router is upgraded;
//! then the finalize is taken, and the history is whole, in order, once.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cellmesh_proto::v1::{SubscribeRequest, SyncEventKind, sync_client::SyncClient, sync_push};
use cellmesh_route_client::client::RouteClient;
use cellmesh_route_client::commands::assign_tenant;
use cellmesh_router::config::{MemberConfig, RouterConfig};
use cellmesh_tests::deploy::{
    authed, create_via_edge, history_via_edge, messaging, migrator, start_edge, text, token,
};
use cellmesh_tests::process::{CellProcess, RouterProcess};
use cellmesh_tests::router::{SECRET, router_config};
use cellmesh_tests::{TestCell, cellmesh_bin, eventually, free_port, test_config};
use tempfile::TempDir;

/// The previous release's binary: `CELLMESH_PREVIOUS_BIN`, else where
/// `scripts/build-previous.sh` leaves it.
fn previous_bin() -> PathBuf {
    let path = std::env::var_os("CELLMESH_PREVIOUS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/cellmesh/previous/cellmesh")
        });
    assert!(
        path.exists(),
        "no previous release at {}: run scripts/build-previous.sh",
        path.display()
    );
    path
}

/// Three replicas on fixed loopback ports, node 1 forming the group.
fn router_configs(dirs: &[TempDir]) -> Vec<RouterConfig> {
    let addrs: Vec<(String, String)> = (0..3)
        .map(|_| {
            (
                format!("127.0.0.1:{}", free_port()),
                format!("127.0.0.1:{}", free_port()),
            )
        })
        .collect();
    let members: Vec<MemberConfig> = addrs
        .iter()
        .enumerate()
        .map(|(i, (api, raft))| MemberConfig {
            node_id: i as u64 + 1,
            region: "eu-west".into(),
            raft_addr: format!("http://{raft}"),
            api_addr: format!("http://{api}"),
        })
        .collect();
    (0..3)
        .map(|i| {
            let mut c = router_config(i as u64 + 1, "eu-west", dirs[i].path());
            c.api_listen = addrs[i].0.parse().unwrap();
            c.raft_listen = addrs[i].1.parse().unwrap();
            c.cluster.bootstrap = i == 0;
            c.cluster.members = members.clone();
            c
        })
        .collect()
}

/// Top-level settings added since the previous release (which refuses
/// what it does not know).
const NEWER_FIELDS: &[&str] = &["insecure_plaintext"];

/// Settings 0.3.0 added inside a cell config's tables: (table, field).
const NEWER_TABLE_FIELDS: &[(&str, &str)] = &[
    ("attachments", "quota_sync_secs"),
    ("fanout", "hint_interval_ms"),
    ("storage", "fanout_nice"),
    ("storage", "max_wal_mb"),
];

/// A cell config as TOML; for the previous release, without the settings
/// it does not know (0.3.0 added `[backup]` and the fields above to cells).
fn cell_toml(dir: &Path, cell_id: &str, routers: &[String], previous: bool) -> String {
    let mut config = test_config(dir);
    config.cell_id = cell_id.into();
    config.routing.routers = routers.to_vec();
    config.routing.cluster_secret = SECRET.into();
    let mut table = toml::Table::try_from(&config).unwrap();
    if previous {
        for field in NEWER_FIELDS.iter().chain(&["backup"]) {
            table.remove(*field);
        }
        for (name, field) in NEWER_TABLE_FIELDS {
            if let Some(toml::Value::Table(inner)) = table.get_mut(*name) {
                inner.remove(*field);
            }
        }
    }
    toml::to_string(&table).unwrap()
}

/// Sends `n` messages tagged `{prefix}-{i}` through the edge as user 10;
/// each must get the next seq after `last`. Returns the last seq.
async fn send_n(
    m: &mut cellmesh_proto::v1::messaging_client::MessagingClient<tonic::transport::Channel>,
    conv: u64,
    prefix: &str,
    n: u64,
    last: u64,
    sent: &mut Vec<String>,
) -> u64 {
    for i in 0..n {
        let tag = format!("{prefix}-{i}");
        let r = m
            .send(authed(text(conv, &tag), &token(1, 10)))
            .await
            .unwrap();
        assert_eq!(r.into_inner().seq, last + i + 1, "{tag}");
        sent.push(tag);
    }
    last + n
}

/// Bob's device from pts 0 through the edge: the seqs of the first `n`
/// messages pushed.
async fn bobs_pushes(edge: &cellmesh_edge::RunningEdge, n: usize) -> Vec<u64> {
    let channel = tonic::transport::Channel::from_shared(edge.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut stream = SyncClient::new(channel)
        .subscribe(authed(SubscribeRequest::default(), &token(1, 11)))
        .await
        .unwrap()
        .into_inner();
    let mut pushed = Vec::new();
    while pushed.len() < n {
        let push = cellmesh_tests::sync::next_push(&mut stream, Duration::from_secs(20))
            .await
            .unwrap_or_else(|| panic!("only {pushed:?} reached bob's home"));
        if let Some(sync_push::Push::Event(e)) = push.push
            && e.kind == SyncEventKind::Message as i32
        {
            pushed.push(e.seq);
        }
    }
    pushed
}

fn finalize(routers: &[String]) -> std::process::Output {
    Command::new(cellmesh_bin())
        .args(["ctl", "--routers", &routers.join(","), "--secret", SECRET])
        .args(["upgrade", "finalize"])
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_release_runs_beside_the_previous_one_and_upgrades_it_in_place() {
    let previous = previous_bin();
    let dirs: Vec<TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let configs = router_configs(&dirs);
    let routers: Vec<String> = configs
        .iter()
        .map(|c| format!("http://{}", c.api_listen))
        .collect();
    let mut old_router = Some(RouterProcess::start_without(
        &previous,
        &configs[0],
        NEWER_FIELDS,
    ));
    let _new_routers: Vec<RouterProcess> = configs[1..]
        .iter()
        .map(|c| RouterProcess::start(&cellmesh_bin(), c))
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let routes = loop {
        let secret = cellmesh_proto::secret::ClusterSecret::new(SECRET);
        match RouteClient::connect(routers.clone(), secret).await {
            Ok(client) => break client,
            Err(e) if std::time::Instant::now() > deadline => {
                panic!("the mixed router group does not answer: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };

    // A cell of each release; the tenant on the old one.
    let old_dir = tempfile::tempdir().unwrap();
    let old_cell = CellProcess::start_built(
        &previous,
        old_dir.path(),
        &cell_toml(old_dir.path(), "eu-west/c1", &routers, true),
    )
    .await;
    let new_cell = TestCell::start_routed("us-east/c1", routers.clone()).await;
    let placed = eventually(Duration::from_secs(20), || {
        let routes = routes.clone();
        async move {
            routes
                .apply(assign_tenant(TenantId(1), "eu-west/c1", 0))
                .await
                .is_ok()
        }
    })
    .await;
    assert!(
        placed,
        "tenant placed through the group the old release leads"
    );
    let edge = start_edge(routers.clone()).await;
    let alice = token(1, 10);
    let mut m = messaging(&edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11, 12]).await;
    let mut sent = Vec::new();
    let mut seq = send_n(&mut m, conv, "old", 10, 0, &mut sent).await;

    // Moved onto this release's cell by this release's migrator.
    migrator(&routes)
        .migrate_conversation(TenantId(1), ConversationId(conv), "us-east/c1", |_| {})
        .await
        .expect("the conversation moves from the previous release's cell");
    seq = send_n(&mut m, conv, "new", 10, seq, &mut sent).await;
    // Bob's home is the old cell: the new owner's events reach it.
    assert_eq!(bobs_pushes(&edge, 20).await, (1..=20).collect::<Vec<_>>());

    let refused = finalize(&routers);
    assert!(
        !refused.status.success(),
        "finalize while the previous release runs"
    );
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("router node 1") && said.contains("eu-west/c1"),
        "{said}"
    );

    // The old cell upgraded in place (same data and config, this binary),
    // rolled back to the previous release, and upgraded again: before the
    // finalize each reads what the other wrote. Bob's home goes on.
    old_cell.stop().await;
    let mut home = None;
    for (bin, previous, tag) in [
        (cellmesh_bin(), false, "upgraded"),
        (previous.clone(), true, "rolled-back"),
        (cellmesh_bin(), false, "again"),
    ] {
        if let Some(cell) = home.take() {
            CellProcess::stop(cell).await;
        }
        let toml = cell_toml(old_dir.path(), "eu-west/c1", &routers, previous);
        home = Some(CellProcess::start_built(&bin, old_dir.path(), &toml).await);
        seq = send_n(&mut m, conv, tag, 2, seq, &mut sent).await;
        let want: Vec<u64> = (1..=seq).collect();
        assert_eq!(bobs_pushes(&edge, seq as usize).await, want, "{tag}");
    }
    old_router.take().unwrap().stop().await;
    let _upgraded_router = RouterProcess::start(&cellmesh_bin(), &configs[0]);
    let finalized = eventually(Duration::from_secs(60), || {
        let routers = routers.clone();
        async move { finalize(&routers).status.success() }
    })
    .await;
    assert!(
        finalized,
        "{}",
        String::from_utf8_lossy(&finalize(&routers).stderr)
    );
    // This process's route client follows the table's watch: it sees the
    // finalize shortly after the command returns.
    let seen = eventually(Duration::from_secs(10), || {
        let routes = routes.clone();
        async move { routes.read(|t| t.cluster_version == cellmesh_proto::version::BINARY) }
    })
    .await;
    assert!(
        seen,
        "cluster version {}",
        routes.read(|t| t.cluster_version.clone())
    );

    seq = send_n(&mut m, conv, "after", 5, seq, &mut sent).await;
    let history = history_via_edge(&mut m, &alice, conv).await;
    let seqs: Vec<u64> = history.iter().map(|s| s.seq).collect();
    assert_eq!(seqs, (1..=seq).collect::<Vec<_>>(), "whole, in order, once");
    let tags: Vec<String> = history.iter().map(|s| s.tag.clone()).collect();
    assert_eq!(tags, sent);
    assert_eq!(
        bobs_pushes(&edge, seq as usize).await,
        (1..=seq).collect::<Vec<_>>()
    );
    drop(home);
    new_cell.stop().await;
}
