//! Search over real gRPC and real indexes on temp dirs: every caller finds
//! exactly the matching messages `Pull` shows them (non-members, removed
//! members, later joiners, directed messages, delete-for-me, recalls, edits
//! and other tenants each checked against `Pull`); Chinese, Japanese and
//! accented Latin text is found; a restart mid-indexing neither loses nor
//! duplicates; cold history stays searchable; through the edge a caller's
//! conversations on two cells are searched and paged as one, after a move.

use cellmesh_proto::ids::{ConversationId, TenantId};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use cellmesh_cell::clock::SystemClock;
use cellmesh_proto::reason::Reason;
use cellmesh_proto::v1::*;
use cellmesh_tests::deploy::{assert_reason, authed, create_via_edge, messaging, migrator, token};
use cellmesh_tests::{Client, TestCell, caller, create_group, eventually, pull_all, text};

const T: u64 = 1;

fn query(tenant: u64, user: u64, conversations: &[u64], q: &str) -> SearchRequest {
    SearchRequest {
        caller: caller(tenant, user),
        query: q.into(),
        conversation_ids: conversations.to_vec(),
        page_size: 100,
        ..Default::default()
    }
}

/// Every hit of `request`, page after page (a cell pages by msg_id).
async fn search_all(c: &mut Client, mut request: SearchRequest) -> Vec<Message> {
    let mut out = Vec::new();
    loop {
        let page = c
            .search(request.clone())
            .await
            .expect("search")
            .into_inner();
        out.extend(page.hits.into_iter().filter_map(|h| h.message));
        if page.examined_down_to == 0 {
            return out;
        }
        // Everything at or above it was examined.
        request.before_msg_id = page.examined_down_to;
    }
}

fn keys(messages: &[Message]) -> BTreeSet<(u64, u64)> {
    messages
        .iter()
        .map(|m| (m.conversation_id, m.seq))
        .collect()
}

/// What `user` should find for `word`: the messages `Pull` shows them
/// whose text holds it.
async fn expected(
    c: &mut Client,
    user: u64,
    conversations: &[u64],
    word: &str,
) -> BTreeSet<(u64, u64)> {
    let mut out = BTreeSet::new();
    for &conv in conversations {
        let Ok(page) = c
            .pull(PullRequest {
                caller: caller(T, user),
                conversation_id: conv,
                direction: Direction::Forward as i32,
                limit: 500,
                ..Default::default()
            })
            .await
        else {
            continue; // not a member: Pull shows nothing
        };
        for m in page.into_inner().messages {
            if m.state != MessageState::Recalled as i32
                && String::from_utf8_lossy(&m.body)
                    .to_lowercase()
                    .contains(word)
            {
                out.insert((m.conversation_id, m.seq));
            }
        }
    }
    out
}

async fn send(c: &mut Client, user: u64, conv: u64, id: &str, body: &str) -> u64 {
    c.send(text(T, user, conv, id, body))
        .await
        .unwrap()
        .into_inner()
        .seq
}

