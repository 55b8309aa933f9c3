//! Read receipts as counts: `ReadCount` counts the current members whose
//! read position is at or above each seq asked — following reads, joins
//! (a joiner has read what came before) and leaves (a former member's read
//! state no longer counts) — and refuses bad lists, non-members and other
//! tenants with stable reasons. A large group's counts, kept in memory
//! once asked, follow every change at once.

use std::sync::Arc;

use cellmesh_cell::clock::SystemClock;
use cellmesh_client::connect::caller;
use cellmesh_proto::reason::Reason;
use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1::{ChangeMembersRequest, MarkReadRequest, ReadCountRequest};
use cellmesh_tests::{Client, TestCell, create_group, text};

const T: u64 = 11;

async fn read_count(c: &mut Client, user: u64, conv: u64, seqs: &[u64]) -> (Vec<u32>, u32) {
    let r = c
        .read_count(ReadCountRequest {
            caller: caller(T, user),
            conversation_id: conv,
            seqs: seqs.to_vec(),
        })
        .await
        .unwrap()
        .into_inner();
    (r.read, r.member_count)
}

async fn mark_read(c: &mut Client, user: u64, conv: u64, seq: u64) {
    c.mark_read(MarkReadRequest {
        caller: caller(T, user),
        conversation_id: conv,
        read_seq: seq,
    })
    .await
    .unwrap();
}

async fn change(c: &mut Client, conv: u64, users: &[u64], add: bool) {
    let request = ChangeMembersRequest {
        caller: caller(T, 1),
        conversation_id: conv,
        user_ids: users.to_vec(),
    };
    if add {
        c.add_members(request).await.unwrap();
    } else {
        c.remove_members(request).await.unwrap();
    }
}

#[tokio::test]
async fn read_counts_follow_reads_joins_and_leaves() {
    let cell = TestCell::start().await;
    let mut c = cell.client().await;
    let conv = create_group(&mut c, T, 1, &[2, 3, 4]).await;
    for i in 1..=5 {
        let tag = format!("m{i}");
        c.send(text(T, 1, conv, &tag, &tag)).await.unwrap();
    }
    // The sender has read all five; nobody else has read anything.
    assert_eq!(read_count(&mut c, 2, conv, &[1, 5]).await, (vec![1, 1], 4));

    mark_read(&mut c, 2, conv, 3).await;
    mark_read(&mut c, 3, conv, 5).await;
    // Reading backwards changes nothing.
    mark_read(&mut c, 3, conv, 1).await;
    assert_eq!(
        read_count(&mut c, 4, conv, &[1, 3, 4, 5, 6]).await,
        (vec![3, 3, 2, 2, 0], 4)
    );

    // 3 leaves: its reads no longer count. 5 joins: it has read what came
    // before its join, and nothing after.
    change(&mut c, conv, &[3], false).await;
    change(&mut c, conv, &[5], true).await;
    c.send(text(T, 1, conv, "m6", "m6")).await.unwrap();
    assert_eq!(
        read_count(&mut c, 5, conv, &[3, 5, 6]).await,
        (vec![3, 2, 1], 4)
    );
    // 3 comes back and, like any joiner, has read everything so far.
    change(&mut c, conv, &[3], true).await;
    assert_eq!(read_count(&mut c, 2, conv, &[5, 6]).await, (vec![3, 2], 5));
}

#[tokio::test]
async fn a_large_groups_kept_counts_follow_every_change_at_once() {
    let cell = TestCell::start_with(
        |c| c.fanout.large_group_threshold = 3,
        Arc::new(SystemClock),
    )
    .await;
    let mut c = cell.client().await;
    let conv = create_group(&mut c, T, 1, &[2, 3, 4]).await;
    c.send(text(T, 1, conv, "m1", "m1")).await.unwrap();
    // The first question walks the group and keeps its tally.
    assert_eq!(read_count(&mut c, 2, conv, &[1]).await, (vec![1], 4));
    mark_read(&mut c, 2, conv, 1).await;
    mark_read(&mut c, 3, conv, 1).await;
    assert_eq!(read_count(&mut c, 4, conv, &[1]).await, (vec![3], 4));
    // A leaver stops counting, a joiner has read what came before it,
    // a sender what it sent.
    change(&mut c, conv, &[3], false).await;
    change(&mut c, conv, &[5], true).await;
    assert_eq!(read_count(&mut c, 4, conv, &[1]).await, (vec![3], 4));
    c.send(text(T, 5, conv, "m2", "m2")).await.unwrap();
    assert_eq!(
        read_count(&mut c, 4, conv, &[1, 2, 3]).await,
        (vec![3, 1, 0], 4)
    );
    mark_read(&mut c, 4, conv, 2).await;
    assert_eq!(read_count(&mut c, 1, conv, &[1, 2]).await, (vec![4, 2], 4));
}

#[tokio::test]
async fn bad_read_count_requests_get_stable_reasons() {
    let cell = TestCell::start().await;
    let mut c = cell.client().await;
    let conv = create_group(&mut c, T, 1, &[2]).await;
    let cases = [
        ("no seqs", caller(T, 1), Vec::new(), Reason::BadSeqList),
        ("too many", caller(T, 1), vec![1; 101], Reason::BadSeqList),
        ("not a member", caller(T, 9), vec![1], Reason::NotAMember),
        (
            "another tenant",
            caller(T + 1, 1),
            vec![1],
            Reason::ConversationNotFound,
        ),
        ("no caller", None, vec![1], Reason::NoCaller),
    ];
    for (name, who, seqs, reason) in cases {
        let err = c
            .read_count(ReadCountRequest {
                caller: who,
                conversation_id: conv,
                seqs,
            })
            .await
            .expect_err(name);
        assert_eq!(error_detail(&err).reason, reason.as_str(), "{name}: {err}");
    }
}
