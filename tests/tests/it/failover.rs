//! A cell dies under traffic: the control plane detects it, moves its
//! tenant to the fallback cell with a seq floor above every acknowledged
//! seq, new sends through the edge succeed there within seconds, and older
//! history is reported as temporarily unavailable instead of missing.

use cellmesh_proto::ids::{ConversationId, TenantId};
use cellmesh_proto::reason::Reason;
use std::time::{Duration, Instant};

use cellmesh_chaos::history::{Floor, History, Outcome, SendOp};
use cellmesh_control_plane::server::Event;
use cellmesh_proto::secret::ClusterSecret;
use cellmesh_proto::v1::cell_peer_client::CellPeerClient;
use cellmesh_proto::v1::*;
use cellmesh_route_client::table::Key;
use cellmesh_tests::deploy::*;
use cellmesh_tests::eventually;
use cellmesh_tests::router::SECRET;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_cell_is_failed_over_and_sends_continue_above_the_floor() {
    fail_over_and_back(true).await;
}

/// The new owner takes no send before the failed cell returns: it still
/// reports the history below the route's floor as unavailable, and then
/// takes all of it in the backfill (its own stored floor is still the old
/// one, or none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_new_owner_reports_and_backfills_the_history_below_the_floor() {
    fail_over_and_back(false).await;
}

