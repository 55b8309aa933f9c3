//! Send: idempotency under concurrent repeats, gapless ordering under
//! concurrent senders, group commit, rate limits.

use cellmesh_proto::reason::Reason;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use cellmesh_cell::clock::SystemClock;
use cellmesh_proto::status::{error_code, error_detail};
use cellmesh_proto::v1::{Direction, ErrorCode};
use cellmesh_tests::*;

const TENANT: u64 = 7;

#[tokio::test]
async fn fifty_concurrent_repeats_create_one_message() {
    let cell = TestCell::start().await;
    let mut client = cell.client().await;
    let conv = create_group(&mut client, TENANT, 1, &[2]).await;

    let sends = (0..50).map(|_| {
        let mut c = client.clone();
        async move { c.send(text(TENANT, 1, conv, "same-id", "hello")).await }
    });
    let responses: Vec<_> = futures::future::join_all(sends)
        .await
        .into_iter()
        .map(|r| r.expect("every repeat succeeds").into_inner())
        .collect();
    let first = &responses[0];
    for r in &responses {
        assert_eq!((r.msg_id, r.seq), (first.msg_id, first.seq));
    }
    assert_eq!(responses.iter().filter(|r| !r.duplicate).count(), 1);

    // A later repeat is answered from storage.
    let later = client
        .send(text(TENANT, 1, conv, "same-id", "hello"))
        .await
        .unwrap()
        .into_inner();
    assert!(later.duplicate);
    assert_eq!(later.msg_id, first.msg_id);

    let history = pull_all(&mut client, TENANT, 1, conv).await;
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].msg_id, first.msg_id);
    // The same id from another sender is another request.
    let other = client
        .send(text(TENANT, 2, conv, "same-id", "hi"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(other.seq, 2);
    cell.stop().await;
}

/// A caller that gives up (a timeout, an edge's attempt deadline) cancels
/// its request; a retry racing the abandoned one must still find one
/// message, never a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_send_and_its_retry_create_one_message() {
    let cell = TestCell::start().await;
    let mut client = cell.client().await;
    let conv = create_group(&mut client, TENANT, 1, &[2]).await;
    for i in 0..60u64 {
        let id = format!("abandoned-{i}");
        // Give up somewhere between before and after the commit.
        let patience = std::time::Duration::from_micros(200 + (i % 12) * 250);
        let mut c = client.clone();
        let first = tokio::time::timeout(patience, c.send(text(TENANT, 1, conv, &id, "x"))).await;
        let retry = client
            .send(text(TENANT, 1, conv, &id, "x"))
            .await
            .unwrap()
            .into_inner();
        if let Ok(Ok(first)) = first {
            assert_eq!(first.into_inner().seq, retry.seq);
        }
    }
    let history = pull_all(&mut client, TENANT, 1, conv).await;
    let ids: HashSet<_> = history.iter().map(|m| m.msg_id).collect();
    assert_eq!(history.len(), 60, "one message per request id");
    assert_eq!(ids.len(), 60);
    cell.stop().await;
}

#[tokio::test]
async fn concurrent_senders_get_gapless_seq_and_pages_agree() {
    const SENDERS: u64 = 32;
    const EACH: u64 = 25;
    let cell = TestCell::start().await;
    let mut client = cell.client().await;
    let members: Vec<u64> = (2..=SENDERS).collect();
    let conv = create_group(&mut client, TENANT, 1, &members).await;

    let senders = (1..=SENDERS).map(|user| {
        let mut c = client.clone();
        tokio::spawn(async move {
            let mut acks = Vec::new();
            for i in 0..EACH {
                let r = c
                    .send(text(TENANT, user, conv, &format!("u{user}-{i}"), "m"))
                    .await
                    .expect("send")
                    .into_inner();
                acks.push((r.seq, r.msg_id));
            }
            acks
        })
    });
    let mut acks = Vec::new();
    for s in futures::future::join_all(senders).await {
        acks.extend(s.unwrap());
    }
    let total = SENDERS * EACH;
    let mut seqs: Vec<u64> = acks.iter().map(|a| a.0).collect();
    seqs.sort_unstable();
    assert_eq!(
        seqs,
        (1..=total).collect::<Vec<_>>(),
        "seq is 1..N, no gap, no duplicate"
    );

    let forward = pull_pages(&mut client, TENANT, 1, conv, Direction::Forward, 37).await;
    let mut backward = pull_pages(&mut client, TENANT, 1, conv, Direction::Backward, 41).await;
    backward.reverse();
    assert_eq!(forward.len() as u64, total);
    assert_eq!(forward, backward, "forward and backward pages agree");
    let ids: HashSet<u64> = forward.iter().map(|m| m.msg_id).collect();
    for (seq, msg_id) in &acks {
        assert!(ids.contains(msg_id), "acked {msg_id} present");
        assert_eq!(forward[(*seq - 1) as usize].msg_id, *msg_id);
    }
    // msg_id is time-ordered along seq within the conversation.
    assert!(forward.windows(2).all(|w| w[0].msg_id < w[1].msg_id));

    // Concurrent senders shared fsyncs.
    let stats = cell.cell.service.store().stats();
    let batches = stats.batches.load(Ordering::Relaxed);
    let mutations = stats.mutations.load(Ordering::Relaxed);
    assert!(
        batches < mutations,
        "group commit: {mutations} mutations in {batches} batches"
    );
    cell.stop().await;
}

