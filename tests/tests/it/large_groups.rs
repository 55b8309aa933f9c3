//! Groups above `fanout.large_group_threshold` are fanned out by a
//! `latest_seq` hint to their members online, found from who is online:
//! members joining, leaving and muting during sends get hints exactly while
//! they are members, and their unread counts follow. Their newest pages
//! are read from memory, and show every change as soon as it is made.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use cellmesh_cell::clock::SystemClock;
use cellmesh_client::connect::caller;
use cellmesh_proto::v1::{
    ChangeMembersRequest, DeleteForMeRequest, Direction, EditRequest, ListConversationsRequest,
    RecallRequest, SetMutedRequest, SyncPush, sync_push,
};
use cellmesh_tests::sync::{Sync, connect_sync, next_push, subscribe};
use cellmesh_tests::{Client, TestCell, create_group, pull_pages, text};
use tonic::Streaming;

const T: u64 = 8;

/// The `latest_seq` of every hint about `conv` on `stream` until it has
/// been quiet for half a second.
async fn hints(stream: &mut Streaming<SyncPush>, conv: u64) -> BTreeSet<u64> {
    let mut seqs = BTreeSet::new();
    while let Some(push) = next_push(stream, Duration::from_millis(500)).await {
        if let Some(sync_push::Push::Hint(h)) = push.push
            && h.conversation_id == conv
        {
            seqs.insert(h.latest_seq);
        }
    }
    seqs
}

async fn send(c: &mut Client, conv: u64, tag: &str) -> u64 {
    let sent = c.send(text(T, 1, conv, tag, tag)).await.unwrap();
    sent.into_inner().seq
}

/// (unread, muted) of `conv` in `user`'s list, if it is listed.
async fn listed(s: &mut Sync, user: u64, conv: u64) -> Option<(u64, bool)> {
    let list = ListConversationsRequest {
        caller: caller(T, user),
        limit: 0,
        ids_only: false,
    };
    let l = s.list_conversations(list).await.unwrap().into_inner();
    l.conversations
        .iter()
        .find(|c| {
            c.conversation
                .as_ref()
                .is_some_and(|c| c.conversation_id == conv)
        })
        .map(|c| (c.unread, c.muted))
}

#[tokio::test]
async fn hints_and_unread_follow_joins_leaves_and_mutes_during_sends() {
    // Every hint as it comes: which seqs each member is hinted shows
    // exactly when it was a member.
    let cell = TestCell::start_with(
        |c| {
            c.fanout.large_group_threshold = 5;
            c.fanout.hint_interval_ms = 0;
        },
        Arc::new(SystemClock),
    )
    .await;
    let mut c = cell.client().await;
    // Users 1..=8: above the threshold.
    let conv = create_group(&mut c, T, 1, &[2, 3, 4, 5, 6, 7, 8]).await;
    let mut s = connect_sync(&cell.endpoint).await;
    // Online: 2 stays, 3 leaves, 4 mutes, 9 joins, 20 is never a member.
    let mut streams = BTreeMap::new();
    for user in [2, 3, 4, 9, 20] {
        streams.insert(user, subscribe(&mut s, T, user, "phone", 0).await);
    }
    for stream in streams.values_mut() {
        hints(stream, conv).await;
    }

    let first: BTreeSet<u64> =
        [send(&mut c, conv, "a").await, send(&mut c, conv, "b").await].into();
    let mut got = BTreeMap::new();
    for (user, stream) in streams.iter_mut() {
        got.insert(*user, hints(stream, conv).await);
    }
    for user in [2, 3, 4] {
        assert_eq!(got[&user], first, "member {user}");
    }
    assert!(got[&9].is_empty() && got[&20].is_empty(), "{got:?}");

    // During sends: 3 leaves, 9 joins, 4 mutes.
    let sending = {
        let mut c = c.clone();
        tokio::spawn(async move {
            let mut seqs = Vec::new();
            for i in 0..20 {
                seqs.push(send(&mut c, conv, &format!("during-{i}")).await);
            }
            seqs
        })
    };
    let change = |user, who| ChangeMembersRequest {
        caller: caller(T, who),
        conversation_id: conv,
        user_ids: vec![user],
    };
    c.remove_members(change(3, 3)).await.unwrap();
    c.add_members(change(9, 1)).await.unwrap();
    s.set_muted(SetMutedRequest {
        caller: caller(T, 4),
        conversation_id: conv,
        muted: true,
    })
    .await
    .unwrap();
    let during = sending.await.unwrap();
    // After the changes: every member online gets every hint.
    let after: BTreeSet<u64> =
        [send(&mut c, conv, "c").await, send(&mut c, conv, "d").await].into();
    let mut got = BTreeMap::new();
    for (user, stream) in streams.iter_mut() {
        got.insert(*user, hints(stream, conv).await);
    }
    let all_during: BTreeSet<u64> = during.iter().copied().collect();
    assert_eq!(got[&2], &all_during | &after, "a member throughout");
    assert_eq!(
        got[&4],
        &all_during | &after,
        "muting mutes notifications, not sync"
    );
    assert!(got[&9].is_superset(&after), "the new member: {:?}", got[&9]);
    assert!(
        got[&3].is_disjoint(&after),
        "the member who left: {:?}",
        got[&3]
    );
    assert!(got[&20].is_empty(), "never a member: {:?}", got[&20]);

    // Unread: 2 and 4 have read nothing (4 is listed muted); 3 no longer
    // lists the group; 9 counts from its join on.
    let latest = *after.iter().max().unwrap();
    assert_eq!(listed(&mut s, 2, conv).await, Some((latest, false)));
    assert_eq!(listed(&mut s, 4, conv).await, Some((latest, true)));
    assert_eq!(listed(&mut s, 3, conv).await, None, "left");
    let (unread, _) = listed(&mut s, 9, conv).await.expect("9 lists the group");
    assert!(
        unread >= after.len() as u64 && unread < latest,
        "the joiner's unread {unread} counts from its join (latest seq {latest})"
    );
}