async fn fail_over_and_back(send_after: bool) {
    let mut d = deploy(None).await;
    let routes = d.cluster.client().await;
    let cp = fast_control_plane(d.cluster.endpoints()).await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    let mut ops = Vec::new();
    for i in 0..20 {
        let tag = format!("before-{i}");
        let r = m
            .send(authed(text(conv, &tag), &alice))
            .await
            .unwrap()
            .into_inner();
        ops.push(SendOp {
            conversation: conv,
            sender: 10,
            client_req_id: tag,
            invoked_ms: 0,
            completed_ms: 0,
            outcome: Outcome::Ok {
                msg_id: r.msg_id,
                seq: r.seq,
            },
        });
    }
    // The checkpoint reaches the route table and the standby has the meta.
    wait_for_checkpoint(&routes, conv, 20, Duration::from_secs(10)).await;
    let standby = d.cells[1].endpoint.clone();
    assert!(
        eventually(Duration::from_secs(10), || {
            let standby = standby.clone();
            async move {
                let mut peer = CellPeerClient::connect(standby).await.unwrap();
                let mut r = tonic::Request::new(ExportRequest {
                    tenant_id: 1,
                    conversation_id: conv,
                    after_seq: 0,
                    limit: 1,
                });
                ClusterSecret::new(SECRET).attach(&mut r);
                peer.export_conversation(r)
                    .await
                    .is_ok_and(|c| c.into_inner().members.len() == 2)
            }
        })
        .await,
        "the standby holds the conversation's meta"
    );

    let killed = Instant::now();
    let dead = d.cells.remove(0);
    let dead_dir = dead.stop().await;
    if !send_after {
        assert!(
            eventually(Duration::from_secs(30), || {
                let moved = routes.read(|t| {
                    t.resolve(&Key::conversation(TenantId(1), ConversationId(conv)))
                        .is_some_and(|r| r.entry.cell == "us-east/c1")
                });
                async move { moved }
            })
            .await,
            "no failover"
        );
    }
    if send_after {
        let (after, first_ok) = loop {
            match m.send(authed(text(conv, "after"), &alice)).await {
                Ok(r) => break (r.into_inner(), killed.elapsed()),
                Err(e) => assert!(
                    killed.elapsed() < Duration::from_secs(30),
                    "no failover: {e}"
                ),
            }
        };
        println!(
            "first send accepted {} ms after the cell died",
            first_ok.as_millis()
        );
        assert_eq!(after.seq, floor_of(&routes, conv).await + 1);
        ops.push(SendOp {
            conversation: conv,
            sender: 10,
            client_req_id: "after".into(),
            invoked_ms: 1,
            completed_ms: 1,
            outcome: Outcome::Ok {
                msg_id: after.msg_id,
                seq: after.seq,
            },
        });
    }
    let floor = floor_of(&routes, conv).await;
    assert!(floor >= 20 + 300, "floor {floor}: checkpoint plus margin");
    let events = cp.events();
    assert!(
        events.iter().any(|e| matches!(e, Event::FailedOver { cell, fallback, .. } if cell == "eu-west/c1" && fallback == "us-east/c1")),
        "{events:?}"
    );

    // History below the floor is not silently missing.
    let page = pull_via_edge(&mut m, &alice, conv).await;
    assert_eq!(page.unavailable_through, floor);
    assert_eq!(
        stored(&page.messages).len(),
        usize::from(send_after),
        "only what was sent above the floor is here yet"
    );

    // The failed cell returns: it is Up again (owning nothing) and its
    // history is backfilled into the new owner.
    let returned =
        cellmesh_tests::TestCell::start_routed_in("eu-west/c1", d.cluster.endpoints(), dead_dir)
            .await;
    wait_for_backfill(&cp, "eu-west/c1", Duration::from_secs(20)).await;
    let page = pull_via_edge(&mut m, &alice, conv).await;
    assert_eq!(page.unavailable_through, 0, "history is complete again");
    let history_read = stored(&page.messages);
    assert_eq!(history_read.len(), 20 + usize::from(send_after));
    // The latest page (what a client opening the conversation reads) ends
    // with the newest message, backfilled or not.
    let latest = m
        .pull(authed(
            PullRequest {
                conversation_id: conv,
                direction: Direction::Backward as i32,
                limit: 5,
                ..Default::default()
            },
            &alice,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        latest.messages.iter().map(|m| m.seq).max(),
        history_read.last().map(|m| m.seq),
        "the latest page shows the newest message"
    );
    // Every acknowledged send exactly once, in order, the gap explained by
    // the floor.
    let mut history = History {
        sends: ops,
        ..History::default()
    };
    history.conversations.insert(conv, history_read);
    history.floors.push(Floor {
        conversation: conv,
        floor,
    });
    assert_every_invariant(&history);

    // A conversation created under the failed-over route has no history
    // anywhere else: nothing of it is reported unavailable.
    let fresh = create_via_edge(&mut m, &alice, vec![11]).await;
    let page = pull_via_edge(&mut m, &alice, fresh).await;
    assert!(page.seq_floor > 0, "created under a failover floor");
    assert_eq!(page.unavailable_through, 0);
    fail_back_whole(&d, &mut m, &alice, conv, 20 + usize::from(send_after)).await;
    drop(returned);
    cp.stop();
}

/// The returned cell takes its tenant back: it holds the conversation's
/// whole history again (`len` messages) and says so — the backfill the
/// new owner had taken moves back with it.
async fn fail_back_whole(
    d: &Deployment,
    m: &mut cellmesh_proto::v1::messaging_client::MessagingClient<tonic::transport::Channel>,
    alice: &str,
    conv: u64,
    len: usize,
) {
    use cellmesh_control_plane::migration::{MigrationOptions, Migrator};
    let migrator = Migrator::new(
        d.cluster.client().await,
        ClusterSecret::new(SECRET),
        MigrationOptions::default(),
    );
    let back = migrator.failback("eu-west/c1", 4, |_| {}).await.unwrap();
    assert!(back.failures.is_empty(), "{:?}", back.failures);
    let page = pull_via_edge(m, alice, conv).await;
    assert_eq!(
        page.unavailable_through, 0,
        "the returned owner holds it all"
    );
    assert_eq!(stored(&page.messages).len(), len);
}

/// A routed cell's background tasks must not keep its storage open after
/// shutdown: a restart on the same data (what a returning cell does) opens it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_cell_restarts_on_its_own_data() {
    let d = deploy(None).await;
    let mut cells = d.cells;
    let c = cells.remove(1);
    let dir = c.stop().await;
    let back =
        cellmesh_tests::TestCell::start_routed_in("us-east/c1", d.cluster.endpoints(), dir).await;
    let routes = d.cluster.client().await;
    assert!(
        eventually(Duration::from_secs(5), || {
            let address = routes.read(|t| t.cell("us-east/c1").map(|c| c.address.clone()));
            let want = back.endpoint.clone();
            async move { address.as_deref() == Some(want.as_str()) }
        })
        .await,
        "the restarted cell re-registered its address"
    );
}