#[tokio::test]
async fn rate_limits_answer_rate_limited_with_retry_after() {
    let cell = TestCell::start_with(
        |c| {
            c.rate_limit.user_per_sec = 2;
            c.rate_limit.user_burst = 2;
        },
        Arc::new(SystemClock),
    )
    .await;
    let mut client = cell.client().await;
    let conv = create_group(&mut client, TENANT, 1, &[2]).await;
    for i in 0..2 {
        client
            .send(text(TENANT, 1, conv, &format!("r{i}"), "x"))
            .await
            .unwrap();
    }
    let status = client
        .send(text(TENANT, 1, conv, "r2", "x"))
        .await
        .unwrap_err();
    assert_eq!(error_code(&status), ErrorCode::RateLimited);
    let detail = error_detail(&status);
    assert_eq!(detail.reason, Reason::UserRateLimited.as_str());
    assert!(detail.retry_after_ms > 0 && detail.retry_after_ms <= 1000);
    // A re-send of an acknowledged message gets its answer, limited or not.
    let again = client
        .send(text(TENANT, 1, conv, "r0", "x"))
        .await
        .expect("the stored answer, not RATE_LIMITED")
        .into_inner();
    assert_eq!(again.seq, 1);
    // Another user is not limited.
    client.send(text(TENANT, 2, conv, "r0", "x")).await.unwrap();
    cell.stop().await;
}

/// Every call that changes something has a per-user budget, not only
/// sends: creating, members, read marks, typing and heartbeats of one user
/// share it; another user keeps theirs.
#[tokio::test]
async fn other_mutating_calls_are_rate_limited_per_user() {
    use cellmesh_proto::v1::{
        ChangeMembersRequest, HeartbeatRequest, MarkReadRequest, TypingRequest,
    };
    use cellmesh_tests::sync::{connect_sync, device};
    let cell = TestCell::start_with(
        |c| {
            c.rate_limit.user_calls_per_sec = 1;
            c.rate_limit.user_calls_burst = 3;
        },
        Arc::new(SystemClock),
    )
    .await;
    let mut client = cell.client().await;
    let mut sync = connect_sync(&cell.endpoint).await;
    // Three calls of user 1: a creation, a read mark, a typing notice.
    let conv = create_group(&mut client, TENANT, 1, &[2]).await;
    client
        .mark_read(MarkReadRequest {
            caller: caller(TENANT, 1),
            conversation_id: conv,
            read_seq: 0,
        })
        .await
        .unwrap();
    sync.typing(TypingRequest {
        caller: caller(TENANT, 1),
        conversation_id: conv,
    })
    .await
    .unwrap();
    let limited = |status: tonic::Status| {
        (
            error_code(&status),
            error_detail(&status).reason,
            error_detail(&status).retry_after_ms > 0,
        )
    };
    let expected = (
        ErrorCode::RateLimited,
        Reason::UserRateLimited.as_str().to_string(),
        true,
    );
    let heartbeat = sync
        .heartbeat(HeartbeatRequest {
            caller: device(TENANT, 1, "phone"),
        })
        .await
        .unwrap_err();
    assert_eq!(limited(heartbeat), expected, "heartbeat");
    let members = client
        .add_members(ChangeMembersRequest {
            caller: caller(TENANT, 1),
            conversation_id: conv,
            user_ids: vec![3],
        })
        .await
        .unwrap_err();
    assert_eq!(limited(members), expected, "add members");
    let typing = sync
        .typing(TypingRequest {
            caller: caller(TENANT, 1),
            conversation_id: conv,
        })
        .await
        .unwrap_err();
    assert_eq!(limited(typing), expected, "typing");
    // Sends have their own budget; another user has theirs.
    client.send(text(TENANT, 1, conv, "s1", "x")).await.unwrap();
    sync.typing(TypingRequest {
        caller: caller(TENANT, 2),
        conversation_id: conv,
    })
    .await
    .unwrap();
    cell.stop().await;
}
