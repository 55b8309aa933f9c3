//! Bursts of membership changes on one group are merged: calls that queue
//! while one is written share a commit and one `MembersChanged` event,
//! whoever made them. Each call still gets its own answer (who it changed)
//! and its own refusal, and every joiner or leaver syncs exactly one event.

use std::collections::BTreeSet;
use std::time::Duration;

use cellmesh_cell::metrics::metrics;
use cellmesh_client::connect::caller;
use cellmesh_proto::reason::Reason;
use cellmesh_proto::status::error_detail;
use cellmesh_proto::v1::{
    ChangeMembersRequest, ChangeMembersResponse, GetConversationRequest, SyncEventKind,
};
use cellmesh_tests::sync::{connect_sync, events, next_push, subscribe};
use cellmesh_tests::{Client, TestCell, create_group};
use tokio::task::JoinSet;

const T: u64 = 11;
/// Joiners: users FIRST..FIRST + JOINERS.
const FIRST: u64 = 1_000;
const JOINERS: u64 = 300;

fn change(who: u64, conv: u64, users: Vec<u64>) -> ChangeMembersRequest {
    ChangeMembersRequest {
        caller: caller(T, who),
        conversation_id: conv,
        user_ids: users,
    }
}

/// Every call at once, each on its own task: their answers, in order.
async fn burst(
    c: &Client,
    calls: Vec<(bool, ChangeMembersRequest)>,
) -> Vec<Result<ChangeMembersResponse, tonic::Status>> {
    let mut tasks = JoinSet::new();
    for (i, (add, req)) in calls.into_iter().enumerate() {
        let mut c = c.clone();
        tasks.spawn(async move {
            let answer = if add {
                c.add_members(req).await
            } else {
                c.remove_members(req).await
            };
            (i, answer.map(|a| a.into_inner()))
        });
    }
    let mut answers: Vec<_> = tasks.join_all().await;
    answers.sort_by_key(|(i, _)| *i);
    answers.into_iter().map(|(_, a)| a).collect()
}

/// Who the successful answers changed, checking that no user was changed
/// by two calls.
fn changed_once(answers: &[Result<ChangeMembersResponse, tonic::Status>]) -> BTreeSet<u64> {
    let mut all = BTreeSet::new();
    for a in answers.iter().flatten() {
        for user in &a.changed {
            assert!(all.insert(*user), "user {user} changed by two calls");
        }
    }
    all
}

async fn member_count(c: &mut Client, conv: u64) -> u32 {
    let req = GetConversationRequest {
        caller: caller(T, 1),
        conversation_id: conv,
        members_after: 0,
        member_limit: 0,
    };
    let got = c.get_conversation(req).await.unwrap().into_inner();
    got.conversation.unwrap().member_count
}

#[tokio::test]
async fn bursts_of_joins_and_leaves_are_merged_and_each_answered() {
    let cell = TestCell::start().await;
    let mut c = cell.client().await;
    let conv = create_group(&mut c, T, 1, &[2]).await;
    let watched = [FIRST, FIRST + JOINERS / 2, FIRST + JOINERS - 1];
    let mut s = connect_sync(&cell.endpoint).await;
    let mut streams = Vec::new();
    for user in watched {
        streams.push(subscribe(&mut s, T, user, "phone", 0).await);
    }

    // Each joiner added by the creator, and again by member 2 (one of the
    // two changes it); a non-member's call and a call adding too many are
    // refused on their own.
    let mut calls = Vec::new();
    for user in FIRST..FIRST + JOINERS {
        calls.push((true, change(1, conv, vec![user])));
        calls.push((true, change(2, conv, vec![user])));
    }
    calls.push((true, change(99, conv, vec![5])));
    let before = (
        metrics().member_change_calls.get(),
        metrics().member_change_events.get(),
    );
    let answers = burst(&c, calls).await;
    let refused = answers.last().unwrap().as_ref().unwrap_err();
    assert_eq!(error_detail(refused).reason, Reason::NotAMember.as_str());
    let joined = changed_once(&answers[..answers.len() - 1]);
    assert_eq!(joined, (FIRST..FIRST + JOINERS).collect());
    let calls = metrics().member_change_calls.get() - before.0;
    let events = metrics().member_change_events.get() - before.1;
    assert_eq!(calls, 2 * JOINERS, "every call but the refused one applied");
    assert!(
        events <= calls / 4,
        "{calls} calls written as {events} events: not merged"
    );
    assert_eq!(member_count(&mut c, conv).await, 2 + JOINERS as u32);

    // Each watched joiner syncs one JOINED.
    for stream in &mut streams {
        assert_eq!(one_event(stream, conv).await, SyncEventKind::Joined as i32);
    }

    // Half the joiners leave, each on its own call, and the other half's
    // calls to leave are made by an admin who is not one: refused.
    let mut calls = Vec::new();
    for user in FIRST..FIRST + JOINERS / 2 {
        calls.push((false, change(user, conv, vec![user])));
        calls.push((false, change(2, conv, vec![user + JOINERS / 2])));
    }
    let answers = burst(&c, calls).await;
    for (i, a) in answers.iter().enumerate() {
        if i % 2 == 1 {
            let e = a.as_ref().unwrap_err();
            assert_eq!(
                error_detail(e).reason,
                Reason::NotConversationAdmin.as_str()
            );
        }
    }
    let left = changed_once(&answers);
    assert_eq!(left, (FIRST..FIRST + JOINERS / 2).collect());
    assert_eq!(member_count(&mut c, conv).await, 2 + JOINERS as u32 / 2);

    // A watched leaver syncs one LEFT; the others nothing more.
    for (user, stream) in watched.iter().zip(&mut streams) {
        if *user < FIRST + JOINERS / 2 {
            assert_eq!(one_event(stream, conv).await, SyncEventKind::Left as i32);
        }
        assert!(
            next_push(stream, Duration::from_millis(300))
                .await
                .is_none(),
            "user {user}: more events than its own"
        );
    }
}