/// Tenant 1 placed on eu-west/c1, an edge in front, and a conversation of
/// users 10 and 11 created through it by user 10 (whose token is given).
pub(crate) async fn tenant_on_c1(
    cluster: &cellmesh_tests::router::RouterCluster,
) -> (
    cellmesh_route_client::client::RouteClient,
    cellmesh_edge::RunningEdge,
    cellmesh_proto::v1::messaging_client::MessagingClient<tonic::transport::Channel>,
    String,
    u64,
) {
    let routes = cluster.client().await;
    routes
        .apply(cellmesh_route_client::commands::assign_tenant(
            TenantId(1),
            "eu-west/c1",
            0,
        ))
        .await
        .unwrap();
    let edge = start_edge(cluster.endpoints()).await;
    let alice = token(1, 10);
    let mut m = messaging(&edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    (routes, edge, m, alice, conv)
}

/// eu-west/c1 owning tenant 1 and reaching the route table only through
/// `link`, an edge in front, and a conversation of users 10 and 11.
struct BehindALink {
    cluster: cellmesh_tests::router::RouterCluster,
    link: cellmesh_chaos::proxy::FaultProxy,
    _cell: cellmesh_tests::TestCell,
    routes: cellmesh_route_client::client::RouteClient,
    _edge: cellmesh_edge::RunningEdge,
    m: cellmesh_proto::v1::messaging_client::MessagingClient<tonic::transport::Channel>,
    alice: String,
    conv: u64,
}

async fn behind_a_link(tweak: impl FnOnce(&mut cellmesh_cell::CellConfig)) -> BehindALink {
    let cluster = cellmesh_tests::router::RouterCluster::start(1, |_| {}).await;
    let link = cellmesh_chaos::proxy::FaultProxy::start(
        "127.0.0.1:0".parse().unwrap(),
        cluster.replicas[0].config.api_listen,
    )
    .await
    .unwrap();
    let cell = cellmesh_tests::TestCell::start_routed_with(
        "eu-west/c1",
        vec![format!("http://{}", link.addr())],
        tempfile::tempdir().unwrap(),
        tweak,
    )
    .await;
    let (routes, edge, m, alice, conv) = tenant_on_c1(&cluster).await;
    BehindALink {
        cluster,
        link,
        _cell: cell,
        routes,
        _edge: edge,
        m,
        alice,
        conv,
    }
}

/// A cell cut off from its standby keeps serving what it owns, but stops
/// assigning seq at the mark the standby acknowledged plus the margin: the
/// floor a failover gives the standby meanwhile is above every seq it acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_cut_off_from_its_standby_stops_below_the_failover_floor() {
    // Margin: burst 100 + 100/s over two 100 ms intervals = 120.
    let margin = 120;
    let cluster = cellmesh_tests::router::RouterCluster::start(1, |_| {}).await;
    let standby = cellmesh_tests::TestCell::start_routed("eu-west/c2", cluster.endpoints()).await;
    let (link, via) = cellmesh_tests::link_to(&standby.endpoint).await;
    let standby_address = standby.endpoint.clone();
    let _cell = cellmesh_tests::TestCell::start_routed_with(
        "eu-west/c1",
        cluster.endpoints(),
        tempfile::tempdir().unwrap(),
        |c| {
            c.routing.checkpoint_interval_ms = 100;
            // The mark fence alone (the owner lease has its own test).
            c.routing.owner_lease_ms = 0;
            c.rate_limit.conversation_per_sec = 100;
            c.rate_limit.conversation_burst = 100;
            c.routing.links.insert(standby_address.clone(), via);
        },
    )
    .await;
    let (routes, _edge, mut m, alice, conv) = tenant_on_c1(&cluster).await;
    for i in 0..30 {
        m.send(authed(text(conv, &format!("in-{i}")), &alice))
            .await
            .unwrap();
    }
    wait_for_checkpoint(&routes, conv, 30, Duration::from_secs(10)).await;

    link.partition(true, true);
    let mut acked = 0;
    let mut fenced = false;
    for i in 0..400 {
        match m
            .send(authed(text(conv, &format!("cut-{i}")), &alice))
            .await
        {
            Ok(r) => acked = acked.max(r.into_inner().seq),
            Err(e)
                if cellmesh_proto::status::error_detail(&e).code
                    == ErrorCode::RateLimited as i32 =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => {
                let detail = cellmesh_proto::status::error_detail(&e);
                assert!(
                    format!("{}{}", detail.reason, e.message())
                        .contains(Reason::CheckpointBehind.as_str()),
                    "{e:?}"
                );
                fenced = true;
                break;
            }
        }
    }
    assert!(fenced, "the cut-off cell kept writing up to seq {acked}");
    let held = held_mark(&standby.endpoint, 1, conv).await;
    assert!(acked <= held + margin, "acked {acked}, held {held}");
    assert!(acked > 30, "it kept serving while it could");

    // A failover now puts the standby's floor above everything the
    // cut-off cell acknowledged.
    let plan = routes
        .read(|t| cellmesh_control_plane::failover::planner::plan_failover(t, "eu-west/c1", margin))
        .unwrap();
    assert_eq!(plan.fallback, "eu-west/c2");
    cellmesh_control_plane::failover::execute(&routes, &plan.commands)
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || {
            let routes = routes.clone();
            async move {
                let moved = routes.read(|t| {
                    t.resolve(&Key::conversation(TenantId(1), ConversationId(conv)))
                        .is_some_and(|r| r.entry.cell == "eu-west/c2")
                });
                moved && floor_of(&routes, conv).await >= acked
            }
        })
        .await,
        "the floor is above seq {acked}"
    );
}

