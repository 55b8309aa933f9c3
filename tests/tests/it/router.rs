//! The RoutingService as a 3-replica Raft group over real gRPC: leader
//! failover, catch-up by snapshot, linearizable reads, the watch stream
//! across reconnects, membership changes, validation and restarts.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::reason::Reason;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1::update_route::Transition;
use cellmesh_proto::v1::{self as pb, Consistency, ErrorCode};
use cellmesh_route_client::commands::*;
use cellmesh_route_client::convert::key_to_pb;
use cellmesh_route_client::table::Key;
use cellmesh_tests::eventually;
use cellmesh_tests::router::*;

async fn seed(client: &cellmesh_route_client::client::RouteClient) {
    for (id, region) in [
        ("eu-west/c1", "eu-west"),
        ("eu-west/c2", "eu-west"),
        ("us-east/c1", "us-east"),
    ] {
        client
            .apply(register_cell(id, region, &format!("http://{id}.invalid")))
            .await
            .expect("register cell");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_and_writes_continue() {
    let mut cluster = RouterCluster::start(3, |_| {}).await;
    let client = cluster.client().await;
    seed(&client).await;
    for t in 1..=20 {
        client
            .apply(assign_tenant(TenantId(t), "eu-west/c1", 0))
            .await
            .unwrap();
    }
    let old = cluster.leader().await;
    let killed_at = Instant::now();
    cluster.stop(old).await;
    // Writes fail over to the new leader through the same client.
    let mut t = 21;
    let first_ok = loop {
        match client
            .apply(assign_tenant(TenantId(t), "eu-west/c2", 0))
            .await
        {
            Ok(_) => break killed_at.elapsed(),
            // Unavailable, or the outcome is unknown (connection closed).
            Err(e) => assert!(
                [ErrorCode::RetryLater as i32, ErrorCode::Internal as i32]
                    .contains(&error_detail(&e).code),
                "{e}"
            ),
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(15),
            "no leader after 15 s"
        );
        t += 1;
    };
    println!("write gap after leader kill: {} ms", first_ok.as_millis());
    let new = cluster.leader().await;
    assert_ne!(new, old);
    for t in 100..110 {
        client
            .apply(assign_tenant(TenantId(t), "us-east/c1", 0))
            .await
            .unwrap();
    }
    // The old leader comes back as a follower with everything.
    cluster.restart(old).await;
    let want = cluster.running(new).store.table();
    let back = cluster.running(old).store.clone();
    assert!(
        eventually(Duration::from_secs(10), || {
            let ok = back.table().routes == want.routes;
            async move { ok }
        })
        .await
    );
    assert_eq!(
        client
            .resolve(&Key::conversation(TenantId(105), ConversationId(1)))
            .map(|r| r.entry.cell),
        Some("us-east/c1".to_string())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_missed_purged_log_catches_up_by_snapshot() {
    let mut cluster = RouterCluster::start(3, |c| {
        c.raft.snapshot_every = 20;
        c.raft.keep_logs_after_snapshot = 0;
    })
    .await;
    let client = cluster.client().await;
    seed(&client).await;
    let leader = cluster.leader().await;
    let lagging = (leader + 1) % 3;
    cluster.stop(lagging).await;
    for t in 1..=150 {
        client
            .apply(assign_tenant(TenantId(t), "eu-west/c1", 0))
            .await
            .unwrap();
    }
    let leader_raft = cluster.running(leader).raft.clone();
    assert!(
        eventually(Duration::from_secs(10), || {
            let purged = leader_raft.metrics().borrow().purged.map_or(0, |l| l.index);
            async move { purged > 100 }
        })
        .await,
        "the leader purged its log"
    );
    cluster.restart(lagging).await;
    let want = cluster.running(leader).store.table();
    let store = cluster.running(lagging).store.clone();
    assert!(
        eventually(Duration::from_secs(15), || {
            let ok = store.applied_index() >= want.applied;
            async move { ok }
        })
        .await,
        "the lagging replica caught up"
    );
    let m = cluster.running(lagging).raft.metrics().borrow().clone();
    assert!(
        m.snapshot.is_some_and(|s| s.index > 100),
        "installed a snapshot: {:?}",
        m.snapshot
    );
    let got = store.table();
    assert_eq!(got.routes, want.routes);
    assert_eq!(got.cells, want.cells);
    // Its lookups answer the same.
    let mut api = cluster.api(lagging).await;
    let r = api
        .resolve(pb::ResolveRequest {
            key: Some(key_to_pb(&Key::user(TenantId(150), UserId(9)))),
            consistency: Consistency::Stale as i32,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.route.unwrap().cell_id, "eu-west/c1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_linearizable_read_on_a_follower_sees_a_write_made_elsewhere() {
    let cluster = RouterCluster::start(3, |_| {}).await;
    let client = cluster.client().await;
    seed(&client).await;
    let leader = cluster.leader().await;
    let follower = (leader + 1) % 3;
    let mut on_leader = cluster.api(leader).await;
    let mut on_follower = cluster.api(follower).await;
    for t in 1..=20u64 {
        on_leader
            .apply(assign_tenant(TenantId(t), "us-east/c1", 0))
            .await
            .unwrap();
        let r = on_follower
            .resolve(pb::ResolveRequest {
                key: Some(key_to_pb(&Key::conversation(
                    TenantId(t),
                    ConversationId(77),
                ))),
                consistency: Consistency::Linearizable as i32,
            })
            .await
            .unwrap_or_else(|e| panic!("tenant {t}: {e}"))
            .into_inner();
        assert_eq!(r.route.unwrap().cell_id, "us-east/c1");
    }
    // A write sent to a follower is forwarded to the leader.
    let applied = on_follower
        .apply(assign_tenant(TenantId(500), "eu-west/c2", 0))
        .await
        .unwrap()
        .into_inner();
    assert!(applied.index > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_delivers_every_change_once_in_order_across_a_reconnect() {
    let mut cluster = RouterCluster::start(3, |_| {}).await;
    let leader = cluster.leader().await;
    let watched = (leader + 1) % 3;
    // The group's own first entry (the cluster version its first leader
    // writes) is in the watcher's first table, not among its changes:
    // nothing else is written until the watch has started.
    let writer = cluster.client().await;
    writer.cluster_version(Duration::from_secs(10)).await;
    // The client watches a follower first.
    let mut endpoints = cluster.endpoints();
    endpoints.rotate_left(watched);
    let client = cellmesh_route_client::client::RouteClient::connect(
        endpoints,
        cellmesh_proto::secret::ClusterSecret::new(SECRET),
    )
    .await
    .unwrap();
    assert!(
        client
            .wait_applied(writer.applied(), Duration::from_secs(10))
            .await
    );
    let mut changes = client.changes();
    let from = client.applied();
    seed(&writer).await;
    for t in 1..=30 {
        writer
            .apply(assign_tenant(TenantId(t), "eu-west/c1", 0))
            .await
            .unwrap();
    }
    cluster.stop(watched).await;
    for t in 31..=60 {
        writer
            .apply(assign_tenant(TenantId(t), "eu-west/c2", 0))
            .await
            .unwrap();
    }
    let last = writer
        .apply(assign_tenant(TenantId(61), "us-east/c1", 0))
        .await
        .unwrap()
        .index;
    assert!(
        client.wait_applied(last, Duration::from_secs(10)).await,
        "watch resumed"
    );
    let mut seen = Vec::new();
    while let Ok((index, batch)) = changes.try_recv() {
        seen.push((index, batch));
    }
    let indexes: Vec<u64> = seen.iter().map(|(i, _)| *i).collect();
    let expected: Vec<u64> = cluster
        .running(leader)
        .store
        .changes_from(0, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|(i, _)| i)
        .filter(|&i| i > from)
        .collect();
    assert_eq!(indexes, expected, "every change exactly once, in order");
    assert_eq!(
        client.read(|t| t.routes.clone()),
        cluster.running(leader).store.table().routes
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_grows_and_shrinks_and_a_restart_keeps_state() {
    let mut cluster = RouterCluster::start(3, |_| {}).await;
    let client = cluster.client().await;
    seed(&client).await;
    client
        .apply(assign_tenant(TenantId(1), "eu-west/c1", 0))
        .await
        .unwrap();
    // A fourth replica joins as a learner, is promoted, and one is removed.
    let dir = tempfile::tempdir().unwrap();
    let fourth = cellmesh_router::node::start(router_config(4, "eu-west", dir.path()))
        .await
        .unwrap();
    let mut api = cluster.api(0).await;
    api.add_learner(pb::AddLearnerRequest {
        node: Some(pb::RouterNode {
            node_id: 4,
            region: "eu-west".into(),
            raft_address: fourth.node.raft_addr.clone(),
            api_address: fourth.node.api_addr.clone(),
        }),
    })
    .await
    .unwrap();
    let fourth_store = fourth.store.clone();
    assert!(
        eventually(Duration::from_secs(10), || {
            let ok = fourth_store.table().routes.len() == 1;
            async move { ok }
        })
        .await
    );
    api.change_membership(pb::ChangeMembershipRequest {
        voters: vec![1, 2, 4],
    })
    .await
    .unwrap();
    let status = api
        .status(pb::RouterStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    let voters: BTreeSet<u64> = status.voters.iter().map(|n| n.node_id).collect();
    assert_eq!(voters, BTreeSet::from([1, 2, 4]));
    let err = api
        .change_membership(pb::ChangeMembershipRequest { voters: vec![] })
        .await
        .unwrap_err();
    assert_eq!(error_detail(&err).code, ErrorCode::InvalidArgument as i32);

    // Every replica restarts and the table is still there.
    for i in 0..3 {
        cluster.stop(i).await;
    }
    for i in 0..3 {
        cluster.restart(i).await;
    }
    cluster.leader().await;
    let store = cluster.running(0).store.clone();
    assert_eq!(
        store.read(|t| t
            .resolve(&Key::conversation(TenantId(1), ConversationId(5)))
            .map(|r| r.entry.cell)),
        Some("eu-west/c1".to_string())
    );
    fourth.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_share_log_entries_and_each_gets_its_own_answer() {
    let cluster = RouterCluster::start(3, |_| {}).await;
    let client = cluster.client().await;
    seed(&client).await;
    // 64 writes at once: every eighth names an unknown cell, and tenant
    // 500 is placed twice at epoch 0 (only one may win).
    let writes = (0..64u64).map(|i| {
        let client = client.clone();
        async move {
            let (tenant, cell) = match i {
                62 | 63 => (500, "eu-west/c2"),
                i if i % 8 == 0 => (100 + i, "eu-west/c9"),
                i => (100 + i, "eu-west/c1"),
            };
            (
                i,
                tenant,
                client.apply(assign_tenant(TenantId(tenant), cell, 0)).await,
            )
        }
    });
    let answers = futures::future::join_all(writes).await;
    let mut indexes = BTreeSet::new();
    let mut placed = Vec::new();
    let mut twice = Vec::new();
    for (i, tenant, answer) in answers {
        match (i, answer) {
            (62 | 63, answer) => twice.push(answer),
            (i, Err(e)) if i % 8 == 0 => {
                assert_eq!(error_detail(&e).reason, Reason::UnknownCell.as_str())
            }
            (i, Ok(r)) if i % 8 != 0 => {
                indexes.insert(r.index);
                placed.push((tenant, r.index));
            }
            (i, answer) => panic!("write {i}: {answer:?}"),
        }
    }
    let won: Vec<_> = twice.iter().filter_map(|a| a.as_ref().ok()).collect();
    assert_eq!(won.len(), 1, "tenant 500 placed once: {twice:?}");
    assert!(
        twice
            .iter()
            .filter_map(|a| a.as_ref().err())
            .all(|e| error_detail(e).reason == Reason::StaleEpoch.as_str()),
        "{twice:?}"
    );
    assert_eq!(placed.len(), 54);
    assert!(
        indexes.len() < placed.len(),
        "writes proposed together share an entry: {} entries for {} writes",
        indexes.len(),
        placed.len()
    );
    // Each placement holds the index it was answered with, on every
    // follower of the table.
    let last = indexes.iter().max().copied().unwrap().max(won[0].index);
    assert!(client.wait_applied(last, Duration::from_secs(10)).await);
    for (tenant, index) in placed {
        let epoch = client.read(|t| t.entry(&Key::tenant(TenantId(tenant))).map(|e| e.epoch));
        assert_eq!(epoch, Some(index), "tenant {tenant}");
    }
    let cell = client.read(|t| t.entry(&Key::tenant(TenantId(500))).map(|e| e.cell.clone()));
    assert_eq!(cell.as_deref(), Some("eu-west/c2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_writes_get_stable_codes_and_calls_need_the_secret() {
    let cluster = RouterCluster::start(3, |_| {}).await;
    let client = cluster.client().await;
    seed(&client).await;
    let e = client
        .apply(assign_tenant(TenantId(1), "eu-west/c9", 0))
        .await
        .unwrap_err();
    let d = error_detail(&e);
    assert_eq!(
        (d.code, d.reason.as_str()),
        (ErrorCode::NotFound as i32, Reason::UnknownCell.as_str())
    );
    let placed = client
        .apply(assign_tenant(TenantId(1), "eu-west/c1", 0))
        .await
        .unwrap();
    let e = client
        .apply(assign_tenant(TenantId(1), "eu-west/c2", placed.index - 1))
        .await
        .unwrap_err();
    assert_eq!(error_detail(&e).reason, Reason::StaleEpoch.as_str());
    let e = client
        .apply(update_route(
            &Key::conversation(TenantId(1), ConversationId(2)),
            placed.index,
            Transition::Freeze(true),
        ))
        .await
        .unwrap_err();
    assert_eq!(error_detail(&e).reason, Reason::IllegalTransition.as_str());
    let e = client
        .apply(pb::RouteCommand { command: None })
        .await
        .unwrap_err();
    assert_eq!(error_detail(&e).code, ErrorCode::InvalidArgument as i32);
    let e = client
        .apply(register_cell("nope", "eu-west", "http://x"))
        .await
        .unwrap_err();
    assert_eq!(error_detail(&e).code, ErrorCode::InvalidArgument as i32);
    // Without the deployment secret nothing is served.
    let mut bare = pb::routing_client::RoutingClient::connect(cluster.endpoint(0))
        .await
        .unwrap();
    let e = bare
        .get_table(pb::GetTableRequest::default())
        .await
        .unwrap_err();
    assert_eq!(error_detail(&e).code, ErrorCode::Unauthenticated as i32);
    // The table is unchanged by all of the above.
    let table = cluster.running(0).store.table();
    assert_eq!(table.routes.len(), 1);
    assert_eq!(table.cells.len(), 3);
}

/// Owner leases are renewed with linearizable lookups: one that reaches a
/// replica that has stopped answering (a hung leader) moves on to the
/// others within a fraction of a lease instead of waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_passes_over_a_replica_that_does_not_answer() {
    let cluster = RouterCluster::start(3, |_| {}).await;
    let leader = cluster.leader().await;
    let setup = cluster.client().await;
    seed(&setup).await;
    setup
        .apply(assign_tenant(TenantId(1), "eu-west/c1", 0))
        .await
        .unwrap();
    // The client reaches the leader through a link that can hang.
    let upstream = cluster.replicas[leader].config.api_listen;
    let link = cellmesh_chaos::proxy::FaultProxy::start("127.0.0.1:0".parse().unwrap(), upstream)
        .await
        .unwrap();
    let mut endpoints = vec![format!("http://{}", link.addr())];
    endpoints.extend((0..3).filter(|&i| i != leader).map(|i| cluster.endpoint(i)));
    let endpoints_again = endpoints.clone();
    let client = cellmesh_route_client::client::RouteClient::connect(
        endpoints,
        cellmesh_proto::secret::ClusterSecret::new(SECRET),
    )
    .await
    .unwrap();
    client
        .resolve_linearizable(&Key::tenant(TenantId(1)))
        .await
        .unwrap();
    // Connected while the link answers: it prefers the (linked) leader.
    let fresh = cellmesh_route_client::client::RouteClient::connect(
        endpoints_again,
        cellmesh_proto::secret::ClusterSecret::new(SECRET),
    )
    .await
    .unwrap();
    link.partition(true, true);
    let started = Instant::now();
    let answer = client.resolve_linearizable(&Key::tenant(TenantId(1))).await;
    let took = started.elapsed();
    assert!(answer.is_ok(), "{answer:?}");
    assert!(
        took < Duration::from_millis(1_500),
        "the lookup waited {took:?} on the silent replica"
    );
    // A lease renewal asks every replica at once: the silent one, which
    // that client prefers, is not waited for at all.
    let started = Instant::now();
    let answer = fresh
        .resolve_linearizable_any(&Key::tenant(TenantId(1)))
        .await;
    let took = started.elapsed();
    assert!(answer.is_ok(), "{answer:?}");
    assert!(
        took < Duration::from_millis(300),
        "the renewal lookup waited {took:?} on the silent replica"
    );
}

/// Raft messages are taken only from the group's members: a vote or
/// entries from an invented node are refused, and the group keeps its
/// leader and term; a member's stale vote is still answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_messages_from_a_node_outside_the_group_are_refused() {
    use cellmesh_proto::raft::v1 as raft;
    let cluster = RouterCluster::start(3, |_| {}).await;
    let leader = cluster.leader().await;
    let follower = (leader + 1) % 3;
    // A replica that knows no membership yet takes the first sender (one
    // being added does): probe once the follower knows the group.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while cluster
        .running(follower)
        .raft
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .nodes()
        .count()
        < 3
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the follower never learnt the group"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = cluster.running(follower).raft.metrics().borrow().clone();
    let channel = tonic::transport::Channel::from_shared(format!(
        "http://{}",
        cluster.running(follower).raft_addr
    ))
    .unwrap()
    .connect()
    .await
    .unwrap();
    let mut peer = raft::raft_peer_client::RaftPeerClient::with_interceptor(
        channel,
        SecretInterceptor(cellmesh_proto::secret::ClusterSecret::new(SECRET)),
    );
    let intruder = raft::Vote {
        term: before.current_term + 5,
        node_id: 99,
        committed: false,
    };
    let far = raft::LogId {
        term: before.current_term + 5,
        node_id: 99,
        index: 1_000_000,
    };
    let e = peer
        .vote(raft::VoteRequest {
            vote: Some(intruder),
            last_log_id: Some(far),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let e = peer
        .append_entries(raft::AppendEntriesRequest {
            vote: Some(raft::Vote {
                committed: true,
                ..intruder
            }),
            prev_log_id: None,
            entries: vec![],
            leader_commit: Some(far),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    // A member's vote for a past term is answered (not granted).
    let member = cluster.running(leader).node_id;
    let answer = peer
        .vote(raft::VoteRequest {
            vote: Some(raft::Vote {
                term: 0,
                node_id: member,
                committed: false,
            }),
            last_log_id: None,
        })
        .await
        .expect("a member is answered")
        .into_inner();
    assert!(!answer.vote_granted);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = cluster.running(follower).raft.metrics().borrow().clone();
    assert_eq!(
        after.current_term, before.current_term,
        "the term is unchanged"
    );
    assert_eq!(after.current_leader, before.current_leader);
    assert_eq!(cluster.leader().await, leader, "the leader stays");
}

/// A replica lost with its disk comes back as a new member on the old
/// member's address: the leader must neither take the newcomer's empty log
/// for the lost member's (it would panic on the "reverted" log, or count
/// entries the lost member acknowledged as gone) nor stop serving; the new
/// member joins as a learner and replaces the lost one among the voters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_member_on_a_lost_members_address_is_not_taken_for_it() {
    let mut cluster = RouterCluster::start(3, |_| {}).await;
    let client = cluster.client().await;
    seed(&client).await;
    for t in 1..=10 {
        client
            .apply(assign_tenant(TenantId(t), "eu-west/c1", 0))
            .await
            .unwrap();
    }
    let leader = cluster.leader().await;
    let lost = (leader + 1) % 3;
    let lost_id = cluster.running(lost).node_id;
    let address = cluster.replicas[lost].config.raft_listen;
    cluster.stop(lost).await;

    let dir = tempfile::tempdir().unwrap();
    let mut config = router_config(4, REGIONS[lost], dir.path());
    config.raft_listen = address;
    let mut newcomer = None;
    for _ in 0..100 {
        match cellmesh_router::node::start(config.clone()).await {
            Ok(r) => {
                newcomer = Some(r);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let newcomer = newcomer.expect("the new member binds the lost one's address");
    // The leader keeps replicating to the lost member's address for a while.
    for t in 11..=20 {
        client
            .apply(assign_tenant(TenantId(t), "eu-west/c1", 0))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        newcomer.store.table().routes.is_empty(),
        "not fed as the lost member"
    );

    let mut api = cluster.api(leader).await;
    api.add_learner(pb::AddLearnerRequest {
        node: Some(pb::RouterNode {
            node_id: 4,
            region: REGIONS[lost].into(),
            raft_address: newcomer.node.raft_addr.clone(),
            api_address: newcomer.node.api_addr.clone(),
        }),
    })
    .await
    .unwrap();
    let voters: Vec<u64> = (1..=3).filter(|id| *id != lost_id).chain([4]).collect();
    api.change_membership(pb::ChangeMembershipRequest {
        voters: voters.clone(),
    })
    .await
    .unwrap();
    client
        .apply(assign_tenant(TenantId(21), "eu-west/c1", 0))
        .await
        .unwrap();
    let store = newcomer.store.clone();
    assert!(
        eventually(Duration::from_secs(10), || {
            let ok = store.table().routes.len() == 21;
            async move { ok }
        })
        .await,
        "the new member holds every route"
    );
    let status = api
        .status(pb::RouterStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    let got: BTreeSet<u64> = status.voters.iter().map(|n| n.node_id).collect();
    assert_eq!(got, voters.into_iter().collect());
}

/// A tenant bound to a region over the API: the binding is in its route,
/// a placement elsewhere is refused with `RESIDENCY_VIOLATION` on every
/// replica's answer, and unbinding lifts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_bound_to_a_region_is_refused_a_cell_outside_it() {
    let cluster = RouterCluster::start(3, |_| {}).await;
    let client = cluster.client().await;
    seed(&client).await;
    // A cluster this release forms writes its version after its first
    // election: binding waits for it.
    assert_eq!(
        client.cluster_version(Duration::from_secs(10)).await,
        cellmesh_proto::version::BINARY
    );
    let tenant = TenantId(7);
    let placed = client
        .apply(assign_tenant(tenant, "eu-west/c1", 0))
        .await
        .unwrap();
    let bound = client
        .apply(set_tenant_regions(
            tenant,
            &["eu-west".into()],
            placed.index,
        ))
        .await
        .unwrap();
    assert!(
        client
            .wait_applied(bound.index, Duration::from_secs(5))
            .await
    );
    let route = client.resolve(&Key::tenant(tenant)).unwrap();
    assert_eq!(route.entry.regions, ["eu-west".to_string()]);
    let refused = client
        .apply(assign_tenant(tenant, "us-east/c1", bound.index))
        .await
        .unwrap_err();
    let detail = error_detail(&refused);
    assert_eq!(detail.reason, Reason::ResidencyViolation, "{refused:?}");
    assert_eq!(detail.code, ErrorCode::PermissionDenied as i32);
    // Within the region it moves; unbound, anywhere.
    let moved = client
        .apply(assign_tenant(tenant, "eu-west/c2", bound.index))
        .await
        .unwrap();
    let unbound = client
        .apply(set_tenant_regions(tenant, &[], moved.index))
        .await
        .unwrap();
    client
        .apply(assign_tenant(tenant, "us-east/c1", unbound.index))
        .await
        .unwrap();
}