async fn until_found(c: &mut Client, request: SearchRequest, n: usize) {
    let found = eventually(Duration::from_secs(10), || {
        let (mut c, r) = (c.clone(), request.clone());
        async move { search_all(&mut c, r).await.len() >= n }
    })
    .await;
    assert!(
        found,
        "{:?} did not find {n} messages in time",
        request.query
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_caller_finds_exactly_what_pull_shows_them() {
    let cell = TestCell::start().await;
    let mut c = cell.client().await;
    // 10 writes; 11, 12 members; 13 never a member; 14 joins later; 15 is
    // removed from `b` before its message there.
    let a = create_group(&mut c, T, 10, &[11, 12]).await;
    let b = create_group(&mut c, T, 10, &[15]).await;
    let convs = [a, b];
    send(&mut c, 10, a, "r1", "Quarterly budget review").await;
    let mut directed = text(T, 10, a, "r2", "budget numbers for bob only");
    directed.visible_to = vec![11];
    c.send(directed).await.unwrap();
    let hidden = send(&mut c, 10, a, "r3", "budget draft to hide").await;
    let recalled = send(&mut c, 10, a, "r4", "budget sent by mistake").await;
    let edited = send(&mut c, 10, a, "r5", "budget typo").await;
    c.remove_members(ChangeMembersRequest {
        caller: caller(T, 10),
        conversation_id: b,
        user_ids: vec![15],
    })
    .await
    .unwrap();
    send(&mut c, 10, b, "r6", "budget after the removal").await;
    c.add_members(ChangeMembersRequest {
        caller: caller(T, 10),
        conversation_id: a,
        user_ids: vec![14],
    })
    .await
    .unwrap();
    c.delete_for_me(DeleteForMeRequest {
        caller: caller(T, 12),
        conversation_id: a,
        seqs: vec![hidden],
    })
    .await
    .unwrap();
    c.recall(RecallRequest {
        caller: caller(T, 10),
        conversation_id: a,
        seq: recalled,
    })
    .await
    .unwrap();
    c.edit(EditRequest {
        caller: caller(T, 10),
        conversation_id: a,
        seq: edited,
        body: b"forecast, corrected".to_vec(),
    })
    .await
    .unwrap();
    send(&mut c, 11, a, "zh", "我们明天开会讨论预算").await;
    send(&mut c, 11, a, "ja", "東京で会議があります").await;
    send(&mut c, 11, a, "fr", "Réunion au café à Zürich").await;
    // The writer's view: the edit and the recall have reached the index.
    until_found(&mut c, query(T, 10, &convs, "forecast"), 1).await;
    let budget = query(T, 10, &convs, "budget");
    let seen = eventually(Duration::from_secs(10), || {
        let mut c = c.clone();
        let r = budget.clone();
        async move { search_all(&mut c, r).await.len() == 4 }
    })
    .await;
    assert!(seen, "the recall and the edit did not reach the index");

    for user in [10, 11, 12, 13, 14, 15] {
        let found = search_all(&mut c, query(T, user, &convs, "budget")).await;
        let want = expected(&mut c, user, &convs, "budget").await;
        assert_eq!(keys(&found), want, "user {user}");
        assert_eq!(found.len(), want.len(), "user {user}: a hit twice");
    }
    // Spelled out, so a wrong `expected` cannot hide a leak.
    let count = |user| {
        let mut c = c.clone();
        async move {
            search_all(&mut c, query(T, user, &convs, "budget"))
                .await
                .len()
        }
    };
    assert_eq!(count(10).await, 4); // r1, r2, r3, r6
    assert_eq!(count(11).await, 3); // r1, r2 (directed to 11), r3
    assert_eq!(count(12).await, 1); // r1 (r3 deleted for 12)
    assert_eq!(count(13).await, 0);
    assert_eq!(count(14).await, 2); // Pull shows history to later joiners
    assert_eq!(count(15).await, 0);
    // Another tenant's user with the same id, naming the same conversations.
    let other = search_all(&mut c, query(2, 10, &convs, "budget")).await;
    assert!(other.is_empty(), "{other:?}");

    // Languages: Chinese words, Japanese and folded Latin text.
    for (q, body) in [
        ("预算", "我们明天开会讨论预算"),
        ("会議", "東京で会議があります"),
        ("東京", "東京で会議があります"),
        ("cafe zurich", "Réunion au café à Zürich"),
        ("\"au café\"", "Réunion au café à Zürich"),
        ("QUARTERLY", "Quarterly budget review"),
    ] {
        let hits = search_all(&mut c, query(T, 12, &convs, q)).await;
        let bodies: Vec<_> = hits
            .iter()
            .map(|m| String::from_utf8_lossy(&m.body).into_owned())
            .collect();
        assert_eq!(bodies, [body], "query {q}");
    }
    // A phrase is words in order, not anywhere.
    assert!(
        search_all(&mut c, query(T, 12, &convs, "\"review budget\""))
            .await
            .is_empty()
    );

    // A hit carries its snippet and, on request, its neighbours as Pull
    // shows them to the caller.
    let mut r = query(T, 12, &convs, "quarterly");
    r.context = 2;
    let hit = c.search(r).await.unwrap().into_inner().hits.remove(0);
    assert!(hit.snippet.contains("Quarterly"), "{}", hit.snippet);
    let h = &hit.highlights[0];
    assert_eq!(&hit.snippet[h.start as usize..h.end as usize], "Quarterly");
    assert!(hit.before.is_empty());
    let after: Vec<u64> = hit.after.iter().map(|m| m.seq).collect();
    assert_eq!(after, [hidden + 1, hidden + 2], "12 does not see r2 or r3");

    // One conversation by name: errors as Pull's.
    let mut r = query(T, 13, &[], "budget");
    r.conversation_id = a;
    let e = c.search(r).await.unwrap_err();
    assert_reason(&e, ErrorCode::PermissionDenied, Reason::NotAMember.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_queries_get_stable_reasons() {
    let cell = TestCell::start().await;
    let mut c = cell.client().await;
    let a = create_group(&mut c, T, 10, &[11]).await;
    let bad = |q: &str, page: u32, context: u32| SearchRequest {
        page_size: page,
        context,
        ..query(T, 10, &[a], q)
    };
    for r in [
        bad("", 10, 0),
        bad(&"x".repeat(513), 10, 0),
        bad("budget", 101, 0),
        bad("budget", 10, 21),
        bad("nosuchfield:budget", 10, 0),
    ] {
        let e = c.search(r.clone()).await.unwrap_err();
        assert_reason(
            &e,
            ErrorCode::InvalidArgument,
            Reason::SearchQueryInvalid.as_str(),
        );
    }
    // An end-to-end encrypted tenant has no server-side search.
    let e2e = TestCell::start_with(
        |c| {
            c.search.tenants.push(cellmesh_cell::search::TenantSearch {
                tenant: TenantId(T),
                language: None,
                end_to_end_encrypted: true,
            })
        },
        Arc::new(SystemClock),
    )
    .await;
    let mut c = e2e.client().await;
    let a = create_group(&mut c, T, 10, &[11]).await;
    let e = c.search(query(T, 10, &[a], "x")).await.unwrap_err();
    assert_reason(
        &e,
        ErrorCode::PermissionDenied,
        Reason::SearchDisabled.as_str(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_indexing_neither_loses_nor_duplicates_hits() {
    restart_mid_indexing(|_| {}, true).await;
}

/// The indexer fails between its index commit and its queue position (a
/// crash between the two): the same events come again, and each message
/// is found once, those sent after it recovered too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_that_come_again_after_the_index_committed_are_found_once() {
    let fast = |c: &mut cellmesh_cell::CellConfig| c.search.commit_interval_ms = 100;
    let cell = TestCell::start_with(fast, Arc::new(SystemClock)).await;
    let store = cell.cell.service.store();
    let points = cellmesh_cell::failpoints::parse("search.indexed=error").unwrap();
    store.failpoints().set(points);
    let mut c = cell.client().await;
    let a = create_group(&mut c, T, 10, &[11]).await;
    for i in 0..40 {
        send(&mut c, 10, a, &format!("b{i}"), &format!("bravo {i}")).await;
    }
    // Committed to the index (and so found), never to the queue.
    until_found(&mut c, query(T, 11, &[a], "bravo"), 40).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    store.failpoints().set(Vec::new());
    for i in 40..60 {
        send(&mut c, 10, a, &format!("b{i}"), &format!("bravo {i}")).await;
    }
    until_found(&mut c, query(T, 11, &[a], "bravo"), 60).await;
    let hits = search_all(&mut c, query(T, 11, &[a], "bravo")).await;
    let seqs: Vec<u64> = hits.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, (1..=60).rev().collect::<Vec<_>>(), "each once");
}

/// On Kafka the indexer is a consumer group of its own beside the
/// processor's. (Without the restart: librdkafka's mock cluster aborts on
/// a restarted process rejoining two classic groups.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_the_indexer_finds_every_message_once() {
    let kafka = cellmesh_tests::backends::Kafka::start(1);
    restart_mid_indexing(|c| kafka.configure(c), false).await;
}

async fn restart_mid_indexing(queue: impl Fn(&mut cellmesh_cell::CellConfig), restart: bool) {
    let tiny = |c: &mut cellmesh_cell::CellConfig| {
        queue(c);
        c.search.commit_interval_ms = 200;
        c.tiering.enabled = true;
        c.tiering.hot_messages_per_conversation = 20;
        c.tiering.segment_max_messages = 100;
    };
    let cell = TestCell::start_with(tiny, Arc::new(SystemClock)).await;
    let mut c = cell.client().await;
    let a = create_group(&mut c, T, 10, &[11]).await;
    for i in 0..300 {
        send(
            &mut c,
            10,
            a,
            &format!("r{i}"),
            &format!("alpha number {i}"),
        )
        .await;
    }
    // Stopped while the indexer is still at it.
    let cell = match restart {
        true => TestCell::start_in(cell.stop().await, tiny, Arc::new(SystemClock)).await,
        false => cell,
    };
    let mut c = cell.client().await;
    until_found(&mut c, query(T, 11, &[a], "alpha"), 300).await;
    let hits = search_all(&mut c, query(T, 11, &[a], "alpha")).await;
    let seqs: Vec<u64> = hits.iter().map(|m| m.seq).collect();
    assert_eq!(
        seqs,
        (1..=300).rev().collect::<Vec<_>>(),
        "each once, newest first"
    );

    // Tiered history stays searchable, its hits read from the cold tier.
    let report = cell.cell.service.tier_once().await.unwrap();
    assert!(report.messages_tiered >= 200, "{report:?}");
    let hits = search_all(&mut c, query(T, 11, &[a], "\"number 7\"")).await;
    assert_eq!(hits.iter().map(|m| m.seq).collect::<Vec<_>>(), [8]);
    assert_eq!(hits[0].body, b"alpha number 7");
    let history = pull_all(&mut c, T, 11, a).await;
    assert_eq!(history.len(), 300);
}

fn edge_query(q: &str, page: u32) -> SearchRequest {
    SearchRequest {
        query: q.into(),
        page_size: page,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_edge_a_callers_conversations_on_two_cells_page_as_one() {
    let d = cellmesh_tests::deploy::deploy(None).await;
    let mut m = messaging(&d.edge).await;
    let (alice, bob) = (token(1, 10), token(1, 11));
    let stays = create_via_edge(&mut m, &alice, vec![11]).await;
    let moves = create_via_edge(&mut m, &alice, vec![11]).await;
    for i in 0..3 {
        for conv in [stays, moves] {
            let r = cellmesh_tests::deploy::text(conv, &format!("roadmap item {i} in {conv}"));
            m.send(authed(
                SendRequest {
                    body: format!("roadmap item {i}").into_bytes(),
                    ..r
                },
                &alice,
            ))
            .await
            .unwrap();
        }
    }
    let routes = d.cluster.client().await;
    migrator(&routes)
        .migrate_conversation(TenantId(1), ConversationId(moves), "us-east/c1", |_| {})
        .await
        .expect("the conversation moves");
    // Bob's six hits: three from each cell, found on the target after the
    // move, newest first, two to a page, none twice.
    let mut all = Vec::new();
    let found = eventually(Duration::from_secs(15), || {
        let mut m = m.clone();
        let bob = bob.clone();
        async move {
            let r = m
                .search(authed(edge_query("roadmap", 100), &bob))
                .await
                .unwrap()
                .into_inner();
            r.hits.len() == 6 && !r.partial
        }
    })
    .await;
    assert!(
        found,
        "the moved conversation's messages were not found on its new cell"
    );
    let mut request = edge_query("roadmap", 2);
    loop {
        let page = m
            .search(authed(request.clone(), &bob))
            .await
            .unwrap()
            .into_inner();
        assert!(page.hits.len() <= 2);
        all.extend(page.hits.into_iter().filter_map(|h| h.message));
        if page.next_cursor.is_empty() {
            break;
        }
        request.cursor = page.next_cursor;
    }
    let ids: Vec<u64> = all.iter().map(|m| m.msg_id).collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    sorted.dedup();
    assert_eq!(ids, sorted, "newest first, none twice");
    assert_eq!(all.len(), 6);
    let convs: BTreeSet<u64> = all.iter().map(|m| m.conversation_id).collect();
    assert_eq!(convs, [stays, moves].into_iter().collect());

    // A cursor is its caller's.
    let page = m
        .search(authed(edge_query("roadmap", 1), &bob))
        .await
        .unwrap()
        .into_inner();
    let mut stolen = edge_query("roadmap", 1);
    stolen.cursor = page.next_cursor;
    let e = m.search(authed(stolen, &alice)).await.unwrap_err();
    assert_reason(
        &e,
        ErrorCode::InvalidArgument,
        Reason::SearchCursorInvalid.as_str(),
    );
    // The source drops the moved history after its grace, from the index
    // too: only the conversation that stayed is left there.
    let source = &d.cells[0].cell.service;
    assert_eq!(source.clean_moved(Duration::ZERO).await.unwrap(), 1);
    let index = source
        .search_indexes()
        .unwrap()
        .tenant(TenantId(1))
        .unwrap();
    let dropped = eventually(Duration::from_secs(10), || {
        let index = index.clone();
        async move { index.num_docs() == 3 }
    })
    .await;
    assert!(
        dropped,
        "the source's index kept {} documents",
        index.num_docs()
    );
    // One conversation by name goes to its owner only.
    let mut one = edge_query("roadmap", 10);
    one.conversation_id = moves;
    let r = m.search(authed(one, &bob)).await.unwrap().into_inner();
    assert_eq!(r.hits.len(), 3);

    // The whole tenant moves (with Bob's home): all six found on the target.
    migrator(&routes)
        .migrate_tenant(TenantId(1), "us-east/c1", 4, |_| {})
        .await
        .expect("the tenant moves");
    let moved = eventually(Duration::from_secs(15), || {
        let (mut m, bob) = (m.clone(), bob.clone());
        async move {
            let r = m
                .search(authed(edge_query("roadmap", 100), &bob))
                .await
                .unwrap()
                .into_inner();
            r.hits.len() == 6 && !r.partial
        }
    })
    .await;
    assert!(moved, "search after the tenant move");
    let _ = d.cluster;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_sent_before_search_was_enabled_is_indexed_once_it_is() {
    let off = |c: &mut cellmesh_cell::CellConfig| c.search.enabled = false;
    let cell = TestCell::start_with(off, Arc::new(SystemClock)).await;
    let mut c = cell.client().await;
    let a = create_group(&mut c, T, 10, &[11]).await;
    for i in 0..120 {
        send(&mut c, 10, a, &format!("r{i}"), &format!("legacy note {i}")).await;
    }
    let e = c.search(query(T, 11, &[a], "legacy")).await.unwrap_err();
    assert_reason(
        &e,
        ErrorCode::RetryLater,
        Reason::SearchUnavailable.as_str(),
    );
    let dir = cell.stop().await;
    let cell = TestCell::start_in(dir, |_| {}, Arc::new(SystemClock)).await;
    let mut c = cell.client().await;
    until_found(&mut c, query(T, 11, &[a], "legacy"), 120).await;
    assert_eq!(
        search_all(&mut c, query(T, 11, &[a], "legacy")).await.len(),
        120
    );
}

/// An asynchronous standby takes over without the history below the
/// floor: its answers say they are partial until the backfill brings it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_search_is_partial_until_the_backfill_then_complete() {
    use super::exactly_once::{FAILED, fail_first_cell, failover_deployment_with, send_before};
    use cellmesh_tests::deploy::{wait_for_backfill, wait_for_checkpoint};

    let (mut d, routes, cp, alice, mut m, conv) = failover_deployment_with(|_| {}).await;
    let answers = send_before(&mut m, &alice, conv, 10).await;
    wait_for_checkpoint(&routes, conv, answers[9].seq, Duration::from_secs(10)).await;
    let dir = fail_first_cell(&mut d, conv).await;
    m.send(authed(
        cellmesh_tests::deploy::text(conv, "before-new"),
        &alice,
    ))
    .await
    .unwrap();
    let request = SearchRequest {
        query: "before".into(),
        conversation_id: conv,
        page_size: 100,
        ..Default::default()
    };
    let search = |m: &mut cellmesh_proto::v1::messaging_client::MessagingClient<_>| {
        let (r, alice) = (request.clone(), alice.clone());
        let mut m = m.clone();
        async move { m.search(authed(r, &alice)).await.unwrap().into_inner() }
    };
    // The new message is found on the new owner; the answer is partial.
    let partial = eventually(Duration::from_secs(10), || {
        let s = search(&mut m);
        async move {
            let r = s.await;
            r.hits.len() == 1 && r.partial && r.unsearched == [conv]
        }
    })
    .await;
    assert!(partial, "{:?}", search(&mut m).await);

    let _returned = TestCell::start_routed_in(FAILED, d.cluster.endpoints(), dir).await;
    wait_for_backfill(&cp, FAILED, Duration::from_secs(20)).await;
    let complete = eventually(Duration::from_secs(10), || {
        let s = search(&mut m);
        async move {
            let r = s.await;
            r.hits.len() == 11 && !r.partial
        }
    })
    .await;
    assert!(complete, "{:?}", search(&mut m).await);
    cp.stop();
}