/// A cell cut off from the route table stops writing once its owner lease
/// runs out, long before its checkpoint margin would stop it, and writes
/// again once the table confirms it. The edge holds a client's send over
/// the lapse (within its retry deadline) instead of passing it on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_cell_stops_writing_when_its_owner_lease_runs_out() {
    let b = behind_a_link(|c| c.routing.owner_lease_ms = 500).await;
    let (conv, alice) = (b.conv, b.alice.clone());
    let mut m = b.m.clone();
    m.send(authed(text(conv, "before"), &alice)).await.unwrap();
    let mut direct = b._cell.client().await;
    let send = |tag: &str| {
        let mut r = tonic::Request::new(cellmesh_tests::text(1, 10, conv, tag, "x"));
        ClusterSecret::new(SECRET).attach(&mut r);
        r
    };

    b.link.partition(true, true);
    b.link.cut();
    let cut = Instant::now();
    let mut i = 0;
    let refused = loop {
        i += 1;
        match direct.send(send(&format!("cut-{i}"))).await {
            Ok(_) => assert!(cut.elapsed() < Duration::from_secs(2), "still writing"),
            Err(e) => break e,
        }
    };
    assert!(
        format!("{:?}", refused).contains(Reason::OwnerLeaseExpired.as_str()),
        "{refused:?}"
    );
    println!(
        "writes stopped {} ms after the cut",
        cut.elapsed().as_millis()
    );

    // A client's send made now waits at the edge; the link heals within
    // the edge's retry deadline and the send is written.
    let held = tokio::spawn({
        let mut m = m.clone();
        let alice = alice.clone();
        async move { m.send(authed(text(conv, "held"), &alice)).await }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!held.is_finished(), "the lapse reached the client");
    b.link.heal();
    let written = held.await.unwrap().expect("the held send is written");
    assert!(written.into_inner().seq > 1);
    assert!(
        eventually(Duration::from_secs(10), || {
            let mut direct = direct.clone();
            let r = send("after");
            async move { direct.send(r).await.is_ok() }
        })
        .await,
        "writes resume once the table confirms the cell again"
    );
}