#[tokio::test]
async fn a_hot_groups_hints_are_merged_to_the_newest_per_interval() {
    let cell = TestCell::start_with(
        |c| {
            c.fanout.large_group_threshold = 5;
            c.fanout.hint_interval_ms = 200;
        },
        Arc::new(SystemClock),
    )
    .await;
    let mut c = cell.client().await;
    let conv = create_group(&mut c, T, 1, &[2, 3, 4, 5, 6, 7, 8]).await;
    let mut s = connect_sync(&cell.endpoint).await;
    let mut stream = subscribe(&mut s, T, 2, "phone", 0).await;
    hints(&mut stream, conv).await;
    let mut sent = Vec::new();
    for i in 0..30 {
        sent.push(send(&mut c, conv, &format!("hot-{i}")).await);
    }
    let got = hints(&mut stream, conv).await;
    let newest = *sent.iter().max().unwrap();
    assert_eq!(got.last(), Some(&newest), "the newest is hinted: {got:?}");
    assert!(
        got.len() < sent.len() / 2,
        "{} sends hinted {} times: not merged",
        sent.len(),
        got.len()
    );
    assert!(got.iter().all(|seq| sent.contains(seq)), "{got:?}");
}

/// What `user` sees of `conv` paging in `direction` by `limit`: seq,
/// body, state and edit version.
async fn seen(
    c: &mut Client,
    user: u64,
    conv: u64,
    direction: Direction,
    limit: u32,
) -> Vec<(u64, Vec<u8>, i32, u32)> {
    let pages = pull_pages(c, T, user, conv, direction, limit).await;
    (pages.into_iter())
        .map(|m| (m.seq, m.body, m.state, m.edit_version))
        .collect()
}

#[tokio::test]
async fn a_large_groups_pages_come_from_memory_and_show_every_change_at_once() {
    let cell = TestCell::start_with(
        |c| c.fanout.large_group_threshold = 4,
        Arc::new(SystemClock),
    )
    .await;
    let mut c = cell.client().await;
    // The same history in a group at the threshold and in one below it,
    // whose pages are read from storage.
    let large = create_group(&mut c, T, 1, &[2, 3, 4]).await;
    let small = create_group(&mut c, T, 1, &[2]).await;
    let pages = || cellmesh_cell::metrics::metrics().screen_pages.get();
    let before = pages();
    for step in 0..12 {
        for conv in [large, small] {
            let edit = |seq: u64| EditRequest {
                caller: caller(T, 1),
                conversation_id: conv,
                seq,
                body: format!("edited {step}").into_bytes(),
            };
            match step {
                6 => drop(c.recall(recall(conv, 2)).await.unwrap()),
                7 => drop(c.edit(edit(5)).await.unwrap()),
                8 => drop(c.delete_for_me(hide(conv, &[4, 6])).await.unwrap()),
                10 => drop(c.edit(edit(7)).await.unwrap()),
                _ => {
                    let (id, body) = (format!("m{step}-{conv}"), format!("m{step}"));
                    c.send(text(T, 1, conv, &id, &body)).await.unwrap();
                }
            }
        }
        // Right after each change, every page of the large group shows it.
        for user in [1, 2] {
            for (direction, limit) in [
                (Direction::Backward, 3),
                (Direction::Backward, 50),
                (Direction::Forward, 4),
            ] {
                assert_eq!(
                    seen(&mut c, user, large, direction, limit).await,
                    seen(&mut c, user, small, direction, limit).await,
                    "step {step}, user {user}, {direction:?} by {limit}"
                );
            }
        }
    }
    // Every page of the large group but none of the small one's.
    let large_pages = pages() - before;
    assert!(large_pages >= 12 * 2 * 3, "{large_pages} pages from memory");
    cell.stop().await;
}

fn recall(conv: u64, seq: u64) -> RecallRequest {
    RecallRequest {
        caller: caller(T, 1),
        conversation_id: conv,
        seq,
    }
}

fn hide(conv: u64, seqs: &[u64]) -> DeleteForMeRequest {
    DeleteForMeRequest {
        caller: caller(T, 2),
        conversation_id: conv,
        seqs: seqs.to_vec(),
    }
}