/// Many members adding people at once, each waiting for its answer
/// before its next call (so no caller ever has two calls in one commit):
/// the commits' events are far fewer than the calls, and each added user
/// syncs one JOINED.
#[tokio::test]
async fn a_burst_from_many_members_is_merged_into_few_events() {
    const CALLERS: u64 = 30;
    const EACH: u64 = 10;
    let cell = TestCell::start().await;
    let mut c = cell.client().await;
    let callers: Vec<u64> = (2..2 + CALLERS).collect();
    let conv = create_group(&mut c, T, 1, &callers).await;
    let last = FIRST + CALLERS * EACH - 1;
    let mut s = connect_sync(&cell.endpoint).await;
    let mut watched = subscribe(&mut s, T, last, "phone", 0).await;
    let before = metrics().member_change_events.get();
    let mut tasks = JoinSet::new();
    for (i, caller) in callers.into_iter().enumerate() {
        let mut c = c.clone();
        tasks.spawn(async move {
            for k in 0..EACH {
                let user = FIRST + i as u64 * EACH + k;
                let got = c.add_members(change(caller, conv, vec![user])).await;
                assert_eq!(got.unwrap().into_inner().changed, vec![user]);
            }
        });
    }
    tasks.join_all().await;
    let events = metrics().member_change_events.get() - before;
    let calls = CALLERS * EACH;
    assert!(
        events <= calls / 4,
        "{calls} calls from {CALLERS} members written as {events} events: not merged"
    );
    assert_eq!(
        member_count(&mut c, conv).await,
        1 + (CALLERS + CALLERS * EACH) as u32
    );
    assert_eq!(
        one_event(&mut watched, conv).await,
        SyncEventKind::Joined as i32
    );
    assert!(
        next_push(&mut watched, Duration::from_millis(300))
            .await
            .is_none(),
        "one event for one join"
    );
    cell.stop().await;
}

/// The kind of the next sync event, which is about `conv`.
async fn one_event(stream: &mut tonic::Streaming<cellmesh_proto::v1::SyncPush>, conv: u64) -> i32 {
    let got = events(stream, 1, Duration::from_secs(10)).await;
    let event = got.last().unwrap();
    assert_eq!(event.conversation_id, conv);
    event.kind
}

/// The fan-out answers a group's members from memory once it has read
/// them; every change of the members is seen by the next message: one
/// removed gets no more messages (and may not send), one added gets the
/// next.
#[tokio::test]
async fn the_message_after_a_membership_change_goes_to_the_members_after_it() {
    let cell = TestCell::start().await;
    let mut c = cell.client().await;
    let mut s = connect_sync(&cell.endpoint).await;
    let conv = create_group(&mut c, T, 1, &[2, 3]).await;
    let mut two = subscribe(&mut s, T, 2, "phone", 0).await;
    let mut three = subscribe(&mut s, T, 3, "phone", 0).await;
    let mut four = subscribe(&mut s, T, 4, "phone", 0).await;
    for stream in [&mut two, &mut three] {
        assert_eq!(one_event(stream, conv).await, SyncEventKind::Joined as i32);
    }
    let send = |user: u64, tag: &str| cellmesh_tests::text(T, user, conv, tag, tag);
    c.send(send(1, "before")).await.unwrap();
    // Fanned out to both: the processor has read the members.
    for stream in [&mut two, &mut three] {
        assert_eq!(one_event(stream, conv).await, SyncEventKind::Message as i32);
    }
    c.remove_members(change(1, conv, vec![3])).await.unwrap();
    c.add_members(change(1, conv, vec![4])).await.unwrap();
    assert_eq!(
        one_event(&mut three, conv).await,
        SyncEventKind::Left as i32
    );
    assert_eq!(
        one_event(&mut four, conv).await,
        SyncEventKind::Joined as i32
    );
    c.send(send(2, "after")).await.unwrap();
    for stream in [&mut two, &mut four] {
        assert_eq!(one_event(stream, conv).await, SyncEventKind::Message as i32);
    }
    assert!(
        next_push(&mut three, Duration::from_millis(500))
            .await
            .is_none(),
        "the removed member gets nothing more"
    );
    let refused = c.send(send(3, "outside")).await.unwrap_err();
    assert_eq!(error_detail(&refused).reason, Reason::NotAMember.as_str());
    c.send(send(4, "joined")).await.unwrap();
    cell.stop().await;
}