/// A cell whose disk fails (fail point `storage.fsync_error`) refuses
/// writes with `STORAGE_FAILED`, reports NOT_SERVING, and is failed over:
/// sends go on on the fallback above every acknowledged seq.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_whose_disk_fails_is_failed_over() {
    let d = deploy(None).await;
    let routes = d.cluster.client().await;
    let _cp = fast_control_plane(d.cluster.endpoints()).await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let conv = create_via_edge(&mut m, &alice, vec![11]).await;
    let mut last = 0;
    for i in 0..10 {
        last = m
            .send(authed(text(conv, &format!("before-{i}")), &alice))
            .await
            .unwrap()
            .into_inner()
            .seq;
    }
    wait_for_checkpoint(&routes, conv, 10, Duration::from_secs(10)).await;
    std::fs::write(
        d.cells[0].dir.path().join("failpoints"),
        "storage.fsync_error=error\n",
    )
    .unwrap();
    // The cell reads its fail point file every 100 ms.
    let store = d.cells[0].cell.service.store().clone();
    let armed = eventually(Duration::from_secs(5), || async {
        store.failpoints().hit("storage.fsync_error").is_some()
    })
    .await;
    assert!(armed, "the cell took up its fail point");
    let failed = Instant::now();
    let mut storage_failed = 0;
    let after = loop {
        match m.send(authed(text(conv, "after"), &alice)).await {
            Ok(r) => break r.into_inner(),
            Err(e) => {
                let d = cellmesh_proto::status::error_detail(&e);
                if d.reason == Reason::StorageFailed.as_str() {
                    storage_failed += 1;
                }
                assert!(
                    failed.elapsed() < Duration::from_secs(30),
                    "no failover: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    println!(
        "disk failed: {storage_failed} sends refused with STORAGE_FAILED, first accepted on the fallback after {} ms",
        failed.elapsed().as_millis()
    );
    assert!(storage_failed > 0, "the failed cell said why it refused");
    let owner = routes.read(|t| {
        t.resolve(&Key::conversation(TenantId(1), ConversationId(conv)))
            .unwrap()
            .entry
            .cell
    });
    assert_eq!(owner, "us-east/c1");
    assert!(
        after.seq > last,
        "seq {} above every acked {last}",
        after.seq
    );
}

/// `ctl fail` on a cell cut off from the route table (alive, still holding
/// its owner lease): the routes move only after the fence, by which time
/// the cut-off cell has stopped writing — it and its successor never
/// accept writes at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_moves_routes_only_once_the_cut_off_cell_stopped_writing() {
    let b = behind_a_link(|c| c.routing.owner_lease_ms = 500).await;
    let _fallback =
        cellmesh_tests::TestCell::start_routed("eu-west/c2", b.cluster.endpoints()).await;
    // Straight to the cell, as a component of the deployment would.
    let mut direct = b._cell.client().await;
    let send = |tag: &str| {
        let mut r = tonic::Request::new(cellmesh_tests::text(1, 10, b.conv, tag, "x"));
        ClusterSecret::new(SECRET).attach(&mut r);
        r
    };
    direct.send(send("before")).await.unwrap();
    // The fallback holds the cell's marks (a failover goes only there).
    wait_for_checkpoint(&b.routes, b.conv, 1, Duration::from_secs(10)).await;

    b.link.partition(true, true);
    b.link.cut();
    let mut fenced_at = None;
    let plan = cellmesh_control_plane::failover::fail_fenced(
        &b.routes,
        "eu-west/c1",
        1000,
        Duration::from_millis(700),
        |_| {
            fenced_at = Some(Instant::now());
        },
    )
    .await
    .unwrap();
    assert!(fenced_at.is_some_and(|at| at.elapsed() >= Duration::from_millis(700)));
    let key = Key::conversation(TenantId(1), ConversationId(b.conv));
    assert_eq!(
        b.routes.read(|t| t.resolve(&key).map(|r| r.entry.cell)),
        Some("eu-west/c2".to_string()),
        "{plan:?}"
    );
    // The moment the successor owns it, the cut-off cell refuses.
    let refused = direct.send(send("after the move")).await.unwrap_err();
    assert!(
        format!("{refused:?}").contains(Reason::OwnerLeaseExpired.as_str()),
        "{refused:?}"
    );
}

/// Two failovers in a row: the second goes to a cell that holds the first
/// successor's marks, including the floors it took over and never wrote
/// above, so every floor lands above everything either owner could have
/// assigned — with nothing per conversation in the route table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_failover_lands_above_the_floors_the_first_successor_took_over() {
    let margin = 100;
    let mut d = deploy(None).await;
    let routes = d.cluster.client().await;
    let second = cellmesh_tests::TestCell::start_routed("eu-west/c2", d.cluster.endpoints()).await;
    let alice = token(1, 10);
    let mut m = messaging(&d.edge).await;
    let (a, b) = (
        create_via_edge(&mut m, &alice, vec![11]).await,
        create_via_edge(&mut m, &alice, vec![11]).await,
    );
    for i in 0..20 {
        m.send(authed(text(a, &format!("a-{i}")), &alice))
            .await
            .unwrap();
    }
    for i in 0..5 {
        m.send(authed(text(b, &format!("b-{i}")), &alice))
            .await
            .unwrap();
    }
    wait_for_checkpoint(&routes, a, 20, Duration::from_secs(10)).await;
    wait_for_checkpoint(&routes, b, 5, Duration::from_secs(10)).await;
    assert_eq!(
        routes.read(|t| t.cell("eu-west/c1").unwrap().mark_holders.clone()),
        vec!["eu-west/c2".to_string(), "us-east/c1".to_string()]
    );

    let fail = |cell: &'static str| {
        let routes = routes.clone();
        async move {
            let plan = routes
                .read(|t| cellmesh_control_plane::failover::planner::plan_failover(t, cell, margin))
                .unwrap();
            cellmesh_control_plane::failover::execute(&routes, &plan.commands)
                .await
                .unwrap();
            plan.fallback
        }
    };
    let first = d.cells.remove(0);
    let _first_dir = first.stop().await;
    assert_eq!(fail("eu-west/c1").await, "eu-west/c2");
    let sent = loop {
        match m.send(authed(text(a, "after-first"), &alice)).await {
            Ok(r) => break r.into_inner().seq,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    assert_eq!(sent, floor_of(&routes, a).await + 1);
    assert!(sent > 20 + margin, "seq {sent}");
    // The successor pushes what it wrote and the floor of what it only
    // took over (b) to its own standbys, then lists them as holders.
    wait_for_checkpoint(&routes, a, sent, Duration::from_secs(10)).await;
    wait_for_checkpoint(&routes, b, 5 + margin, Duration::from_secs(10)).await;

    let _second_dir = second.stop().await;
    assert_eq!(fail("eu-west/c2").await, "us-east/c1");
    let floor_a = floor_of(&routes, a).await;
    let floor_b = floor_of(&routes, b).await;
    assert!(floor_a >= sent + margin, "a: floor {floor_a}, sent {sent}");
    // eu-west/c2 could have written b up to its floor plus the margin.
    assert!(floor_b >= 5 + 2 * margin, "b: floor {floor_b}");
    let again = loop {
        match m.send(authed(text(b, "after-second"), &alice)).await {
            Ok(r) => break r.into_inner().seq,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    assert_eq!(again, floor_b + 1);
    // Nothing per conversation in the table: cells and the tenant only.
    assert_eq!(routes.read(|t| t.routes.len()), 1);
}
